"""Golden values of the CAT-RS loss from the authors' own code (alinlab/smoothing-catrs).

Usage::

    python tools/golden/catrs_golden.py PATH_TO_CHECKOUT

PATH_TO_CHECKOUT is a checkout of github.com/alinlab/smoothing-catrs (the values in
tests/methods/test_catrs.py come from commit d4bc576e7d373d158f087ba5744af8bb48466bb7). Their
``code/train_catrs.py`` is imported from there, unchanged: its command line is set through
``sys.argv`` before the import, ``tensorboardX`` (not a dependency of ours) is stubbed, and three
of its names are swapped while ``train()`` runs, so that it sees fixed draws:

- ``torch.randn_like`` returns fixed standard-normal tensors z (their noise is z · σ);
- ``Binomial(m, p).sample()`` returns the number of fixed uniforms u (B, m) below p, the same
  law as theirs (ours draws K' the same way);
- ``AverageMeter`` records every value ``train()`` logs: per chunk, the mean of L^low
  (``losses``) and the loss (``losses_reg``);

and the optimizer is a stand-in whose ``step()`` records the gradient norm and changes nothing,
so every chunk sees the same weights (BatchNorm's running statistics do move, as in their loop).
``train()`` gets one loaded batch of m·b examples (x, y, ŷ), which it splits into m chunks of b,
one loss each. The same inputs then go through ``smoothcert.methods.catrs.catrs_loss`` chunk by
chunk, and both are printed with their largest difference. Inputs (all float64; see
:func:`golden_inputs`): the model ``Flatten, Linear(64, 16), BatchNorm1d(16), ReLU,
Linear(16, 10)`` initialised after ``torch.manual_seed(0)``; from ``Generator().manual_seed(seed)``
in this order x = rand(m·b, 1, 8, 8), z = randn(m, m, b, 1, 8, 8) (chunk, copy), u = rand(m, b,
m) and labels r = randint(10, (m·b,)); y_i = r_i for odd i, and for even i the class the model
(eval mode) predicts at x_i, so that both branches (K = m and K < m) occur; then the smoothed
prediction ŷ = the vote frequencies of 20 draws (``multinomial``) from softmax(3·randn(m·b, 10)
+ 3·onehot(y)), a distribution with zeros that favours the label.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CASES = {
    # name: (m, b, sigma, epsilon, num_steps, lbd, confidence_mask, seed)
    "votes": (4, 6, 0.5, 1.0, 4, 1.0, False, 1),
    "mask": (2, 5, 0.25, 0.5, 2, 0.5, True, 2),
}


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(),
                          nn.Linear(16, 10))
    return model.double()


def golden_inputs(name: str):
    """(model, x, y, z, u, target) of a case, as the module docstring describes."""
    m, b, *_, seed = CASES[name]
    model = tiny_model()
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    x = torch.rand(m * b, 1, 8, 8, generator=gen, dtype=f64)
    z = torch.randn(m, m, b, 1, 8, 8, generator=gen, dtype=f64)
    u = torch.rand(m, b, m, generator=gen, dtype=f64)
    labels = torch.randint(10, (m * b,), generator=gen)
    with torch.no_grad():
        predicted = model.eval()(x).argmax(dim=1)
    model.train()
    y = torch.where(torch.arange(m * b) % 2 == 0, predicted, labels)
    scores = 3 * torch.randn(m * b, 10, generator=gen, dtype=f64) + 3 * F.one_hot(y, 10)
    votes = torch.multinomial(scores.softmax(dim=1), 20, replacement=True, generator=gen)
    return model, x, y, z, u, F.one_hot(votes, 10).to(f64).mean(dim=1)


def load_authors_module(checkout: Path, name: str):
    """Import their ``code/train_catrs.py`` with the command line of case ``name``."""
    m, _, sigma, epsilon, steps, lbd, mask, _ = CASES[name]
    sys.path.insert(0, str(checkout / "code"))
    sys.modules.setdefault("tensorboardX", types.SimpleNamespace(SummaryWriter=None))
    argv = ["train_catrs.py", "cifar10", "cifar_resnet110", "--noise_sd", str(sigma),
            "--num-noise-vec", str(m), "--epsilon", str(epsilon * 256), "--num-steps",
            str(steps), "--lbd", str(lbd)] + (["--confidence_mask"] if mask else [])
    saved, sys.argv = sys.argv, argv
    try:
        sys.modules.pop("train_catrs", None)
        return importlib.import_module("train_catrs")
    finally:
        sys.argv = saved


class _Recorder:
    """Stand-in for their AverageMeter: keeps every logged value, in creation order."""

    made: list[_Recorder] = []

    def __init__(self):
        self.values: list[float] = []
        self.avg = 0.0
        _Recorder.made.append(self)

    def update(self, val, n=1):
        self.values.append(float(val))


class _GradNormOptimizer:
    """Stand-in optimizer: records the parameters' gradient norm at each step, changes nothing."""

    def __init__(self, params):
        self.params = list(params)
        self.norms: list[float] = []

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        self.norms.append(torch.sqrt(sum(p.grad.pow(2).sum() for p in self.params)).item())


