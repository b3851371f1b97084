"""Denoised smoothing: the cost of one noisy draw through a denoiser and a classifier, against
the classifier alone.

For each classifier — ``lenet`` at Fashion-MNIST's 1×28×28 and ``cifar_resnet110`` at CIFAR's
3×32×32, random weights behind our normalization layer (``certify_throughput.make_model``) —
the engine's throughput in noisy images per second (CERTIFY programs through ``Smoothed.run``
with ``BatchedVotes``, timed as ``certify_throughput.py`` times them) with each denoiser in
front of it (``smoothcert.denoisers.Denoised``):

* ``none``: the classifier alone;
* ``dncnn``: DnCNN of depth 17 and width 64 (Zhang et al. 2017; the denoiser Salman et al.
  2020 train for CIFAR-10);
* ``dncnn-small``: DnCNN of depth 7 and width 32 (``--small-dncnn DEPTH WIDTH``);
* ``diffusion``: one-shot diffusion denoising (Carlini et al. 2023: one UNet call at t*,
  ``DiffusionDenoiser``). On the CIFAR shape, google/ddpm-cifar10-32's ``UNet2DModel``
  configuration (:data:`DDPM_CIFAR10_UNET`, 35.7M parameters) with its scheduler (DDPM, 1000
  linear β from 1e-4 to 0.02); on the 1×28×28 shape, whose sides that UNet cannot halve three
  times, our ``ddpm_unet`` arch at its defaults (what ``train --method diffusion`` builds).

Random weights everywhere: a forward pass costs the same whatever they are. The draws of one
timing are calibrated per variant so that it lasts about ``--seconds`` (at least one batch);
every variant of a classifier runs once per round, ``--rounds`` interleaved rounds, median.
"× cost" is the median over rounds of the classifier's throughput over the variant's, both
measured in the same round. σ = 0.25 (it sets the diffusion step's t*, not its cost).

    python benchmarks/denoised.py                     # CPU: ~2 minutes on 2 shared cores
    python benchmarks/denoised.py --device cuda --batch 1000 --precision bf16 --channels-last

The GPU suite's denoised rows (``gpu_suite.py --models ddpm_cifar10+cifar_resnet110``) take
their models and their sequential runs, rows and goals from the second half of this module.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import Counter

import certify_throughput as ct
import numpy as np
import torch
from common import flops_per_image, goal, num, package_versions, print_environment, verdict

from smoothcert.certifiers.sequential import RADIUS_STEP, sequential_program
from smoothcert.denoisers import Denoised, DiffusionDenoiser, DnCNN
from smoothcert.models import build_model
from smoothcert.noise import Gaussian
from smoothcert.smoothing.smoothed import Smoothed
from smoothcert.stats.sequential_tests import SEQUENTIAL_TESTS

SIGMA = ct.SIGMA
CLASSIFIERS = ("lenet", "cifar_resnet110")
CERTIFY_DRAWS = 100 + 100_000  # n0 + n of CERTIFY at the n, for the s/image column

# google/ddpm-cifar10-32's unet/config.json (Ho et al.'s CIFAR-10 model: 128 channels × (1, 2,
# 2, 2), attention at 16×16, two residual blocks per level), every key that shapes the network;
# checked against diffusers' UNet2DModel: 35,746,307 parameters, 12.1 GFLOP per 32×32 image.
DDPM_CIFAR10_UNET = {
    "sample_size": 32, "in_channels": 3, "out_channels": 3, "layers_per_block": 2,
    "block_out_channels": (128, 256, 256, 256),
    "down_block_types": ("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    "act_fn": "silu", "attention_head_dim": None, "center_input_sample": False,
    "downsample_padding": 0, "flip_sin_to_cos": False, "freq_shift": 1,
    "mid_block_scale_factor": 1, "norm_eps": 1e-6, "norm_num_groups": 32,
    "time_embedding_type": "positional",
}
# The same kinds of blocks at toy size (45k parameters, 0.03 GFLOP per 32×32 image), for CPU
# tests of the GPU suite.
TINY_UNET = {
    "sample_size": 32, "in_channels": 3, "out_channels": 3, "layers_per_block": 1,
    "block_out_channels": (8, 16), "down_block_types": ("DownBlock2D", "AttnDownBlock2D"),
    "up_block_types": ("AttnUpBlock2D", "UpBlock2D"), "norm_num_groups": 4,
}
# google/ddpm-cifar10-32's scheduler/scheduler_config.json, the keys that set ᾱ_t (Ho et al.'s
# linear schedule; one-shot denoising reads nothing else but the default "epsilon" prediction).
DDPM_SCHEDULER = {"num_train_timesteps": 1000, "beta_schedule": "linear",
                  "beta_start": 1e-4, "beta_end": 0.02}


def seeded(build, seed: int = 0):
    """``build()`` with the global RNG seeded (torch.nn and diffusers initialise weights from
    it), the caller's RNG state left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def ddpm_cifar10(sigma: float, tiny: bool = False) -> DiffusionDenoiser:
    """One-shot denoiser with google/ddpm-cifar10-32's UNet and scheduler, random weights
    (``tiny``: :data:`TINY_UNET` instead, for tests)."""
    from diffusers import DDPMScheduler, UNet2DModel  # the optional extra, only when asked

    unet = seeded(lambda: UNet2DModel(**(TINY_UNET if tiny else DDPM_CIFAR10_UNET)))
    return DiffusionDenoiser(unet, DDPMScheduler(**DDPM_SCHEDULER), sigma)


