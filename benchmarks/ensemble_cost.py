"""Ensembles: the cost of one noisy draw through M classifiers against one classifier.

For each classifier (``lenet`` at Fashion-MNIST's 1×28×28, ``cifar_resnet110`` at CIFAR's
3×32×32; random weights behind our normalization layer, member i initialised from seed i), the
engine's throughput in noisy images per second (CERTIFY programs through ``Smoothed.run``,
timed as ``denoised.py`` times its variants: draws calibrated to ``--seconds`` per timing,
``--rounds`` interleaved rounds, median) of:

* ``one``: the classifier alone;
* ``ensemble-M``: :class:`smoothcert.Ensemble` of M members, the mean of their logits;
* ``ensemble-M-softmax``: the mean of their softmaxes;
* ``ensemble-M-exact``: the softmax mean with ``consensus="exact"``. With random weights the
  members are never confident together, so no member is skipped: this is the bookkeeping's
  worst case (the margins, the row selections), not its saving.

"× cost" is the median over rounds of ``one``'s throughput over the variant's (the same round).
By arithmetic an ensemble of M costs M forward passes per draw; the table says what the
averaging and the engine add. What a consensus saves is not timed here: with random weights the
members disagree on almost every draw, so it depends on trained members (the ensembles study
counts their evaluations, ``run.py cost``).

    python benchmarks/ensemble_cost.py                 # CPU, ~1 minute
    python benchmarks/ensemble_cost.py --device cuda --batch 1000
"""

from __future__ import annotations

import argparse

import certify_throughput as ct
import denoised as dn
import torch
from common import print_environment

from smoothcert.models.ensemble import Ensemble

CLASSIFIERS = ("lenet", "cifar_resnet110")
VARIANTS = ("one", "ensemble-3", "ensemble-3-softmax", "ensemble-3-exact", "ensemble-5")


def variant_model(classifier: str, variant: str, device, args) -> torch.nn.Module:
    """``one``: the classifier (seed 0); ``ensemble-M[-softmax]``: M members, seeds 0..M−1."""
    if variant == "one":
        return dn.seeded(lambda: ct.make_model(classifier, device), 0)
    _, m, *mode = variant.split("-")
    members = [dn.seeded(lambda: ct.make_model(classifier, device), i) for i in range(int(m))]
    exact = mode == ["exact"]
    return Ensemble(members, "softmax" if exact else (mode[0] if mode else "logits"),
                    consensus="exact" if exact else None).to(device).eval()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--classifiers", nargs="+", default=list(CLASSIFIERS), choices=CLASSIFIERS)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = dn.parse_timing_args(p, argv, batch=100)
    bad = [v for v in args.variants if v != "one" and not (
        v.startswith("ensemble-") and v.split("-")[1].isdigit()
        and v.split("-")[2:] in ([], ["softmax"], ["exact"]))]
    if bad:
        p.error(f"unknown variant(s) {bad}: one, ensemble-M, ensemble-M-softmax or "
                "ensemble-M-exact")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    print_environment(device)
    print(f"\nworkload: CERTIFY of {args.images} image(s), n0 = {args.n0}, n calibrated to "
          f"~{args.seconds:g} s per timing, batch {args.batch}, σ = {dn.SIGMA}, engine "
          f"{dn.engine_settings(args)}; noisy images/s, median of {args.rounds} interleaved "
          "rounds\n")
    print(dn.HEADER.replace("| denoiser |", "| variant |").replace(
        "× cost of the classifier alone", "× cost of one classifier"), flush=True)
    for name in args.classifiers:
        result = dn.bench_classifier(name, args, device, build=variant_model)
        print("\n".join(dn.rows(name, result, baseline="one")), flush=True)


if __name__ == "__main__":
    main()
