"""The step-5 driver's report step (results/step5_study.sh report) on synthetic published runs.

The study itself takes hours, so its report block would otherwise first run at the very end. Here
every run of the study gets small record files with known rows, and the driver must write every
report piece from them: the tables, the plots, the training and certification costs, and the
sequential certifier's draws, with the numbers the rows imply.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smoothcert.runs import task_class
from smoothcert.runs.records import open_records

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "results" / "step5_study.sh"
STEMS = {"certify": "certify", "sequential": "sequential", "data_dependent": "data-dependent",
         "data_dependent_k300": "data-dependent", "data_dependent_k900": "data-dependent",
         "data_dependent_package": "data-dependent", "deterministic": "deterministic",
         "lbound_heuristic": "lbound-heuristic"}
COUNT = 500  # rows per record file, as the driver's `complete` requires


# docs/RESULTS.md of the copy: two generated blocks around prose the driver must not touch.
DOC = """# Results
<!-- report:step5.sigmas -->
old
<!-- /report:step5.sigmas -->
Prose.
<!-- report:step5.train_time -->
<!-- /report:step5.train_time -->
"""


def _runs() -> list[str]:
    text = DRIVER.read_text(encoding="utf-8")
    return re.search(r"^RUNS=\(([^)]*)\)", text, flags=re.MULTILINE).group(1).split()


def _driver(function: str, *args: str) -> str:
    """The output of the driver's shell function ``function`` (its definition, run alone)."""
    text = DRIVER.read_text(encoding="utf-8")
    body = re.search(rf"^{function}\(\) {{.*?^}}$", text, flags=re.MULTILINE | re.DOTALL).group(0)
    done = subprocess.run(["bash", "-c", f"count={COUNT}\n{body}\n{function} \"$@\"", "_", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _stems(name: str) -> list[str]:
    """The driver's own list of run ``name``'s files."""
    return _driver("records_of", name).split()


def _count(stem: str) -> int:
    return int(_driver("count_of", stem))


def _write_grad_norms(path: Path) -> None:
    """Even rows easy (p̂_A = 0.9, ‖∇θL‖ = 1), odd rows hard (p̂_A = 0.1, ‖∇θL‖ = 4)."""
    rows = ["idx\tlabel\tp_hat\tgrad_norm"]
    rows += [f"{20 * i}\t{i % 10}\t{0.1 if i % 2 else 0.9}\t{4.0 if i % 2 else 1.0}"
             for i in range(COUNT)]
    path.write_text("\n".join(rows) + "\n")


def _write_records(path: Path, task: str, sigma: float, draws: int, count: int = COUNT) -> None:
    """``count`` rows: image i is correct with radius σ·(i mod 4)/4, or abstains when i mod 4 = 3;
    ``n`` = draws, n0 = 100, time 0.5 s each; data-dependent rows at σ_x = σ·(1 + (i mod 5)/100)."""
    columns = task_class(task).columns
    writer, _ = open_records(path, columns, {"kind": task,
                                             "identity": {"task": task, "device_type": "cpu"},
                                             "shard": {}})
    dd = task == "data-dependent"
    with writer:
        for i in range(count):
            abstain = i % 4 == 3
            row = dict(idx=20 * i, label=i % 10, predict=-1 if abstain else i % 10,
                       radius=0.0 if abstain else sigma * (i % 4) / 4, correct=int(not abstain),
                       time=0.5, p_lower=0.9, nA=draws, n0=100, n=draws, alpha=0.001,
                       sigma=sigma * (1 + i % 5 / 100) if dd else sigma, seed=0,
                       n_max=10_000, p_upper=1.0, stopped="all",
                       predict_mc=i % 10, radius_mc=0.0, adjusted=0, p_top=0.9,
                       p_runner_up=0.1, runner_up=0, guarantee="heuristic")
            writer.write({c: row[c] for c in columns})


def _publish(out: Path, name: str) -> None:
    sigma = 1e-6 if name == "clean" else {"025": 0.25, "050": 0.5, "100": 1.0}[name[-3:]]
    run = out / name
    run.mkdir(parents=True)
    if "_dd" in name:  # data-dependent training: 64 σ steps per epoch from epoch 4 of 18,
        params = ("dd_steps: 64\ndd_start_epoch: 4\n" if name == "gaussian_dd_s050" else  # old
                  "sigma_mode_params:\n  num_steps: 64\n  step_size: 0.0001\n  start_epoch: 4\n")
        (run / "config.yaml").write_text(  # the first config in the format before Step 7
            f"method: gaussian\nmethod_params:\n  num_steps: 3\nsigma: {sigma}\n"
            f"sigma_mode: data_dependent\n{params}")
        (run / "log.tsv").write_text(
            "epoch\tseconds\tpeak_mem_mb\tsigma_mean\tsigma_min\tsigma_max\n"
            "17\t3.0\t800\t0.51\t0.5\t0.52\n18\t5.0\t810\t0.6\t0.45\t0.75\n")
    else:
        (run / "config.yaml").write_text(
            f"method: gaussian\nmethod_params:\n  num_noise: 1\nsigma: {sigma}\n"
            "sigma_mode: fixed\n")
        (run / "log.tsv").write_text("epoch\tseconds\tpeak_mem_mb\n1\t3.0\t800\n2\t5.0\t810\n")
    (run / "wall_time.tsv").write_text(
        "started\tseconds\tepochs_before\tepochs_after\tdevice\thardware\n"
        "2026-11-22T00:00:00Z\t100.0\t0\t2\tcpu\tx86_64 CPU\n")
    for stem in _stems(name):
        if stem == "grad_norms":
            _write_grad_norms(run / f"{stem}.tsv")
            continue
        draws = 2_400 if stem.startswith("sequential") else 10_000
        _write_records(run / f"{stem}.tsv", STEMS.get(stem, "sequential"), sigma, draws,
                       _count(stem))


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """A copy of the driver and the recipes, every run published, then `report` run."""
    root = tmp_path_factory.mktemp("study")
    (root / "results").mkdir()
    shutil.copy(DRIVER, root / "results" / DRIVER.name)
    shutil.copytree(ROOT / "configs" / "fashion-mnist" / "study",
                    root / "configs" / "fashion-mnist" / "study")
    out = root / "results" / "step5"
    for name in _runs():
        _publish(out, name)
    (root / "docs").mkdir()
    (root / "docs" / "RESULTS.md").write_text(DOC, encoding="utf-8")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MPLBACKEND": "Agg", "PYTHON": sys.executable}  # PYTHON: if no console script
    done = subprocess.run(["bash", str(root / "results" / DRIVER.name), "report"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out, done.stdout


def test_report_writes_every_piece(reported):
    out, stdout = reported
    assert f"done: {_runs()[0]}" in stdout and "results: results/step5" in stdout
    for piece in ("sigmas", "envelope_gaussian", "envelope_consistency", "methods_s050",
                  "easy_focus", "data_dependent", "heat"):
        assert (out / f"{piece}.md").read_text().startswith("| name |"), piece
        assert (out / f"{piece}.png").stat().st_size > 0, piece
    for piece in ("sigmas_pa_ecdf", "methods_s050_pa_ecdf", "easy_focus_pa_ecdf"):
        assert (out / f"{piece}.png").stat().st_size > 0
    for sigma in ("025", "050", "100"):
        assert (out / f"sequential_s{sigma}.md").read_text().startswith("| name |")


def test_tables_hold_the_rows_numbers(reported):
    out, _ = reported
    # every 4th image abstains, the other three are correct: clean accuracy 75 %, abstain 25 %
    row = next(line for line in (out / "sequential_s025.md").read_text().splitlines()
               if line.startswith("| gaussian_s025/certify "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["500", "75.0%", "25.0%"]  # n, clean accuracy, abstain
    for sigma in ("025", "050"):
        text = (out / f"sequential_s{sigma}.md").read_text()
        assert f"gaussian_s{sigma}/sequential_nmax100k" in text, sigma


def test_cost_tables(reported):
    out, _ = reported
    train = (out / "train_time.tsv").read_text().splitlines()
    assert len(train) == 1 + len(_runs())
    first = dict(zip(train[0].split("\t"), train[1].split("\t")))
    assert (first["epochs"], first["epoch_seconds"], first["seconds_per_epoch"],
            first["wall_seconds"], first["resumed"]) == ("2", "8.0", "4.000", "100.0", "no")
    cost = (out / "train_cost.md").read_text()
    assert all(f"| {name} |" in cost for name in _runs())
    lines = (out / "certify_time.tsv").read_text().splitlines()
    certificates = [s for name in _runs() for s in _stems(name) if s != "grad_norms"]
    assert len(lines) == 1 + len(certificates)
    assert lines[1].split("\t") == ["gaussian_s025", "certify", "500", "250.0", "0.500",
                                 "cpu"]


def test_agreement_tables(reported):
    out, _ = reported
    table = (out / "agreement_s025.md").read_text().splitlines()
    assert table[0] == ("| first | second | n | agree | ΔACR | ± SE | r=0 | r=0.25 | r=0.5 "
                        "| r=0.75 |")
    pairs = [line.split(" | ")[:2] for line in table[2:]]
    assert pairs == [["| gaussian_s025/certify", "gaussian_s025/sequential"],
                     ["| gaussian_s025/certify", "gaussian_s025/sequential_nmax100k"],
                     ["| consistency_s025/certify", "consistency_s025/sequential"]]
    # the synthetic sequential rows equal the CERTIFY rows: no image certified by one alone
    assert all(line.endswith("| 500 | 100.0% | +0.000 | 0.000 | 0/0 | 0/0 | 0/0 | 0/0 |")
               for line in table[2:])
    for sigma, grid in (("s050", 7), ("s100", 13)):
        header = (out / f"agreement_{sigma}.md").read_text().splitlines()[0]
        assert header.count("| r=") == grid, sigma


def test_tables_spliced_into_the_document(reported):
    out, stdout = reported
    doc = (out.parents[1] / "docs" / "RESULTS.md").read_text()
    assert "docs/RESULTS.md: 2 tables written" in stdout
    sigmas, train_time = (out / "sigmas.md").read_text(), (out / "train_time.md").read_text()
    assert doc == DOC.replace("old\n", sigmas).replace(
        "<!-- /report:step5.train_time -->", train_time + "<!-- /report:step5.train_time -->")
    rows = train_time.splitlines()
    assert rows[0].startswith("| name | method |") and rows[1].startswith("| --- | --- |")
    assert len(rows) == 2 + len(_runs()) and rows[2].startswith(f"| {_runs()[0]} |")


def test_sequential_draws(reported):
    out, _ = reported
    lines = (out / "sequential_draws.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["name", "file", "certify_forward_per_image",
                                    "sequential_forward_per_image", "fewer", "stopped"]
    sequential = [s for name in _runs() for s in _stems(name) if s.startswith("sequential")]
    assert len(lines) == 1 + len(sequential)  # gaussian_s025, _s050: two sequential files
    assert lines[1].split("\t") == ["gaussian_s025", "sequential", "10100", "2500", "4.04",
                                    "all=500"]


def test_step9_pieces(reported):
    """Sun et al.'s Table 1 and figures for the seven methods, the HeatSmoothing sweep and the
    data-dependent budgets, from the synthetic rows."""
    out, _ = reported
    for piece in ("seven_s050", "heat_faithful", "dd_budgets", "dd_models"):
        assert (out / f"{piece}.md").read_text().startswith("| name |"), piece
        assert (out / f"{piece}.png").stat().st_size > 0, piece
    assert (out / "seven_s050_pa_ecdf.png").stat().st_size > 0
    for hist in ("dd_sigma_hist", "dd_package_sigma_hist"):
        assert (out / f"{hist}.png").stat().st_size > 0, hist
    table = (out / "grad_norms.md").read_text().splitlines()
    assert len(table) == 2 + 7
    for row in table[2:]:  # easy 1.0, hard 4.0: ratio 0.25; ACR (0 + σ/4 + σ/2)/4 at σ = 0.5
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:] == ["500", "250", "1.000", "250", "4.000", "0.250", "0.094"], row
    # --common: every file on the images they all hold (K = 300, 900: 200; the package: 20)
    for piece, count in (("dd_budgets", "200"), ("dd_models", "200"), ("dd_package", "20")):
        rows = (out / f"{piece}.md").read_text().splitlines()[2:]
        assert {[c.strip() for c in row.strip("|").split("|")][1] for row in rows} == {count}
    assert "σ_x min" in (out / "dd_budgets.md").read_text()
    package = (out / "dd_package_agreement.md").read_text().splitlines()[2:]
    assert [row.split("|")[1:4] for row in package] == [
        [" certify ", " data_dependent_package ", " 20 "],
        [" data_dependent_k900 ", " data_dependent_package ", " 20 "]]
    pairs = (out / "dd_models_agreement.md").read_text().splitlines()[2:]  # image by image:
    assert [row.split("|")[1:3] for row in pairs] == [  # Gaussian vs dd-trained; K = 900
        [" gaussian_s050/certify ", " gaussian_dd900_s050/certify "],
        [" gaussian_s050/data_dependent_k900 ", " gaussian_dd900_s050/data_dependent_k900 "],
        [" consistency_s050/certify ", " consistency_s050/data_dependent_k900 "]]
    training = (out / "dd_training.tsv").read_text().splitlines()
    assert training[0].split("\t") == ["name", "dd_steps_per_epoch", "sigma_updates",
                                       "sigma_min", "sigma_mean", "sigma_max"]
    for row in training[1:]:  # either config format; method_params' num_steps is not K
        assert row.split("\t")[1:] == ["64", "896", "0.4500", "0.6000", "0.7500"], row
    assert [row.split("\t")[0] for row in training[1:]] == ["gaussian_dd_s050",
                                                            "gaussian_dd900_s050"]


@pytest.mark.slow
def test_an_unfinished_run_leaves_only_its_pieces_unwritten(reported, tmp_path):
    """With one run not published, `report` writes every piece it can and says which it left;
    the pieces that need the run stay as they were (here: absent)."""
    out, _ = reported
    root = tmp_path / "study"
    shutil.copytree(out.parents[1], root)
    shutil.rmtree(root / "results" / "step5" / "gaussian_dd900_s050")
    for piece in ("dd_models.md", "dd_budgets.md", "seven_s050.md", "train_time.tsv"):
        (root / "results" / "step5" / piece).unlink()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MPLBACKEND": "Agg", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(root / "results" / DRIVER.name), "report"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "runs not finished: gaussian_dd900_s050" in done.stdout
    assert "not rewritten: results/step5/dd_models.md" in done.stdout
    new = root / "results" / "step5"
    assert not (new / "dd_models.md").exists()
    assert (new / "seven_s050.md").is_file() and (new / "dd_budgets.md").is_file()
    assert len((new / "train_time.tsv").read_text().splitlines()) == len(_runs())