def suite_model(classifier: str, device, tiny: bool = False) -> Denoised:
    """The GPU suite's pair: google/ddpm-cifar10-32's UNet (random weights; ``tiny``: the toy
    one) denoising for σ = 0.25 in front of ``classifier``, eval, on device."""
    model = Denoised(ddpm_cifar10(SIGMA, tiny), ct.make_model(classifier, device))
    return model.to(device).eval()


def own_ddpm(shape: tuple, sigma: float) -> DiffusionDenoiser:
    """One-shot denoiser with our ``ddpm_unet`` arch at its defaults for ``shape``."""
    model = seeded(lambda: build_model("ddpm_unet", 1, shape, None, None, {}))
    return DiffusionDenoiser(model.unet, model.scheduler, sigma)


def diffusion(shape: tuple, sigma: float, args) -> DiffusionDenoiser:
    return ddpm_cifar10(sigma) if tuple(shape) == (3, 32, 32) else own_ddpm(shape, sigma)


DENOISERS = {
    "dncnn": lambda shape, sigma, args: seeded(lambda: DnCNN(shape[0], depth=17, width=64)),
    "dncnn-small": lambda shape, sigma, args: seeded(
        lambda: DnCNN(shape[0], depth=args.small_dncnn[0], width=args.small_dncnn[1])),
    "diffusion": diffusion,
}
VARIANTS = ("none",) + tuple(DENOISERS)


def variant_model(classifier: str, variant: str, device, args) -> torch.nn.Module:
    """The classifier alone (``none``) or ``Denoised(denoiser, classifier)``, eval, on device."""
    model = ct.make_model(classifier, device)
    if variant != "none":
        den = DENOISERS[variant](ct.MODELS[classifier], SIGMA, args)
        model = Denoised(den, model)
    return model.to(device).eval()


def engine_settings(args) -> dict:
    return {"precision": args.precision, "channels_last": args.channels_last}


def workload(args, batches: int) -> argparse.Namespace:
    """CERTIFY with ``--n0`` selection draws and n estimation draws per image, n0 + n a whole
    number of batches (no half-empty batch at the end of a lone image)."""
    return argparse.Namespace(n0=args.n0, n=batches * args.batch - args.n0, batch=args.batch)


def calibrate(run, model, xs, args, device) -> argparse.Namespace:
    """The workload of one timing: as many batches per image as last about ``--seconds`` (at
    least one), from probes of 1, 4, 16, … batches until one lasts a fifth of that."""
    run(model, xs[:1], workload(args, 1))  # warm-up outside the timings
    batches = 1
    while True:
        seconds = ct.timed(run, model, xs, workload(args, batches), device)
        if seconds >= args.seconds / 5 or batches >= 2**16:
            break
        batches *= 4
    return workload(args, max(1, round(batches * args.seconds / seconds)))