def authors_values(checkout: Path, name: str) -> dict[str, list[float]]:
    """Per chunk: their loss, mean L^low, gradient norm, and K (via the Binomial stand-in)."""
    module = load_authors_module(checkout, name)
    m, _, sigma, epsilon, *_ = CASES[name]
    model, x, y, z, u, target = golden_inputs(name)
    normals = iter(z.flatten(0, 1))
    uniforms, ks = iter(u), []

    class Binomial:
        def __init__(self, total_count, probs):
            self.probs = probs

        def sample(self):
            k = (next(uniforms) < self.probs.unsqueeze(1)).sum(dim=1).to(self.probs.dtype)
            ks.append(k.long().clamp(min=1).tolist())
            return k

    _Recorder.made = []
    module.AverageMeter, module.Binomial = _Recorder, Binomial
    optimizer = _GradNormOptimizer(model.parameters())
    attacker = module.KL_PGD(steps=module.args.num_steps, max_norm=module.args.epsilon)
    real_randn_like = torch.randn_like
    torch.randn_like = lambda like, device=None: next(normals)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            module.train([(x, y, target)], model, None, optimizer, 0, sigma, attacker, "cpu")
    finally:
        torch.randn_like = real_randn_like
    low, loss = _Recorder.made[2].values, _Recorder.made[3].values
    return {"loss": loss, "low": low, "grad_norm": optimizer.norms, "k": ks}


def our_values(name: str) -> dict[str, list[float]]:
    """The same chunks through smoothcert's ``catrs_loss``."""
    from smoothcert.methods.catrs import catrs_loss

    m, b, sigma, epsilon, steps, lbd, mask, _ = CASES[name]
    model, x, y, z, u, target = golden_inputs(name)
    out = {"loss": [], "low": [], "grad_norm": []}
    for c in range(m):
        rows = slice(c * b, (c + 1) * b)
        result = catrs_loss(model, x[rows], y[rows], sigma * z[c], u[c], target=target[rows],
                            epsilon=epsilon, num_steps=steps, lbd=lbd, confidence_mask=mask)
        result["loss"].backward()
        norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
        model.zero_grad(set_to_none=True)
        for key, value in (("loss", result["loss"]), ("low", result["low"]), ("grad_norm", norm)):
            out[key].append(value.item())
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/golden/catrs_golden.py PATH_TO_CHECKOUT  (a checkout of "
              "github.com/alinlab/smoothing-catrs)", file=sys.stderr)
        return 2
    checkout = Path(argv[0]).resolve()
    for name in CASES:
        theirs, ours = authors_values(checkout, name), our_values(name)
        print(f"{name}: K per chunk {theirs['k']}")
        for key in ("loss", "low", "grad_norm"):
            gap = max(abs(a - b) for a, b in zip(theirs[key], ours[key]))
            print(f"  {key:9s} theirs {[f'{v:.12f}' for v in theirs[key]]}")
            print(f"  {'':9s} ours   {[f'{v:.12f}' for v in ours[key]]}  max |diff| {gap:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
