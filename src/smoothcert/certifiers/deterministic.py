"""The ``deterministic`` certifier: Campbell, Finlay & Oberman, "Adversarial Boot Camp" (arXiv
2010.02508; code: github.com/ryancampbell514/HeatSmoothing), §4.1 and App. E.

A HeatSmoothing model f is trained to *be* a Gaussian average and is deployed as is: one forward
pass, no noise. Cohen et al.'s CERTIFY for the prediction f(x) on the clean input is a
guarantee, with probability ≥ 1−α, about the *hard smoothed classifier* g of f — not about f
itself at x + e (:func:`certify_deterministic`). The L-bound certifiers of the same paper are in
``certifiers/lbound.py``.
"""

from __future__ import annotations

import torch

from ..errors import SmoothcertError, check_count, check_probability
from ..model_calls import engine_call, meter
from ..smoothing.smoothed import Certificate, Smoothed, certificate
from ..stats import clopper_pearson_lower
from ..tensors import eval_mode
from .certifier import CERTIFY_COLUMNS, Certifier, certificate_row, register_certifier


def clean_scores(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax f(x) (C,) float64 of the model on one clean input x (C, H, W), in eval mode.

    The forward is an engine call (:mod:`smoothcert.model_calls`), so the base-model passes a
    model reports for it (an ensemble's members) count in the program's cost, as its noisy
    draws' do."""
    with eval_mode(model), torch.inference_mode(), engine_call(argmax_only=False) as call:
        logits = model(x.unsqueeze(0))
    meter(None if call.row_passes is None else int(call.row_passes.sum()))
    if logits.dim() != 2 or logits.shape[0] != 1:
        raise SmoothcertError(f"the model returned shape {tuple(logits.shape)}; expected (1, C)")
    return logits[0].double().softmax(dim=0)


def certify_deterministic(
    smoothed: Smoothed, x, n: int, alpha: float, batch_size: int, generator=None
) -> Certificate:
    """CERTIFY with the clean prediction as the class (the paper's certification of HeatSmoothing
    models: "the same certification algorithm, but without running SamplingUnderNoise to
    compute ĉ_A"; authors' ``cohen.py``, ``is_cohen=False``).

    Step 1: ĉ = argmax f(x) on the clean input x (C, H, W) in [0, 1] — no noise, no draws.
    Step 2: n_A = #{i : argmax f(x + δᵢ) = ĉ} over n draws δᵢ ~ N(0, σ²I) from ``generator``.
    Step 3: p_lower = Clopper–Pearson lower bound on p_A = P(f(x + δ) = ĉ) at level α.

    Guarantee: with probability ≥ 1−α over the n draws, p_A ≥ p_lower. So, unless it abstains
    (p_lower < ½), with probability ≥ 1−α the hard smoothed classifier g(x') = argmax_c
    P(f(x' + δ) = c) satisfies g(x + e) = ĉ for every ‖e‖₂ < σ·Φ⁻¹(p_lower) (Cohen et al.,
    Thm. 1; with other noise, in its norm within ``noise.radius(p_lower, d)``, d = C·H·W, and
    in every norm within ``radii``) — in particular
    g(x) = ĉ = f(x) when p_lower > ½. ĉ is a deterministic function of x,
    independent of the draws, so no selection draws (n0 = 0) and no union bound are needed: the
    one bound is at level α. It is a statement about g, not about f(x + e).

    On abstention, prediction None and radius 0. Returns a :class:`Certificate` with n0 = 0.
    """
    check_count("batch_size", batch_size)
    (done,) = smoothed.run([(None, deterministic_program(smoothed, x, n, alpha, generator))],
                           batch_size)
    return done.result


def deterministic_program(smoothed: Smoothed, x, n: int, alpha: float, generator=None):
    """:func:`certify_deterministic` as an engine program (its n draws batched with other
    inputs')."""
    check_count("n", n), check_probability("alpha", alpha)
    smoothed.noise.scalar_sigma()  # per-sample σ is refused before any draw
    x = smoothed.prepare_input(x, generator)
    c_hat = int(clean_scores(smoothed.model, x).argmax())  # host sync 1: no draws
    counts = yield from smoothed.votes_program(x, n, generator)
    n_a = int(counts[c_hat])
    p_lower = clopper_pearson_lower(n_a, n, alpha)
    return certificate(smoothed.noise, c_hat, p_lower, n_a, 0, n, alpha, x.numel())


@register_certifier("deterministic")
class Deterministic(Certifier):
    """Campbell et al.: the clean prediction f(x), certified with the run's n draws at level α.

    :func:`certify_deterministic` on every input (no selection draws)."""

    columns = CERTIFY_COLUMNS

    def clean_passes(self) -> int:
        return 1  # the clean prediction ĉ

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        c = yield from deterministic_program(run.smoothed, x, cfg.n, cfg.alpha, generator)
        return certificate_row(c, label)