def bench_classifier(name: str, args, device, build=None) -> dict:
    """Per variant: draws per timing, noisy images/s per round and GFLOP per draw. ``build``
    (default :func:`variant_model`) makes a variant's model, as ``(name, variant, device,
    args)``."""
    build = build or variant_model
    g = torch.Generator().manual_seed(0)
    xs = [torch.rand(ct.MODELS[name], generator=g).to(device) for _ in range(args.images)]
    setups = {}
    for variant in args.variants:
        model, run = build(name, variant, device, args), ct.engine(engine_settings(args))
        setups[variant] = (model, run, calibrate(run, model, xs, args, device))
    rates = {variant: [] for variant in setups}
    for _ in range(args.rounds):
        for variant, (model, run, work) in setups.items():
            draws = len(xs) * (work.n0 + work.n)
            rates[variant].append(draws / ct.timed(run, model, xs, work, device))
    return {variant: {"draws": len(xs) * (work.n0 + work.n), "rates": rates[variant],
                      "gflop": flops_per_image(model, ct.MODELS[name], device) / 1e9}
            for variant, (model, run, work) in setups.items()}


def rows(name: str, result: dict, baseline: str = "none") -> list[str]:
    """Table rows; "× cost" needs the ``baseline`` variant, measured in the same rounds."""
    alone = result.get(baseline)
    out = []
    for variant, r in result.items():
        rate = statistics.median(r["rates"])
        cost = "—" if alone is None else "{:.1f} ({})".format(
            statistics.median(a / b for a, b in zip(alone["rates"], r["rates"])),
            " / ".join(f"{a / b:.1f}" for a, b in zip(alone["rates"], r["rates"])))
        out.append(f"| {name} | {variant} | {r['gflop']:.3f} | {r['draws']:,} | {rate:,.0f} "
                   f"| {cost} | {CERTIFY_DRAWS / rate:,.1f} |")
    return out


HEADER = ("| classifier | denoiser | GFLOP / draw | draws / timing | noisy images/s "
          "| × cost of the classifier alone (per round) | s / image at n0 = 100, n = 100,000 |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: |")


# ---- the denoised rows of the GPU suite (gpu_suite.py): sequential runs, rows, summary ----

GOAL_DENOISED_RATE = 4000.0  # noisy images/s in bf16 on an H100, for this pair (12.6 GFLOP)
# (not Carlini et al.'s 50-GFLOP pipeline: dds_like_for_like.py compares with their loop)
GOAL_GRID_SECONDS = 1.0  # s/image of sequential certification on the 2σ grid, H100
# Mean draws per image (n0 included) of each test on the sequential study's grid to 2σ
# (studies/sequential: trained Fashion-MNIST LeNet, σ = 0.25, 200 images, n_max = 100,000).
STUDY_DRAWS = {"union": 2395, "mixture": 2542, "targeted": 913}


def two_sigma_grid(sigma: float) -> np.ndarray:
    """0, 0.25, … up to 2σ: the sequential study's grid to 2σ (0, 0.25, 0.5 at σ = 0.25)."""
    return RADIUS_STEP * np.arange(math.floor(2 * sigma / RADIUS_STEP + 1e-9) + 1)


def bench_sequentials(model, votes, batch: int, xs, args, device, flops: int,
                      with_goal: bool) -> dict:
    """One :func:`bench_sequential` per test of ``args.sequential_tests``."""
    return {"sequential": [bench_sequential(model, votes, batch, xs, args, device, test, flops,
                                            with_goal) for test in args.sequential_tests]}


