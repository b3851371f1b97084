"""The minimal-distance DDN attack: one search per input vs. one per grid budget, same records.

On one trained checkpoint and the same test images (every ``--skip``-th, ``--max`` of them),
``smoothcert attack --attack ddn --min-distance`` as the ``attack`` certifier runs it
(:class:`~smoothcert.certifiers.attack.SmoothedAttack`) against the search as first written
(``per_budget`` below: at every ε_k = 0.25, 0.5, … up to 4.0, DDN afresh from x with the same
fixed noises, then PREDICT at its output, until PREDICT misses the label). Both get the example's
own generator (``example_generator(seed, idx)``), as a run does.

Printed per image and in total: the attempts (the budget that ended the search), DDN's gradient
rows (noisy inputs through forward and backward) and PREDICT's rows (noisy inputs forwarded),
wall and CPU seconds, and whether the two outcomes are identical (the same adversarial input,
PREDICT counts, ε and attempts), the same but for the last PREDICT's counts (the new search
judged that point once, at an earlier budget; the old one judged it again with fresh draws), or
different (a repeated PREDICT flipped). Rows are a machine-independent measure of the work; CPU
seconds (``time.process_time``) are robust to other processes on a shared machine where wall
seconds are not. The two variants alternate per image so that drift hits both alike.

    OMP_NUM_THREADS=1 python benchmarks/attack.py --n 1000 --max 3
"""

from __future__ import annotations

import argparse
import time

import torch
from common import print_environment
from torch import nn

from smoothcert import Smoothed
from smoothcert.certifiers.attack import AttackSettings, SmoothedAttack
from smoothcert.data.datasets import load_dataset
from smoothcert.models.checkpoint import model_from_checkpoint
from smoothcert.noise import NOISES
from smoothcert.rng import example_generator
from smoothcert.smoothing.attacks import SoftSmoothedObjective, draw_noises

CHECKPOINT = "studies/sequential/records/fmnist_lenet_s025.pt"


class Rows(nn.Module):
    """Counts the noisy inputs ``model`` sees with a graph (attack steps) and without (PREDICT)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.gradient, self.predict = model, 0, 0

    def forward(self, x):
        if torch.is_grad_enabled():
            self.gradient += x.shape[0]
        else:
            self.predict += x.shape[0]
        return self.model(x)


def per_budget(runner: SmoothedAttack, x, label, generator):
    """The minimal-distance search as first written: (adversarial, clean, final, ε, attempts)."""
    smoothed, cfg = runner.smoothed, runner.settings
    clean = smoothed.predict(x, runner.n, runner.alpha, runner.batch_size, generator)
    if clean.prediction != label:
        return x, clean, clean, 0.0, 0
    noises = draw_noises(smoothed.noise, x[None], cfg.noise_draws, generator)
    objective = SoftSmoothedObjective(smoothed.model, torch.tensor([label]), noises)
    budgets, attacker = cfg.budgets(), cfg.attacker()
    for attempt, eps in enumerate(budgets, start=1):
        adv = attacker.attack_objective(smoothed.model, objective, x[None], epsilon=eps,
                                        generator=generator)[0]
        final = smoothed.predict(adv, runner.n, runner.alpha, runner.batch_size, generator)
        if final.prediction != label or attempt == len(budgets):
            return adv, clean, final, eps, attempt
    raise AssertionError("no budgets")


def timed(fn, counter: Rows) -> dict:
    counter.gradient = counter.predict = 0
    wall, cpu = time.perf_counter(), time.process_time()
    adv, clean, final, eps, attempts = fn()
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
            "gradient": counter.gradient, "predict": counter.predict,
            "result": (adv, clean, final, eps, attempts)}


def same(a: tuple, b: tuple) -> str:
    """"identical"; "same outcome" (the same adversarial input, verdict, ε and attempts, other
    PREDICT counts: the last point was judged at an earlier budget, with other draws); or
    "different"."""
    if torch.equal(a[0], b[0]) and a[1:] == b[1:]:
        return "identical"
    verdict = [(r[2].prediction, r[3], r[4]) for r in (a, b)]
    if torch.equal(a[0], b[0]) and verdict[0] == verdict[1]:
        return "same outcome"
    return "different"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default=CHECKPOINT)
    p.add_argument("--n", type=int, default=1000, help="PREDICT's draws")
    p.add_argument("--alpha", type=float, default=0.001)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--skip", type=int, default=100)
    p.add_argument("--max", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-root")
    args = p.parse_args()
    print_environment(torch.device("cpu"))
    model, meta = model_from_checkpoint(args.checkpoint)
    counter = Rows(model.eval())
    noise = NOISES[meta["noise"]["name"]](float(meta["noise"]["sigma"]))
    smoothed = Smoothed(counter, noise, int(meta["num_classes"]))
    settings = AttackSettings(attack="ddn", min_distance=True)
    runner = SmoothedAttack(smoothed, settings, n=args.n, alpha=args.alpha,
                            batch_size=args.batch)
    data = load_dataset(meta["dataset"], "test", args.data_root)
    print(f"checkpoint: {args.checkpoint}; DDN --min-distance, defaults {settings}; "
          f"n = {args.n}, batch {args.batch}")
    print("| idx | attempts | gradient rows old/new | PREDICT rows old/new | CPU s old/new | "
          "wall s old/new | outcome |")
    print("|---|---|---|---|---|---|---|")
    totals = {k: [0.0, 0.0] for k in ("gradient", "predict", "cpu", "wall")}
    kinds = {"identical": 0, "same outcome": 0, "different": 0}
    for i in range(args.max):
        idx = i * args.skip
        x, label = data.example(idx)
        gen = example_generator(args.seed, idx).get_state()
        runs = {"old": lambda x=x, y=label, g=gen: per_budget(runner, x, y, _generator(g)),
                "new": lambda x=x, y=label, g=gen: _outcome(runner(x, y, _generator(g)))}
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        got = {name: timed(runs[name], counter) for name in order}
        old, new = got["old"], got["new"]
        for k, pair in totals.items():
            pair[0] += old[k]
            pair[1] += new[k]
        kinds[same(old["result"], new["result"])] += 1
        print(f"| {idx} | {old['result'][4]}/{new['result'][4]} | {old['gradient']:,}/"
              f"{new['gradient']:,} | {old['predict']:,}/{new['predict']:,} | "
              f"{old['cpu']:.2f}/{new['cpu']:.2f} | {old['wall']:.2f}/{new['wall']:.2f} | "
              f"{same(old['result'], new['result'])} |", flush=True)
    ratio = {k: v[0] / max(v[1], 1e-12) for k, v in totals.items()}
    print(f"\ntotal over {args.max} images: CPU {totals['cpu'][0]:.1f} s → {totals['cpu'][1]:.1f} s"
          f" ({ratio['cpu']:.2f}×), wall {totals['wall'][0]:.1f} s → {totals['wall'][1]:.1f} s "
          f"({ratio['wall']:.2f}×); gradient rows {ratio['gradient']:.2f}× fewer, PREDICT rows "
          f"{ratio['predict']:.2f}× fewer; outcomes: {kinds}")


def _generator(state: torch.Tensor) -> torch.Generator:
    generator = torch.Generator()
    generator.set_state(state)
    return generator


def _outcome(o) -> tuple:
    return o.adversarial, o.clean, o.final, o.epsilon, o.attempts


if __name__ == "__main__":
    main()
