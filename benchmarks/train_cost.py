"""Training cost of every method relative to Gaussian augmentation (m = 1).

Every method trains the same architecture on the same data, at the same σ, batch size and device,
with the hyperparameters of its recipe (``configs/fashion-mnist/<method>_s050.yaml``). Each method
runs in its own subprocess, so that on CPU its peak resident memory is its own. We time
``--steps`` optimizer steps one by one after ``--warmup`` untimed ones and report seconds per
epoch as the median seconds per step × steps per epoch (the epoch's length at that batch size).

Not timed: epoch hooks that run once in a while (easy_focus's p̂A estimate over the training set at
its discard epoch, 100 draws per example, and every 10 epochs 16 draws; heat's teacher copy;
catrs's ŷ table, N·N_T teacher passes once per run). Teachers are stand-ins (untrained weights of
the run's architecture): a step costs the same whatever the weights. catrs builds its table from
one teacher vote per image (``teacher_draws=1``): its step looks ŷ up, whatever N_T.

    python benchmarks/train_cost.py                      # Fashion-MNIST LeNet if installed
    python benchmarks/train_cost.py --runs gaussian consistency --rounds 5  # drifting machines
    python benchmarks/train_cost.py --dataset digits --arch digits_cnn
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import print_environment

from smoothcert.models.checkpoint import save_checkpoint
from smoothcert.training import TrainConfig, Trainer
from smoothcert.training.recipes import load_recipe

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "fashion-mnist"
RUNS = ["gaussian", "gaussian_m2", "stability", "consistency", "smoothadv",
        "smoothadv_consistency", "macer", "smoothmix", "catrs", "easy_focus", "heat"]
RECIPES = {"gaussian_m2": "gaussian"}  # gaussian_m2: the forward/backward volume of consistency
# easy_focus's sphere attack only starts after its discard epoch; we time that phase directly by
# switching the (untimed, once-in-a-while) discard and reweigh passes off.
OVERRIDES = {"easy_focus": {"discard": False, "reweigh": False}, "gaussian_m2": {"num_noise": 2},
             "catrs": {"teacher_draws": 1}}  # the table's size, not N_T, reaches the step


def main() -> None:
    args = parse_args()
    if args.one:
        print(json.dumps(time_one(args)))
        return
    device = torch.device(args.device)
    print_environment(device)
    print(f"dataset: {args.dataset}, arch: {args.arch}, σ = {args.sigma}, batch {args.batch}, "
          f"{args.steps} timed steps after {args.warmup} warm-up steps\n")
    rounds = [{run: run_child(run, args) for run in args.runs} for _ in range(args.rounds)]
    print(table({run: median_round([r[run] for r in rounds]) for run in args.runs}))
    if args.rounds > 1:
        print(f"\n(median over {args.rounds} interleaved rounds; × gaussian per round: " +
              "; ".join(", ".join(f"{run} {ratio(r, run):.2f}" for run in args.runs[1:])
                        for r in rounds) + ")")


def median_round(results: list[dict]) -> dict:
    """The round with the median step time: one machine's speed drifts, so every method runs
    once per round, rounds interleaved, and each method's median round is reported."""
    ordered = sorted(results, key=lambda r: r["seconds_per_step"])
    return ordered[len(ordered) // 2]


def ratio(results: dict, run: str) -> float:
    epoch = {k: r["seconds_per_step"] * r["steps_per_epoch"] for k, r in results.items()}
    return epoch[run] / epoch["gaussian"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--arch", default="lenet")
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--runs", nargs="+", default=RUNS, choices=RUNS)
    p.add_argument("--data-root", default=None, help="folder with the dataset's files")
    p.add_argument("--rounds", type=int, default=1, help="interleaved repetitions of all runs")
    p.add_argument("--one", help=argparse.SUPPRESS)  # child mode: time this run, print JSON
    return p.parse_args()


def run_child(run: str, args) -> dict:
    argv = [sys.executable, __file__, "--one", run] + [
        f"--{k.replace('_', '-')}={getattr(args, k)}"
        for k in ("dataset", "arch", "sigma", "batch", "steps", "warmup", "device", "data_root")
        if getattr(args, k) is not None]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{run} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_one(args) -> dict:
    fields = load_recipe(CONFIGS / f"{RECIPES.get(args.one, args.one)}_s050.yaml")
    fields.update(dataset=args.dataset, arch=args.arch, sigma=args.sigma, batch_size=args.batch,
                  data_root=args.data_root)
    fields["method_params"].update(OVERRIDES.get(args.one, {}))
    with tempfile.TemporaryDirectory() as tmp:
        if fields["method"] == "heat":  # fine-tunes a pretrained model: any weights time the same
            fields["init_checkpoint"] = pretrained_stand_in(fields, args.device, Path(tmp))
        if fields["method"] == "catrs":  # its teacher's ŷ: a Gaussian model at σ_T = 0.25
            fields["method_params"]["teacher_checkpoint"] = pretrained_stand_in(
                {**fields, "sigma": fields["method_params"]["teacher_sigma"]}, args.device,
                Path(tmp))
        config = TrainConfig.from_dict(fields)
        cost = Trainer(config, args.device).time_steps(args.steps, args.warmup)
    params = dict(config.method_params)
    if "teacher_checkpoint" in params:  # a temporary file: the table names what it was
        params["teacher_checkpoint"] = "stand-in"
    return {**cost, "method_params": params}


def pretrained_stand_in(fields: dict, device: str, folder: Path) -> str:
    config = TrainConfig.from_dict({**fields, "method": "gaussian", "method_params": {}})
    trainer = Trainer(config, device)
    path = folder / "init.pt"
    save_checkpoint(path, trainer.model, trainer.meta())
    return str(path)


def table(results: dict) -> str:
    epoch = {run: r["seconds_per_step"] * r["steps_per_epoch"] for run, r in results.items()}
    lines = ["| method | hyperparameters | ms/step | s/epoch | × gaussian | peak MB |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for run, r in results.items():
        params = ", ".join(f"{k}={v}" for k, v in r["method_params"].items())
        ms = 1000 * r["seconds_per_step"]
        lines.append(f"| {run} | {params} | {ms:.2f} | {epoch[run]:.2f} | "
                     f"{epoch[run] / epoch['gaussian']:.2f} | {r['peak_mem_mb']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