def bench_sequential(model, votes, batch, xs, args, device, test: str, flops: int,
                     with_goal: bool) -> dict:
    """``--certifier sequential`` (n_max = ``args.n``, ``args.n0``, α = 0.001) of every image of
    ``xs`` on the 2σ grid, all packed in one engine run at ``batch`` (after a one-image warm-up):
    draws, seconds and noisy images/s, the radii certified and why sampling stopped.

    With random weights every draw tends to vote for one class (p_A ≈ 1), so each image takes
    the fewest draws its test can stop at; a trained model's images need more. Hence also the
    seconds per image at the draws the sequential study's trained model needed with that test on
    its 2σ grid (:data:`STUDY_DRAWS`), at the measured rate, and the goal at both."""
    grid = two_sigma_grid(SIGMA)
    smoothed = Smoothed(model, Gaussian(SIGMA), model.num_classes, votes)

    def run(inputs):
        programs = [(i, sequential_program(smoothed, x, args.n0, grid, 0.001, args.n,
                                           torch.Generator(x.device).manual_seed(i),
                                           SEQUENTIAL_TESTS[test]()))
                    for i, x in enumerate(inputs)]
        return [done.result for done in smoothed.run(programs, batch)]

    run(xs[:1])
    seconds, certificates = timed_call(run, xs, device)
    draws = sum(c.n0 + c.draws for c in certificates)
    per_image, rate = seconds / len(xs), draws / seconds
    at_study = STUDY_DRAWS[test] / rate if test in STUDY_DRAWS else None
    return {"test": test, "grid": ",".join(f"{r:g}" for r in grid), "images": len(xs),
            "batch": batch, "draws_per_image": draws / len(xs), "seconds_per_image": per_image,
            "noisy_per_second": rate, "tflops": flops * rate / 1e12,
            "radii": dict(Counter("abstain" if c.abstained else f"{c.radius:g}"
                                  for c in certificates)),
            "stopped": dict(Counter(c.stopped for c in certificates)),
            "seconds_at_study_draws": at_study,
            "goal": goal(per_image, GOAL_GRID_SECONDS, lower=True) if with_goal else None,
            "goal_at_study_draws": goal(at_study, GOAL_GRID_SECONDS, lower=True)
            if with_goal and at_study is not None else None}


def timed_call(fn, xs, device) -> tuple[float, object]:
    """(seconds, ``fn(xs)``), the device synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn(xs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


SUITE_HEADER = (
    "| pair | setting | certifier | batch | draws / image | noisy images/s | engine s/img "
    "| reference s/img | ceiling s/img | engine/ceiling | TFLOP/s | peak GPU MB | goals |\n"
    "| --- | --- | --- " + "| ---: " * 9 + "| --- |")


def suite_rows(name: str, r: dict) -> list[str]:
    """The GPU suite's fixed-n row of a setting, then one row per sequential test."""
    s, g = r["seconds_per_image"], r["goals"]
    rate, ceiling = g.get("noisy_per_second"), g["engine_over_ceiling"]
    goals = (f"≥ {GOAL_DENOISED_RATE:,.0f} img/s: {verdict(rate)}; " if rate else "") + \
        f"≥ {ceiling['target']:g} ceiling: {verdict(ceiling)}"
    gpu = "—" if r["peak_gpu_mb"] is None else f"{r['peak_gpu_mb']:,.0f}"
    out = [f"| {name} | {r['setting']} | certify | {r['best_batch']} | "
           f"{r['noisy_per_second'] * s['engine']:,.0f} | {r['noisy_per_second']:,.0f} | "
           f"{num(s['engine'])} | {num(s['reference'])} | {num(s['ceiling'])} | "
           f"{r['engine_over_ceiling']:.2f} | {num(r['tflops'], 2)} | {gpu} | {goals} |"]
    return out + [sequential_row(name, r["setting"], q) for q in r.get("sequential", [])]


