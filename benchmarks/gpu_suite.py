"""GPU suite: seconds per image of CERTIFY (n0 = 100, n = 100,000, α = 0.001) for ResNet-110
(CIFAR, 3×32×32, 10 classes) and ResNet-50 (ImageNet, 3×224×224, 1000 classes).

For each model and engine setting (``fp32``, an acceleration, or several joined by ``+``:
``bf16+channels_last+compile``), on whatever device is present. ``default`` is what
``smoothcert certify`` runs with on this device when no flag is given, for a long run of one
classifier (``cli.dataset_run.device_defaults``: on CUDA channels-last and compile in mode
``reduce-overhead``, CUDA graphs, float32; its batch, measured by the CLI before the first row,
is here the sweep's best); ``compile_cudagraphs`` and ``compile_autotune`` are ``compile`` in
torch.compile's modes ``reduce-overhead`` and ``max-autotune`` (the engine's ``compile_mode``).
A batch that does not fit in the device's memory is recorded as such and skipped. Each model's
summary line gives ``default`` beside the best setting: both seconds per image and their ratio.

* ``reference``: Cohen et al.'s ``_sample_noise`` loop (``certify_throughput.reference``),
  float32 eager, at its best batch; timed on ``--reference-n`` draws and scaled linearly to n;
* ``engine``: ``Smoothed.run`` over the images' CERTIFY programs with ``BatchedVotes`` of that
  setting (``certify_throughput.engine``);
* ``ceiling``: the forward pass alone at the same batch, through the same prepared model,
  input layout and autocast, on noisy inputs drawn before the timing (``certify_throughput
  .ceiling``); timed on the sweep's draws and scaled linearly to n.

The batch sizes ``--batches`` are swept on a shorter workload (``--sweep-n`` estimation draws
per image; engine and ceiling interleaved, median of ``--rounds``); the engine is then timed on
the full workload at the batch where it was fastest. A compiled setting is compiled for one
batch shape at a time, so by default it runs only at the best batch of the same setting without
``compile`` when that was measured (``--compile-sweep`` sweeps it too); compilation and every
other warm-up happen outside the timings.

Achieved TFLOP/s counts the FLOPs of one forward pass of one input (``FlopCounterMode``, counted
once) times the draws, over the engine's time; the peak is the device's dense bf16 peak for
bf16/fp16 settings and its tf32 peak for float32 ones (cuDNN runs float32 convolutions in tf32
unless ``torch.backends.cudnn.allow_tf32`` is off; then its fp32 peak), from a table of known
devices or ``--peak-tflops``. Peak GPU memory: ``torch.cuda.max_memory_allocated`` over the
engine's timed runs at the best batch; peak host memory: the process's peak RSS
(``getrusage``), and how much it grew over the engine's timed runs.

Denoised rows (``--models ddpm_cifar10+cifar_resnet110``): google/ddpm-cifar10-32's UNet
(its configuration, ``denoised.DDPM_CIFAR10_UNET``) as a one-shot ``DiffusionDenoiser`` in front
of ResNet-110 (``Denoised``), with their own settings, batches, sweep and reference draws and
images (``--denoised-*``). Per setting: the fixed-n row as above plus noisy images/s, then
``--certifier sequential`` (n_max = n) of ``--sequential-images`` images on the grid to 2σ
(0, 0.25, 0.5 at σ = 0.25, as in studies/sequential) with each ``--sequential-tests`` test,
packed in one run at the setting's best batch: draws and seconds per image. Goals (H100, not
with ``--tiny-unet``): ≥ 4,000 noisy images/s in bf16, ≤ 1 s per image on the 2σ grid.

Random weights: the cost of a forward pass does not depend on them. The draws a sequential test
needs do (through p_A), so those rows also give the seconds per image at the draws the
sequential study's trained model needed on the same grid.

    python benchmarks/gpu_suite.py --device cuda --json gpu_suite.json
    python benchmarks/gpu_suite.py --device cpu --models lenet --n 2000 --n0 100 \\
        --batches 250 500 --settings fp32 channels_last bf16
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.metadata
import json
import math
import resource
import statistics
import sys

import certify_throughput as ct
import denoised as dn
import torch
from common import environment, flops_per_image, git_commit, goal, num, package_versions, verdict

from smoothcert.cli.dataset_run import LONG_RUN_DRAWS, OFF, device_defaults
from smoothcert.smoothing.engine import BatchedVotes
from smoothcert.stats.sequential_tests import SEQUENTIAL_TESTS

NUM_CLASSES = {"lenet": 10, "cifar_resnet20": 10, "cifar_resnet110": 10, "resnet50": 1000}
# s/image at the best setting, H100: issue 36 (Step 15); Step 12's were 1.0 and 5.0, met at
# 0.912 and 4.747 with bf16+channels_last+compile (docs/BENCHMARKS.md)
GOAL_SECONDS = {"cifar_resnet110": 0.6, "resnet50": 3.0}
GOAL_WORKLOAD = (100, 100_000)  # (n0, n) the time goals are for
GOAL_RATIO = 0.9  # engine / forward ceiling, at every setting
HOST_SHARE = 0.1  # the engine's host growth stays under this share of n noisy copies' bytes
# Dense peaks (no sparsity), TFLOP/s, from NVIDIA's datasheets: (bf16/fp16, tf32, fp32); the
# first entry whose words all occur in the device name applies.
PEAKS = [(("H100", "PCIe"), (756, 378, 51)), (("H100", "NVL"), (835, 418, 60)),
         (("H200", "NVL"), (835, 418, 60)), (("H100",), (989, 494, 67)),
         (("H200",), (989, 494, 67)), (("A100",), (312, 156, 19.5))]
DEFAULT_SETTINGS = ["fp32", "channels_last", "default", "bf16", "bf16+channels_last", "compile",
                    "bf16+channels_last+compile"]
COMPILE_MODES = {"compile_cudagraphs": "reduce-overhead", "compile_autotune": "max-autotune"}
"""Setting parts: ``compile`` in another torch.compile mode (the engine's ``compile_mode``)."""
# pair: its classifier, behind google/ddpm-cifar10-32's UNet (ResNet-20: a cheaper one, for tests)
DENOISED = {"ddpm_cifar10+cifar_resnet110": "cifar_resnet110",
            "ddpm_cifar10+cifar_resnet20": "cifar_resnet20"}
DENOISED_SETTINGS = ["fp32", "bf16+channels_last"]


def cli_default(device_type: str = "cuda") -> dict:
    """The engine settings ``smoothcert certify`` picks on ``device_type`` when no flag is
    given, for a run of one classifier long enough to compile (those that differ from off)."""
    chosen = device_defaults(device_type, LONG_RUN_DRAWS, one_classifier=True)
    return {key: value for key, value in chosen.items() if value != OFF[key]}


def setting_kwargs(name: str, device_type: str = "cuda") -> dict:
    """Engine keyword arguments of a setting such as ``bf16+channels_last`` (``default``: the
    CLI's choice on ``device_type``; a ``COMPILE_MODES`` part adds ``compile_mode``)."""
    kwargs = {}
    for part in name.split("+"):
        if part == "default":
            kwargs.update(cli_default(device_type))
        elif part in COMPILE_MODES:
            kwargs.update(compile=True, compile_mode=COMPILE_MODES[part])
        elif part == "fp32" or part in ct.ACCELERATIONS:
            kwargs.update(ct.ACCELERATIONS.get(part, {}))
        else:
            raise argparse.ArgumentTypeError(
                f"unknown setting part {part!r}; use fp32, default or "
                f"{', '.join([*ct.ACCELERATIONS, *COMPILE_MODES])}")
    return kwargs


def votes_for(kwargs: dict) -> BatchedVotes:
    """The engine of a setting's keyword arguments."""
    return BatchedVotes(**kwargs)


def peak_tflops(device: torch.device, kwargs: dict, override) -> tuple[float | None, str]:
    """(dense peak TFLOP/s or None, which peak) for a setting on this device."""
    half = kwargs.get("precision") in ("bf16", "fp16")
    tf32 = device.type == "cuda" and torch.backends.cudnn.allow_tf32
    kind = kwargs["precision"] if half else ("tf32" if tf32 else "fp32")
    if override:
        return (override[0] if half or len(override) == 1 else override[1]), kind + " (given)"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    for words, peaks in PEAKS:
        if all(w in name for w in words):
            return peaks[0 if half else 1 if tf32 else 2], kind
    return None, kind


def host_mb() -> float:
    """The process's peak resident set size so far, MB (``ru_maxrss``: KB on Linux)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


class Memory:
    """Peak GPU memory allocated inside its blocks, and growth of the peak RSS over them."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device, self.gpu_mb, self.host_growth_mb = device, None, 0.0

    def __enter__(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.rss = host_mb()

    def __exit__(self, *exc):
        self.host_growth_mb = max(self.host_growth_mb, host_mb() - self.rss)
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
            self.gpu_mb = max(self.gpu_mb or 0.0, peak)


def workload(args, n: int, batch: int) -> argparse.Namespace:
    return argparse.Namespace(n0=args.n0, n=n, batch=batch)


def median_time(fn, model, xs, ns, device, rounds: int, memory: Memory | None = None) -> float:
    times = []
    for _ in range(rounds):
        with memory or Memory(device):
            times.append(ct.timed(fn, model, xs, ns, device))
    return statistics.median(times)


def bench_reference(model, xs, args, device) -> dict:
    """Cohen et al.'s loop at each batch on reference-n draws: s/image scaled to n."""
    draws = min(args.reference_n, args.n)
    scale = (args.n0 + args.n) / (args.n0 + draws) / len(xs)
    per_batch = {}
    for batch in args.batches:
        try:
            ct.reference(model, xs[:1], workload(args, batch, batch))  # warm-up
            t = median_time(ct.reference, model, xs, workload(args, draws, batch), device,
                            args.rounds)
        except torch.OutOfMemoryError:  # float32 eager holds the most activations
            out_of_memory(device, f"reference, batch {batch}")
            continue
        per_batch[batch] = t * scale
    if not per_batch:
        raise SystemExit(f"the reference loop fits in memory at none of {args.batches}")
    best = min(per_batch, key=per_batch.get)
    return {"timed_n": draws, "best_batch": best, "seconds_per_image": per_batch[best],
            "per_batch": per_batch}


def sweep_batch(model, votes, xs, args, batch, device) -> dict:
    """Engine and ceiling at one batch on the sweep workload, interleaved rounds; the ceiling's
    time is per forwarded row times the workload's draws (its last batch is a whole one). A
    batch the device cannot hold is ``{"batch": b, "out_of_memory": True}``."""
    try:
        return measure_batch(model, votes, xs, args, batch, device)
    except torch.OutOfMemoryError:
        out_of_memory(device, f"batch {batch}")
        return {"batch": batch, "out_of_memory": True}


def out_of_memory(device: torch.device, what: str) -> None:
    """Free what a failed allocation left, and say what was skipped."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    print(f"{what}: out of memory, skipped", file=sys.stderr)


def measure_batch(model, votes, xs, args, batch, device) -> dict:
    run, ceil = ct.engine(votes), functools.partial(ct.ceiling, votes=votes)
    warm = workload(args, batch, batch)
    run(model, xs[:1], warm), ceil(model, xs[:1], warm)  # warm-up (and compilation)
    ns, memory = workload(args, min(args.sweep_n, args.n), batch), Memory(device)
    engine_t, ceiling_t = [], []
    for _ in range(args.rounds):
        with memory:
            engine_t.append(ct.timed(run, model, xs, ns, device))
        ceiling_t.append(ct.timed(ceil, model, xs, ns, device))
    draws = len(xs) * (ns.n0 + ns.n)  # the ceiling forwards whole batches: per row, scaled
    e = statistics.median(engine_t)
    c = statistics.median(ceiling_t) * draws / (math.ceil(draws / batch) * batch)
    return {"batch": batch, "engine_s": e, "ceiling_s": c, "engine_over_ceiling": c / e,
            "gpu_peak_mb": memory.gpu_mb, "host_growth_mb": memory.host_growth_mb}


def bench_setting(base, name, xs, args, device, batches, info, extra=None) -> dict | None:
    """One setting: batch sweep, the full workload at the best batch; ``extra(model, votes,
    batch)`` (a dict merged into the result) runs on the same prepared model before it goes.
    None when no batch fits in memory."""
    kwargs = setting_kwargs(name, device.type)
    if kwargs.get("compile"):
        torch._dynamo.reset()  # a fresh cache: no recompilation limit carried over
    model, votes = copy.deepcopy(base), votes_for(kwargs)  # channels_last converts in place
    sweep = [sweep_batch(model, votes, xs, args, b, device) for b in batches]
    fits = [r for r in sweep if not r.get("out_of_memory")]
    if not fits:
        print(f"{info['model']} {name}: no batch of {batches} fits in memory", file=sys.stderr)
        return None
    best = min(fits, key=lambda r: r["engine_s"])
    timed_n, images, draws = min(args.sweep_n, args.n), len(xs), args.n0 + args.n
    if timed_n < args.n:  # the full workload at the best batch
        memory = Memory(device)
        engine_s = median_time(ct.engine(votes), model, xs, workload(args, args.n, best["batch"]),
                               device, args.rounds, memory) / images
        gpu_mb, growth = memory.gpu_mb, max(memory.host_growth_mb, best["host_growth_mb"])
    else:
        engine_s, gpu_mb, growth = best["engine_s"] / images, best["gpu_peak_mb"], \
            best["host_growth_mb"]
    ceiling_s = best["ceiling_s"] / images * draws / (args.n0 + timed_n)
    more = extra(model, votes, best["batch"]) if extra else {}
    del model, votes
    if kwargs.get("compile"):
        torch._dynamo.reset()  # drop the compiled copy
    if device.type == "cuda":
        torch.cuda.empty_cache()
    tflops = info["flops_per_image"] * draws / engine_s / 1e12
    peak, peak_kind = peak_tflops(device, kwargs, args.peak_tflops)
    reference_s = info["reference"]["seconds_per_image"]
    ratio = ceiling_s / engine_s
    copies_mb = args.n * info["input_bytes"] / 2**20
    goal_s = time_goal(info["model"], args)
    return {
        "setting": name, "engine_settings": kwargs, "batches": batches,
        "best_batch": best["batch"], "sweep": sweep,
        "seconds_per_image": {"reference": reference_s, "engine": engine_s, "ceiling": ceiling_s},
        "engine_over_ceiling": ratio, "speedup_over_reference": reference_s / engine_s,
        "tflops": tflops, "peak_tflops": peak, "peak_kind": peak_kind,
        "percent_of_peak": None if peak is None else 100 * tflops / peak,
        "peak_gpu_mb": gpu_mb, "peak_host_mb": host_mb(), "host_growth_mb": growth,
        "goals": {
            "seconds_per_image": None if goal_s is None else goal(engine_s, goal_s, lower=True),
            "engine_over_ceiling": goal(ratio, GOAL_RATIO, lower=False),
            "host": goal(growth, HOST_SHARE * copies_mb, lower=True),
        }, **more,
    }


def try_setting(base, name, xs, args, device, batches, info) -> dict | None:
    """:func:`bench_setting`; where the setting is an experimental compile mode, its failure is
    a finding: one line on stderr, recorded in the model's ``failed``, and the suite goes on."""
    if "compile_mode" not in setting_kwargs(name, device.type):
        return bench_setting(base, name, xs, args, device, batches, info)
    try:
        return bench_setting(base, name, xs, args, device, batches, info)
    except Exception as err:  # noqa: BLE001 - torch.compile's backends raise many kinds
        said = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
        print(f"{info['model']} {name}: failed: {said}", file=sys.stderr)
        info.setdefault("failed", []).append({"setting": name, "error": said})
        torch._dynamo.reset()
        return None


def time_goal(model: str, args) -> float | None:
    """The s/image goal of ``model``, when the workload is the one it is set for."""
    return GOAL_SECONDS.get(model) if (args.n0, args.n) == GOAL_WORKLOAD else None


def row(model: str, r: dict) -> str:
    s, g = r["seconds_per_image"], r["goals"]
    goal_s = g["seconds_per_image"]
    goals = (f"s/img ≤ {goal_s['target']:g}: {verdict(goal_s)}; " if goal_s else "") + \
        f"≥ {GOAL_RATIO} ceiling: {verdict(g['engine_over_ceiling'])}; " \
        f"host: {verdict(g['host'])}"
    pct = "unknown" if r["percent_of_peak"] is None else \
        f"{r['percent_of_peak']:.1f}% of {r['peak_tflops']:g} {r['peak_kind']}"
    oom = [str(b["batch"]) for b in r.get("sweep", []) if b.get("out_of_memory")]
    batches = f"{r['best_batch']} of {'/'.join(map(str, r['batches']))}" + \
        (f" (out of memory: {'/'.join(oom)})" if oom else "")
    cells = [model, r["setting"], batches,
             num(s["reference"]), num(s["engine"]), num(s["ceiling"]),
             f"{r['engine_over_ceiling']:.2f}", f"{r['speedup_over_reference']:.2f}",
             num(r["tflops"], 2), pct,
             "—" if r["peak_gpu_mb"] is None else f"{r['peak_gpu_mb']:,.0f}",
             f"{r['peak_host_mb']:,.0f} (+{r['host_growth_mb']:,.0f})", goals]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| model | setting | best batch | reference s/img | engine s/img | ceiling s/img "
          "| engine/ceiling | × reference | TFLOP/s | % of peak | peak GPU MB "
          "| peak host MB (engine growth) | goals |\n" + "| --- " * 3 + "| ---: " * 9 + "| --- |")


def summary(name: str, settings: list[dict], args) -> str:
    best = min(settings, key=lambda r: r["seconds_per_image"]["engine"])
    s = best["seconds_per_image"]["engine"]
    line = (f"- **{name}**: best setting {best['setting']} at batch {best['best_batch']}: "
            f"{num(s)} s/image (reference {num(best['seconds_per_image']['reference'])})")
    if time_goal(name, args):
        line += f"; goal ≤ {time_goal(name, args):g} s/image on an H100: " \
                f"{verdict(goal(s, time_goal(name, args), lower=True))}"
    default = next((r for r in settings if r["setting"] == "default"), None)
    if default is not None:  # what a user gets with no flag, against the best
        d = default["seconds_per_image"]["engine"]
        line += f"; default (no flag) {num(d)} s/image, {d / s:.2f}× the best"
    missed = [r["setting"] for r in settings if not r["goals"]["engine_over_ceiling"]["met"]]
    return line + f"; engine ≥ {GOAL_RATIO} of the ceiling at every setting: " + \
        ("met" if not missed else f"missed at {', '.join(missed)}")


def setting_name(kwargs: dict) -> list[str]:
    """The parts of a setting's name, from its engine keyword arguments."""
    parts = [kwargs["precision"]] if "precision" in kwargs else []
    parts += [key for key in ("channels_last", "compile") if kwargs.get(key)]
    modes = {mode: part for part, mode in COMPILE_MODES.items()}
    return [modes.get(kwargs.get("compile_mode"), p) if p == "compile" else p for p in parts]


def ordered(settings: list[str]) -> list[str]:
    """Compiled settings last, so that they can take the best batch of their eager twin."""
    return sorted(settings, key=lambda s: bool(setting_kwargs(s).get("compile")))


def batches_for(name: str, done: list[dict], args, device_type: str = "cuda") -> list[int]:
    """A compiled setting's batches: the best of its eager twin (the same setting without
    ``compile`` and its mode) when that was measured, else all of them."""
    kwargs = setting_kwargs(name, device_type)
    if not kwargs.get("compile") or args.compile_sweep:
        return args.batches
    eager = {k: v for k, v in kwargs.items() if k not in ("compile", "compile_mode")}
    twin = next((r for r in done if r["engine_settings"] == eager), None)
    return [twin["best_batch"]] if twin else args.batches


def images(shape, count: int, device, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(shape, generator=g).to(device) for _ in range(count)]


def model_info(name: str, base, classes: int, xs, args, device) -> dict:
    shape = tuple(xs[0].shape)
    info = {"model": name, "input_shape": list(shape), "num_classes": classes,
            "flops_per_image": flops_per_image(base, shape, device),
            "input_bytes": 4 * math.prod(shape)}
    info["reference"] = bench_reference(base, xs, args, device)
    info["settings"] = []
    return info


def bench_model(name: str, args, device, results: dict) -> list[dict]:
    if name in DENOISED:
        return bench_denoised(name, args, device, results)
    shape, classes = ct.MODELS[name], NUM_CLASSES[name]
    base = ct.make_model(name, device, classes)
    xs = images(shape, args.images, device)
    info = model_info(name, base, classes, xs, args, device)
    results["models"].append(info)
    for setting in ordered(args.settings):
        batches = batches_for(setting, info["settings"], args, device.type)
        r = try_setting(base, setting, xs, args, device, batches, info)
        if r is None:
            continue
        info["settings"].append(r)
        print(row(name, r))
        write_json(args, results)
    return info["settings"]


def model_summary(name: str, args, device, results: dict) -> str:
    """Measure ``name``'s rows, then its summary line."""
    settings = bench_model(name, args, device, results)
    return dn.suite_summary(name, settings) if name in DENOISED else summary(name, settings, args)


def denoised_args(args) -> argparse.Namespace:
    """The suite's arguments with the denoised rows' own settings, batches, draws and images."""
    return argparse.Namespace(**{**vars(args), "settings": args.denoised_settings,
                                 "batches": args.denoised_batches,
                                 "sweep_n": args.denoised_sweep_n,
                                 "reference_n": args.denoised_reference_n,
                                 "images": args.denoised_images})


def bench_denoised(name: str, args, device, results: dict) -> list[dict]:
    """Fixed-n and sequential rows of google/ddpm-cifar10-32's UNet in front of a classifier."""
    sub, classifier = denoised_args(args), DENOISED[name]
    shape, classes = ct.MODELS[classifier], NUM_CLASSES[classifier]
    base = dn.suite_model(classifier, device, tiny=args.tiny_unet)
    xs = images(shape, sub.images, device)
    info = model_info(name, base, classes, xs, sub, device)
    info.update(unet="tiny" if args.tiny_unet else "google/ddpm-cifar10-32 (random weights)",
                timestep=base.denoiser.timestep)
    results["models"].append(info)
    with_goals = not args.tiny_unet and (args.n0, args.n) == GOAL_WORKLOAD  # the real UNet
    extra = functools.partial(dn.bench_sequentials, args=sub, device=device,
                              xs=images(shape, args.sequential_images, device, seed=1),
                              flops=info["flops_per_image"], with_goal=with_goals)
    print("\n" + dn.SUITE_HEADER)
    for setting in ordered(sub.settings):
        r = bench_setting(base, setting, xs, sub, device,
                          batches_for(setting, info["settings"], sub, device.type), info, extra)
        if r is None:
            continue
        rate = (sub.n0 + sub.n) / r["seconds_per_image"]["engine"]
        bf16 = r["engine_settings"].get("precision") == "bf16" and with_goals
        r["noisy_per_second"] = rate
        r["goals"]["noisy_per_second"] = \
            goal(rate, dn.GOAL_DENOISED_RATE, lower=False) if bf16 else None
        info["settings"].append(r)
        print("\n".join(dn.suite_rows(name, r)))
        write_json(args, results)
    return info["settings"]


def write_json(args, results: dict) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def suite_environment(device: torch.device) -> dict:
    env = environment(device)
    env.update({"torchvision": importlib.metadata.version("torchvision"),
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
                "commit": git_commit() or "no git (a copied working tree)",
                **package_versions("diffusers")})
    if device.type == "cuda":
        env["tf32"] = (f"cuDNN convolutions {torch.backends.cudnn.allow_tf32}, "
                       f"matmul {torch.backends.cuda.matmul.allow_tf32}; "
                       f"cudnn.benchmark {torch.backends.cudnn.benchmark}")
    return env


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", nargs="+", default=["cifar_resnet110", "resnet50"],
                   choices=list(ct.MODELS) + list(DENOISED))
    p.add_argument("--n", type=int, default=100_000, help="estimation draws per image")
    p.add_argument("--n0", type=int, default=100, help="selection draws per image")
    p.add_argument("--images", type=int, default=1, help="images per timed workload")
    p.add_argument("--batches", type=int, nargs="+", default=[256, 512, 1000, 2000])
    p.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS,
                   help="fp32, default (the CLI's choice on the device), or accelerations "
                        f"joined by '+': {', '.join([*ct.ACCELERATIONS, *COMPILE_MODES])} "
                        "(e.g. bf16+channels_last+compile)")
    p.add_argument("--rounds", type=int, default=1, help="timings per measurement (median)")
    p.add_argument("--sweep-n", type=int, default=10_000,
                   help="estimation draws per image in the batch sweep (and the ceiling)")
    p.add_argument("--reference-n", type=int, default=10_000,
                   help="estimation draws per image the reference loop is timed on")
    p.add_argument("--compile-sweep", action="store_true",
                   help="sweep every batch for compiled settings too (one compilation each)")
    p.add_argument("--peak-tflops", type=float, nargs="+", metavar="TFLOPS",
                   help="dense peak: one value for every setting, or two: bf16/fp16 and fp32")
    p.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    denoised_options(p)
    args = p.parse_args(argv)
    try:
        for s in args.settings + args.denoised_settings:
            setting_kwargs(s, torch.device(args.device).type)
    except argparse.ArgumentTypeError as err:
        p.error(str(err))
    if args.peak_tflops and len(args.peak_tflops) > 2:
        p.error("--peak-tflops takes one or two values")
    return args


