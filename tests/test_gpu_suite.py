"""benchmarks/gpu_suite.py: a tiny CPU run end to end, and its peak table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import benchmark_module, gpu_suite_argv
from smoothcert.denoisers import one_shot_timestep

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def suite():
    with benchmark_module("gpu_suite") as module:
        yield module


def test_cpu_run_prints_table_and_writes_json(tmp_path):
    out = tmp_path / "suite.json"
    batches = [50, 100]
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_suite.py"), "--device", "cpu",
         "--models", "lenet", "--n", "190", "--n0", "10", "--images", "1",
         "--batches", *map(str, batches), "--rounds", "1", "--sweep-n", "90",
         "--reference-n", "90", "--settings", "fp32", "channels_last", "--json", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"})  # a shared 2-core VM: no thread contention
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "| model | setting | best batch | reference s/img | engine s/img |" in text
    rows = [line for line in text.splitlines() if line.startswith("| lenet |")]
    assert [r.split(" | ")[1] for r in rows] == ["fp32", "channels_last"]
    assert "scaled linearly to n = 190" in text and "torchvision:" in text
    assert "- **lenet**: best setting" in text

    results = json.loads(out.read_text())
    assert results["workload"] == {"n": 190, "n0": 10, "alpha": 0.001, "sigma": 0.25,
                                   "images": 1, "batches": batches, "rounds": 1,
                                   "sweep_n": 90, "reference_n": 90}
    assert {"device", "torch", "torchvision", "commit"} <= set(results["environment"])
    (model,) = results["models"]
    assert model["model"] == "lenet" and model["num_classes"] == 10
    assert model["flops_per_image"] > 0
    assert model["reference"]["best_batch"] in batches
    assert model["reference"]["seconds_per_image"] > 0
    assert [s["setting"] for s in model["settings"]] == ["fp32", "channels_last"]
    for s in model["settings"]:
        assert s["best_batch"] in batches
        assert [r["batch"] for r in s["sweep"]] == batches
        assert all(v > 0 for v in s["seconds_per_image"].values())
        assert s["engine_over_ceiling"] > 0 and s["speedup_over_reference"] > 0
        assert s["tflops"] > 0 and s["percent_of_peak"] is None  # no peak known for a CPU
        assert s["peak_gpu_mb"] is None and s["peak_host_mb"] > 0 and s["host_growth_mb"] >= 0
        assert s["goals"]["seconds_per_image"] is None  # LeNet has no time goal
        assert set(s["goals"]["engine_over_ceiling"]) == {"target", "met", "factor"}
    assert model["settings"][1]["engine_settings"] == {"channels_last": True}


def test_settings_peaks_and_goals(suite, monkeypatch):
    assert suite.setting_kwargs("fp32") == {}
    assert suite.setting_kwargs("bf16+channels_last+compile") == {
        "precision": "bf16", "channels_last": True, "compile": True}
    with pytest.raises(SystemExit):
        suite.parse_args(["--settings", "fp32", "int8"])

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    for name, bf16, tf32 in [("NVIDIA H100 80GB HBM3", 989, 494), ("NVIDIA H200", 989, 494),
                             ("NVIDIA H100 PCIe", 756, 378), ("NVIDIA A100-SXM4-80GB", 312, 156),
                             ("NVIDIA L4", None, None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, name=name: name)
        assert suite.peak_tflops(cuda, {"precision": "bf16"}, None) == (bf16, "bf16")
        assert suite.peak_tflops(cuda, {"channels_last": True}, None) == (tf32, "tf32")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert suite.peak_tflops(cuda, {}, None)[1] == "fp32"
    assert suite.peak_tflops(cuda, {}, [100.0, 20.0]) == (20.0, "fp32 (given)")
    assert suite.peak_tflops(cuda, {"precision": "bf16"}, [100.0]) == (100.0, "bf16 (given)")

    assert suite.goal(0.5, 1.0, lower=True) == {"target": 1.0, "met": True, "factor": 0.5}
    missed = suite.goal(0.25, 1.0, lower=False)
    assert not missed["met"] and missed["factor"] == 4.0
    assert suite.verdict(missed) == "missed by 4.00×"
    assert suite.verdict(suite.goal(0.8995, 0.9, lower=False)) == "missed by 1.01×"
    assert suite.verdict(suite.goal(0.9, 0.9, lower=False)) == "met (1.00×)"


def test_time_goals_apply_to_their_workload_only(suite):
    full, short = (suite.argparse.Namespace(n0=100, n=n) for n in (100_000, 2000))
    assert suite.time_goal("cifar_resnet110", full) == 0.6  # issue 36's goals
    assert suite.time_goal("resnet50", full) == 3.0
    assert suite.time_goal("resnet50", short) is None and suite.time_goal("lenet", full) is None
    result = {"setting": "bf16", "batches": [1000, 2000], "best_batch": 2000,
              "seconds_per_image": {"reference": 20.0, "engine": 2.0, "ceiling": 1.9},
              "engine_over_ceiling": 0.95, "speedup_over_reference": 10.0, "tflops": 400.0,
              "percent_of_peak": 40.4, "peak_tflops": 989, "peak_kind": "bf16",
              "peak_gpu_mb": 5000.0, "peak_host_mb": 3000.0, "host_growth_mb": 0.0,
              "goals": {"seconds_per_image": suite.goal(2.0, 5.0, lower=True),
                        "engine_over_ceiling": suite.goal(0.95, 0.9, lower=False),
                        "host": suite.goal(0.0, 600.0, lower=True)}}
    row = suite.row("resnet50", result)
    assert "| resnet50 | bf16 | 2000 of 1000/2000 |" in row
    assert "40.4% of 989 bf16" in row and "s/img ≤ 5: met (0.40×)" in row
    line = suite.summary("resnet50", [result], full)
    assert "best setting bf16 at batch 2000" in line
    assert "≤ 3 s/image on an H100: met (0.66×)" in line
    assert "every setting: met" in line


def test_the_summary_gives_the_default_beside_the_best(suite):
    """What a user gets with no flag against the best setting: seconds per image, ratio."""
    def result(setting, seconds):
        return {"setting": setting, "best_batch": 2000,
                "seconds_per_image": {"reference": 16.0, "engine": seconds},
                "goals": {"engine_over_ceiling": {"met": True}}}

    args = suite.argparse.Namespace(n0=100, n=100_000)
    line = suite.summary("resnet50", [result("default", 8.6),
                                      result("bf16+channels_last+compile_cudagraphs", 4.3)], args)
    assert "best setting bf16+channels_last+compile_cudagraphs at batch 2000: 4.300" in line
    assert "default (no flag) 8.600 s/image, 2.00× the best" in line
    assert "default (no flag)" not in suite.summary("resnet50", [result("fp32", 8.6)], args)
    assert suite.setting_name({"channels_last": True, "compile": True,
                               "compile_mode": "reduce-overhead"}) == [
        "channels_last", "compile_cudagraphs"]
    assert suite.setting_name({"precision": "bf16", "compile": True}) == ["bf16", "compile"]


def test_new_settings_the_cli_default_and_compile_modes(suite, monkeypatch):
    """``default`` is what the CLI runs with on the device for a long run of one classifier;
    the compile modes compile the engine's prepared (channels-last) model in their mode, once,
    at the best batch of their eager twin."""
    from smoothcert.cli import dataset_run

    monkeypatch.setattr(dataset_run, "compiler_available", lambda: True)
    assert suite.setting_kwargs("default") == {"channels_last": True, "compile": True,
                                               "compile_mode": "reduce-overhead"}
    assert suite.setting_kwargs("default", "cpu") == {}  # the CPU default is float32 eager
    assert suite.setting_kwargs("bf16+channels_last+compile_autotune") == {
        "precision": "bf16", "channels_last": True, "compile": True,
        "compile_mode": "max-autotune"}
    assert suite.setting_kwargs("compile_cudagraphs")["compile_mode"] == "reduce-overhead"
    with pytest.raises(SystemExit):
        suite.parse_args(["--settings", "compile_turbo"])
    done = [{"engine_settings": {"precision": "bf16", "channels_last": True}, "best_batch": 4000},
            {"engine_settings": {"channels_last": True}, "best_batch": 2000}]
    args = suite.parse_args(["--batches", "1000", "2000", "4000"])
    assert suite.batches_for("bf16+channels_last+compile_cudagraphs", done, args) == [4000]
    assert suite.batches_for("default", done, args) == [2000]
    assert suite.ordered(["default", "fp32", "bf16+channels_last+compile_autotune", "bf16"]) \
        == ["fp32", "bf16", "default", "bf16+channels_last+compile_autotune"]

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(kw) or m)
    votes = suite.votes_for(suite.setting_kwargs("channels_last+compile_cudagraphs"))
    model = torch.nn.Conv2d(3, 4, 3)
    runnable = votes.prepare(model)
    assert votes.prepare(model) is runnable and compiled == [
        {"dynamic": False, "mode": "reduce-overhead"}]  # compiled once
    assert model.weight.is_contiguous(memory_format=torch.channels_last)
    assert votes.compile  # the engine pads batches to the one compiled shape


def test_a_batch_out_of_memory_is_skipped(suite, monkeypatch, tmp_path, capsys):
    ceiling = suite.ct.ceiling

    def small_device(model, xs, args, votes=None):
        if args.batch > 50:
            raise torch.OutOfMemoryError("CUDA out of memory (a test)")
        return ceiling(model, xs, args, votes)

    monkeypatch.setattr(suite.ct, "ceiling", small_device)
    suite.main(["--device", "cpu", "--models", "lenet", "--n", "90", "--n0", "10",
                "--batches", "50", "100", "--rounds", "1", "--sweep-n", "40",
                "--reference-n", "40", "--settings", "fp32", "--json",
                str(tmp_path / "s.json")])
    out = capsys.readouterr()
    assert "batch 100: out of memory, skipped" in out.err
    (line,) = [r for r in out.out.splitlines() if r.startswith("| lenet |")]
    assert "| 50 of 50/100 (out of memory: 100) |" in line
    (setting,) = json.loads((tmp_path / "s.json").read_text())["models"][0]["settings"]
    assert setting["best_batch"] == 50
    assert setting["sweep"][1] == {"batch": 100, "out_of_memory": True}


def test_a_failing_compile_mode_is_recorded_and_the_suite_goes_on(suite, monkeypatch, tmp_path,
                                                                  capsys):
    def no_backend(model, **kwargs):
        raise RuntimeError("no CUDA graphs here\nsecond line")

    monkeypatch.setattr(torch, "compile", no_backend)
    suite.main(["--device", "cpu", "--models", "lenet", "--n", "90", "--n0", "10",
                "--batches", "50", "--rounds", "1", "--sweep-n", "40", "--reference-n", "40",
                "--settings", "fp32", "compile_cudagraphs", "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr()
    assert "lenet compile_cudagraphs: failed: RuntimeError: no CUDA graphs here\n" in out.err
    (model,) = json.loads((tmp_path / "s.json").read_text())["models"]
    assert [s["setting"] for s in model["settings"]] == ["fp32"]
    assert model["failed"] == [{"setting": "compile_cudagraphs",
                                "error": "RuntimeError: no CUDA graphs here"}]


@pytest.mark.parametrize("part", ["main", "forward"])
def test_the_shell_script_runs_valid_settings(suite, part, tmp_path):
    """gpu_suite.sh, with a stand-in for Python that records its arguments: each part passes
    arguments the suite accepts; the main part measures the CLI's default, the forward part
    CUDA graphs and max-autotune at larger batches."""
    name = "gpu_suite" if part == "main" else "gpu_suite_forward"
    argv = gpu_suite_argv(part, f"{name}.md", tmp_path)
    assert argv[0] == "benchmarks/gpu_suite.py"
    args = suite.parse_args(argv[1:])
    assert args.device == "cuda" and args.json == str(tmp_path / f"{name}.json")
    assert (args.n0, args.n) == suite.GOAL_WORKLOAD
    if part == "main":
        assert "default" in args.settings and "fp32" in args.settings
        assert "bf16+channels_last+compile_cudagraphs" in args.settings  # the best measured
        assert "ddpm_cifar10+cifar_resnet110" in args.models
    else:
        assert {"bf16+channels_last+compile_cudagraphs", "bf16+channels_last+compile_autotune",
                "bf16+channels_last"} <= set(args.settings)
        assert max(args.batches) >= 8000 and args.models == ["cifar_resnet110", "resnet50"]
    stub = str(tmp_path / "python")  # the stand-in gpu_suite_argv wrote
    bad = subprocess.run(["bash", str(BENCHMARKS / "gpu_suite.sh")], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHON": stub,
                                                     "OUT": str(tmp_path), "PART": "nope"})
    assert bad.returncode == 2 and "PART must be main or forward" in bad.stderr


@pytest.fixture(scope="module")
def denoised(suite):
    import denoised
    return denoised


def test_denoised_rows_on_cpu(suite, tmp_path, capsys):
    """The denoised rows end to end, in process: a toy UNet (--tiny-unet) before ResNet-20."""
    out = tmp_path / "suite.json"
    suite.main(["--device", "cpu", "--models", "ddpm_cifar10+cifar_resnet20", "--tiny-unet",
                "--n", "100", "--n0", "10", "--rounds", "1", "--denoised-batches", "25",
                "--denoised-sweep-n", "20", "--denoised-reference-n", "20",
                "--sequential-images", "1", "--sequential-tests", "targeted",
                "--denoised-settings", "fp32", "--json", str(out)])
    text = capsys.readouterr().out
    assert "| model | setting |" not in text  # no classifier rows, no classifier table
    assert "| pair | setting | certifier | batch | draws / image | noisy images/s |" in text
    rows = [line.split(" | ")[2] for line in text.splitlines()
            if line.startswith("| ddpm_cifar10+cifar_resnet20 |")]
    assert rows == ["certify", "sequential (targeted, grid 0,0.25,0.5)"]
    assert "- **ddpm_cifar10+cifar_resnet20**: best fp32 at batch 25" in text
    assert "diffusers:" in text and "Denoised rows (tiny UNet" in text

    results = json.loads(out.read_text())
    assert results["workload"]["denoised"] == {
        "settings": ["fp32"], "batches": [25], "sweep_n": 20, "images": 1, "reference_n": 20,
        "sequential_images": 1, "sequential_tests": ["targeted"], "unet": "tiny"}
    (model,) = results["models"]
    assert model["unet"] == "tiny" and model["num_classes"] == 10
    assert 0 <= model["timestep"] < 1000 and model["flops_per_image"] > 0
    (setting,) = model["settings"]
    engine_s = setting["seconds_per_image"]["engine"]
    assert setting["noisy_per_second"] == pytest.approx(110 / engine_s)
    assert setting["goals"]["noisy_per_second"] is None  # no goal for the toy UNet
    assert [q["test"] for q in setting["sequential"]] == ["targeted"]
    for q in setting["sequential"]:
        assert q["grid"] == "0,0.25,0.5" and q["images"] == 1 and q["batch"] == 25
        assert 10 < q["draws_per_image"] <= 110  # n0 + at least one look, at most n_max
        assert q["noisy_per_second"] == pytest.approx(q["draws_per_image"]
                                                      / q["seconds_per_image"])
        assert sum(q["radii"].values()) == 1 and sum(q["stopped"].values()) == 1
        assert q["goal"] is None and q["goal_at_study_draws"] is None
        assert q["seconds_at_study_draws"] == pytest.approx(
            suite.dn.STUDY_DRAWS[q["test"]] / q["noisy_per_second"])


def test_denoised_goals_and_rows(denoised, suite):
    assert denoised.two_sigma_grid(0.25).tolist() == [0.0, 0.25, 0.5]
    assert denoised.two_sigma_grid(0.5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    goal = suite.goal
    sequential = {"test": "targeted", "grid": "0,0.25,0.5", "batch": 1000,
                  "draws_per_image": 423.0, "noisy_per_second": 2500.0,
                  "seconds_per_image": 0.1692, "tflops": 25.0,
                  "seconds_at_study_draws": 913 / 2500,
                  "goal": goal(0.1692, 1.0, lower=True),
                  "goal_at_study_draws": goal(913 / 2500, 1.0, lower=True)}
    result = {"setting": "bf16+channels_last", "best_batch": 1000, "noisy_per_second": 5000.0,
              "seconds_per_image": {"reference": 40.0, "engine": 20.02, "ceiling": 19.0},
              "engine_over_ceiling": 0.95, "tflops": 63.0, "peak_gpu_mb": 9000.0,
              "goals": {"noisy_per_second": goal(5000.0, 4000.0, lower=False),
                        "engine_over_ceiling": goal(0.95, 0.9, lower=False)},
              "sequential": [sequential]}
    fixed, seq = denoised.suite_rows("pair", result)
    assert "| pair | bf16+channels_last | certify | 1000 | 100,100 | 5,000 | 20.0 |" in fixed
    assert "≥ 4,000 img/s: met (0.80×)" in fixed and "≥ 0.9 ceiling: met (0.94×)" in fixed
    assert "| sequential (targeted, grid 0,0.25,0.5) | 1000 | 423 | 2,500 | 0.169 |" in seq
    assert "≤ 1 s/img: met (0.16×)" in seq
    assert "at the study's 913 draws/img: 0.365 s/img, met (0.36×)" in seq
    line = denoised.suite_summary("pair", [result])
    assert "5,000 noisy images/s" in line and "in bf16 on an H100: met (0.80×)" in line
    assert "2σ grid at 423 draws/image: 0.169 s (bf16+channels_last, targeted)" in line
    assert "2σ grid at the study's 913 draws/image: 0.365 s" in line


def test_ddpm_cifar10_config_has_its_parameter_count(denoised):
    """google/ddpm-cifar10-32's UNet (Ho et al.'s CIFAR-10 model) has 35.7M parameters."""
    den = denoised.ddpm_cifar10(0.25)
    assert sum(p.numel() for p in den.unet.parameters()) == 35_746_307
    assert den.timestep == one_shot_timestep(den.scheduler.alphas_cumprod, 0.25)
    tiny = denoised.ddpm_cifar10(0.25, tiny=True)
    assert sum(p.numel() for p in tiny.unet.parameters()) < 100_000


def test_denoised_benchmark_prints_cost_ratios(denoised, capsys):
    denoised.main(["--device", "cpu", "--classifiers", "lenet", "--variants", "none",
                   "dncnn-small", "--seconds", "0.02", "--rounds", "2", "--batch", "8",
                   "--n0", "2"])
    text = capsys.readouterr().out
    assert "diffusers:" in text and "| classifier | denoiser | GFLOP / draw |" in text
    rows = {line.split(" | ")[1]: line.split(" | ") for line in text.splitlines()
            if line.startswith("| lenet |")}
    assert set(rows) == {"none", "dncnn-small"}
    assert rows["none"][5] == "1.0 (1.0 / 1.0)"  # the classifier against itself, per round
    assert float(rows["dncnn-small"][2]) > float(rows["none"][2])  # more FLOPs per draw
    with pytest.raises(SystemExit):
        denoised.parse_args(["--n0", "64", "--batch", "64"])