def sequential_row(name: str, setting: str, q: dict) -> str:
    goals = f"≤ {GOAL_GRID_SECONDS:g} s/img: {verdict(q['goal'])}" if q["goal"] else "no goal"
    if q["seconds_at_study_draws"] is not None:
        goals += (f"; at the study's {STUDY_DRAWS[q['test']]:,} draws/img: "
                  f"{num(q['seconds_at_study_draws'])} s/img")
        goals += f", {verdict(q['goal_at_study_draws'])}" if q["goal_at_study_draws"] else ""
    return (f"| {name} | {setting} | sequential ({q['test']}, grid {q['grid']}) | {q['batch']} "
            f"| {q['draws_per_image']:,.0f} | {q['noisy_per_second']:,.0f} "
            f"| {num(q['seconds_per_image'])} | — | — | — | {num(q['tflops'], 2)} | — "
            f"| {goals} |")


def suite_summary(name: str, settings: list[dict]) -> str:
    """One line: the best fixed-n throughput and the best 2σ-grid seconds, against the goals."""
    best = max(settings, key=lambda r: r["noisy_per_second"])
    line = (f"- **{name}**: best {best['setting']} at batch {best['best_batch']}: "
            f"{best['noisy_per_second']:,.0f} noisy images/s, "
            f"{num(best['seconds_per_image']['engine'])} s/image fixed-n")
    rates = [r["goals"]["noisy_per_second"] for r in settings if r["goals"]["noisy_per_second"]]
    if rates:
        line += f"; ≥ {GOAL_DENOISED_RATE:,.0f} img/s in bf16 on an H100: " + \
            verdict(min(rates, key=lambda g: g["factor"]))
    runs = [(r["setting"], q) for r in settings for q in r.get("sequential", [])]
    return line + grid_summary(runs, "seconds_per_image", "goal") + \
        grid_summary([p for p in runs if p[1]["seconds_at_study_draws"] is not None],
                     "seconds_at_study_draws", "goal_at_study_draws")


def grid_summary(runs: list[tuple[str, dict]], seconds: str, goal_key: str) -> str:
    """The fastest (setting, sequential run) by ``seconds`` (measured, or at the study's draws)
    and its verdict."""
    if not runs:
        return ""
    setting, q = min(runs, key=lambda p: p[1][seconds])
    draws = f"{q['draws_per_image']:,.0f}" if seconds == "seconds_per_image" else \
        f"the study's {STUDY_DRAWS[q['test']]:,}"
    line = f"; 2σ grid at {draws} draws/image: {num(q[seconds])} s ({setting}, {q['test']})"
    if q[goal_key]:
        line += f", ≤ {GOAL_GRID_SECONDS:g} s on an H100: {verdict(q[goal_key])}"
    return line


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--classifiers", nargs="+", default=list(CLASSIFIERS), choices=CLASSIFIERS)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--small-dncnn", nargs=2, type=int, default=[7, 32],
                   metavar=("DEPTH", "WIDTH"), help="the small DnCNN's depth and width")
    return parse_timing_args(p, argv, batch=32)


def parse_timing_args(p: argparse.ArgumentParser, argv, batch: int) -> argparse.Namespace:
    """``p`` with the workload and engine flags of a throughput comparison, parsed (also
    ``ensemble_cost.py``'s)."""
    p.add_argument("--images", type=int, default=1, help="images per timing")
    p.add_argument("--n0", type=int, default=10, help="selection draws per image")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--seconds", type=float, default=1.5, help="about this long per timing")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--channels-last", action="store_true")
    args = p.parse_args(argv)
    if not 0 < args.n0 < args.batch:
        p.error("--n0 must be positive and smaller than --batch")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    print_environment(device)
    for package, version in package_versions("diffusers").items():
        print(f"{package}: {version}")
    print(f"\nworkload: CERTIFY of {args.images} image(s), n0 = {args.n0}, n calibrated to "
          f"~{args.seconds:g} s per timing, batch {args.batch}, σ = {SIGMA}, engine "
          f"{engine_settings(args)}; noisy images/s, median of {args.rounds} interleaved "
          f"rounds; small DnCNN: depth {args.small_dncnn[0]}, width {args.small_dncnn[1]}\n")
    print(HEADER, flush=True)
    for name in args.classifiers:
        print("\n".join(rows(name, bench_classifier(name, args, device))), flush=True)


if __name__ == "__main__":
    main()