def denoised_options(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("denoised rows (--models " + " ".join(DENOISED) + ")")
    d.add_argument("--denoised-settings", nargs="+", default=DENOISED_SETTINGS,
                   help="as --settings, for both networks")
    d.add_argument("--denoised-batches", type=int, nargs="+", default=[500, 1000])
    d.add_argument("--denoised-sweep-n", type=int, default=2000, help="as --sweep-n")
    d.add_argument("--denoised-reference-n", type=int, default=1000, help="as --reference-n")
    d.add_argument("--denoised-images", type=int, default=1, help="images per fixed-n timing")
    d.add_argument("--sequential-images", type=int, default=10,
                   help="images certified by --certifier sequential on the 2σ grid")
    d.add_argument("--sequential-tests", nargs="+", default=["union", "targeted"],
                   choices=list(SEQUENTIAL_TESTS))
    d.add_argument("--tiny-unet", action="store_true",
                   help="a toy UNet instead of google/ddpm-cifar10-32's (tests; no goals)")


def denoised_workload(w: dict) -> str:
    return (f"Denoised rows ({w['unet']} UNet, one-shot at t* for σ = "
            f"{ct.SIGMA}): settings {', '.join(w['settings'])}; fixed-n as above on "
            f"{w['images']} image(s), batches {'/'.join(map(str, w['batches']))}, sweep on "
            f"n = {w['sweep_n']}, reference on n = {w['reference_n']}; sequential "
            f"({', '.join(w['sequential_tests'])}; n_max = n) of {w['sequential_images']} "
            f"images on the grid to 2σ at the setting's best batch. Goals (H100): ≥ "
            f"{dn.GOAL_DENOISED_RATE:,.0f} noisy images/s in bf16, ≤ {dn.GOAL_GRID_SECONDS:g} "
            f"s/image on the 2σ grid (for n0 = {GOAL_WORKLOAD[0]}, n = {GOAL_WORKLOAD[1]} only).")


def main(argv=None) -> None:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # rows appear as they are measured
    device = torch.device(args.device)
    results = {"environment": suite_environment(device), "workload": {
        "n": args.n, "n0": args.n0, "alpha": 0.001, "sigma": ct.SIGMA, "images": args.images,
        "batches": args.batches, "rounds": args.rounds, "sweep_n": min(args.sweep_n, args.n),
        "reference_n": min(args.reference_n, args.n)}, "models": []}
    pairs = [name for name in args.models if name in DENOISED]
    if pairs:
        results["workload"]["denoised"] = {
            "settings": args.denoised_settings, "batches": args.denoised_batches,
            "sweep_n": min(args.denoised_sweep_n, args.n), "images": args.denoised_images,
            "reference_n": min(args.denoised_reference_n, args.n),
            "sequential_images": args.sequential_images, "sequential_tests":
                args.sequential_tests, "unet": "tiny" if args.tiny_unet else "ddpm-cifar10-32"}
    for key, value in results["environment"].items():
        print(f"{key}: {value}")
    w = results["workload"]
    print(f"\nworkload: CERTIFY of {args.images} image(s), n0 = {args.n0}, n = {args.n}, "
          f"α = 0.001, σ = {ct.SIGMA}; seconds per image, median of {args.rounds} round(s).")
    print(f"Batch sweep and ceiling on n = {w['sweep_n']} draws, reference on n = "
          f"{w['reference_n']} draws, both scaled linearly to n = {args.n}; the engine at its "
          f"best batch on the full n. Compiled settings: "
          f"{'every batch' if args.compile_sweep else 'the best batch of their eager twin'}; "
          f"default = the CLI's settings here for a long run of one classifier "
          f"({'+'.join(setting_name(cli_default(device.type))) or 'fp32'}). "
          f"TFLOP/s: one forward's FLOPs × draws / engine time. Goals (H100): s/image ≤ "
          f"{', '.join(f'{v:g} ({k})' for k, v in GOAL_SECONDS.items())} at the best setting "
          f"(for n0 = {GOAL_WORKLOAD[0]}, n = {GOAL_WORKLOAD[1]} only); "
          f"engine ≥ {GOAL_RATIO} × ceiling at every setting; host: the engine's growth of the "
          f"peak RSS < {HOST_SHARE:g} × the n noisy copies' bytes.")
    if pairs:
        print(denoised_workload(results["workload"]["denoised"]))
    if len(pairs) < len(args.models):
        print("\n" + HEADER)
    summaries = [model_summary(name, args, device, results) for name in args.models]
    print("\n" + "\n".join(summaries))
    write_json(args, results)


if __name__ == "__main__":
    main()
