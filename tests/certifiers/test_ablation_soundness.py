"""Nothing the ablation certifier certifies is broken.

Patches: on 8×8 images, for every certified (x, m ≤ radius), EVERY placement of an m×m patch
inside the image, with random contents and the extremes 0 and 1, leaves the smoothed prediction
(recomputed by the same certifier on the patched image) unchanged. The models: a random
fixed-weight linear map of the encoding, a brightness classifier, and a "trigger" classifier
that votes class 1 whenever it sees a kept pixel above 0.99 (else class 0): for it an all-ones
patch flips exactly the m + b − 1 bands (or (m + b − 1)² blocks) it meets, so the certificate is
tight and an UNSOUND CONTROL (Δ one band or block row short: m + b − 2) is caught.

ℓ0: on tiny d the bound Δ(ρ) is checked against brute-force enumeration of every k-subset, and
the certificate against the exact worst case over every set of ρ changed pixels, for base
classifiers given as random tables of votes over all C(d, k) ablations; a control claiming
one pixel more is caught.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from test_ablation import Brightness, encoded, images, random_model
from torch import nn

import smoothcert.stats.ablation as bounds
from smoothcert.runs import certify_dataset
from smoothcert.stats.ablation import l0_certified, l0_delta, l0_radius

SIDE = 8


class Trigger(nn.Module):
    """Class 1 when a kept pixel is above 0.99, else class 0 (module doc); 4 classes."""

    def forward(self, encoded):
        half = encoded.shape[1] // 2
        hit = (encoded[:, :half] > 0.99).flatten(1).any(dim=1)
        logits = torch.full((encoded.shape[0], 4), -10.0, dtype=encoded.dtype)
        logits[:, 0] = torch.where(hit, -10.0, 10.0)
        logits[:, 1] = torch.where(hit, 10.0, -10.0)
        return logits


def predictions(model, xs, options):
    data = torch.utils.data.TensorDataset(xs, torch.zeros(len(xs), dtype=torch.long))
    rows = certify_dataset(model, data, certifier="ablation", num_classes=4, batch=512,
                           options=options)
    return [r["predict"] for r in sorted(rows, key=lambda r: r["idx"])], rows


def patched(x, m, generator):
    """Every placement of an m×m patch inside x (C, H, W), each with two random contents and the
    extremes 0 and 1: (count, C, H, W)."""
    out = []
    for r, c in itertools.product(range(SIDE - m + 1), repeat=2):
        for content in ("rand", "rand", 0.0, 1.0):
            y = x.clone()
            y[:, r:r + m, c:c + m] = torch.rand((x.shape[0], m, m), generator=generator) \
                if content == "rand" else content
            out.append(y)
    return torch.stack(out)


def broken_certificates(model, xs, options):
    """(idx, m) of every certificate some patch breaks, and how many certificates were tried."""
    predicted, rows = predictions(model, xs, options)
    g = torch.Generator().manual_seed(0)
    batches, owners = [], []
    for i, row in enumerate(sorted(rows, key=lambda r: r["idx"])):
        for m in range(1, int(row["radius"]) + 1):
            batches.append(patched(xs[i], m, g))
            owners += [(i, m)] * batches[-1].shape[0]
    if not batches:
        return set(), 0
    after, _ = predictions(model, torch.cat(batches), options)
    broken = {owner for owner, p in zip(owners, after) if p != predicted[owner[0]]}
    return broken, len(set(owners))


MODELS = {
    "random": lambda: (random_model(scale=10.0, seed=4),
                       torch.rand((5, 1, SIDE, SIDE), generator=torch.Generator().manual_seed(2))),
    "brightness": lambda: (encoded(Brightness()), images(count=4, spread=1.2).tensors[0]),
    "trigger": lambda: (encoded(Trigger()), 0.9 * images(count=2).tensors[0]),
}


@pytest.mark.parametrize("mode", ["column", "block"])
@pytest.mark.parametrize("name", list(MODELS))
def test_no_patch_breaks_a_certificate(name, mode):
    model, xs = MODELS[name]()
    broken, tried = broken_certificates(model, xs, {"mode": mode, "size": 2})
    assert tried > 0, "nothing certified: the test would prove nothing"
    assert not broken


@pytest.mark.parametrize("mode", ["column", "block"])
def test_an_unsound_control_is_caught(mode, monkeypatch):
    # Δ counted one band (or one row and column of blocks) short claims one side more.
    monkeypatch.setattr(bounds, "patch_delta",
                        lambda mode, m, size: (m + size - 2) ** (1 if mode == "column" else 2))
    model, xs = MODELS["trigger"]()
    broken, tried = broken_certificates(model, xs, {"mode": mode, "size": 2})
    assert broken, "the control's false certificates went unseen"


# --------------------------------------------------------------------------- ℓ0, brute force
def subsets(d, k):
    return list(itertools.combinations(range(d), k))


@pytest.mark.parametrize(("d", "k"), [(6, 2), (7, 3), (8, 1), (9, 4)])
def test_delta_is_the_chance_that_an_ablation_keeps_a_changed_pixel(d, k):
    for rho in range(d + 1):
        changed = set(range(rho))  # by symmetry any ρ pixels
        hits = sum(bool(changed.intersection(s)) for s in subsets(d, k))
        assert l0_delta(d, k, rho) == pytest.approx(hits / math.comb(d, k), abs=1e-15)


def worst_case(votes, d, k, rho):
    """The smallest share of ablations voting class 0 after an attacker changes ρ pixels: every
    ablation that keeps a changed pixel may vote anything, so the worst set S of ρ pixels turns
    all of them; returns the minimum over S of p_0(x')."""
    kept = subsets(d, k)
    worst = 1.0
    for s in itertools.combinations(range(d), rho):
        p = np.mean([v == 0 and not set(s).intersection(t) for v, t in zip(votes, kept)])
        worst = min(worst, p)
    return worst


@pytest.mark.parametrize(("d", "k"), [(7, 2), (8, 3)])
def test_l0_certificate_holds_against_every_changed_set_and_a_control_fails(d, k):
    rng = np.random.default_rng(5)
    control_caught, certified = False, 0
    for share in np.linspace(0.55, 1.0, 12):
        votes = np.where(rng.random(math.comb(d, k)) < share, 0, 1)  # one table of votes
        p = float(np.mean(votes == 0))  # the exact p_0(x): its own lower bound
        rho = l0_radius(p, d, k)
        if rho is None:
            continue
        certified += 1
        assert worst_case(votes, d, k, rho) > 0.5  # class 0 keeps the majority
        if rho + 1 <= d - k and worst_case(votes, d, k, rho + 1) <= 0.5:
            control_caught = True  # claiming ρ + 1 would have been false
        assert not l0_certified(p, d, k, rho + 1)
    assert certified and control_caught
