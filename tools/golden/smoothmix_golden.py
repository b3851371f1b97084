"""Golden values of the SmoothMix loss, computed by the authors' own code.

Usage::

    git clone https://github.com/jh-jeong/smoothmix /tmp/smix_ref
    git -C /tmp/smix_ref checkout cb1fd33055a29d0c41bbc429a982fdec709e993c
    python tools/golden/smoothmix_golden.py /tmp/smix_ref              # GOLDEN
    python tools/golden/smoothmix_golden.py /tmp/smix_ref --batchnorm  # GOLDEN_BN

The argument is a checkout of jh-jeong/smoothmix (the folder holding ``code/train.py``); their
code is imported from there and nothing of it is copied here. alinlab/smoothing-catrs @ d4bc576
holds the same file as ``code/train_smoothmix.py`` (same blob): copy it to ``code/train.py``
there to use that checkout. The script runs one training step
of their ``train()`` (``code/train.py``, commit cb1fd33, blob d7aeea1b) per case on fixed small
inputs and prints what ``tests/methods/test_smoothmix.py`` hard-codes, ``GOLDEN``:

- ``loss``: the value of ``loss`` in ``train()`` (``losses.avg`` after one update);
- ``grad_norm``: ‖∇_θ loss‖₂ over all parameters, read by a stand-in optimizer whose ``step()``
  records the gradients and changes nothing;
- ``adv_distance`` / ``clean_distance``: ‖x̂ − x‖₂ and ‖x_s − x‖₂ per input, from their
  ``SmoothMix_PGD.attack`` on the same inputs and noises (the attack has no randomness).

With ``--batchnorm``, ``GOLDEN_BN``: the same cases on :func:`bn_inputs` (a BatchNorm1d after
the first layer, its running statistics set apart from any batch's, so that the eval-mode attack
and the train-mode losses normalise differently): ``loss`` and ``grad_norm`` as above, then the
BatchNorm's ``running_mean`` and ``running_var`` after their step (float32, 9 significant
digits) and ``num_batches_tracked`` (their step runs two train-mode forward passes, the m clean
copies together and the m mixed copies together: 2).

Inputs (:func:`inputs`, rebuilt identically by the test): the model
``Sequential(Flatten, Linear(64, 16), ReLU, Linear(16, 10))`` initialised after
``torch.manual_seed(0)`` with its last weight matrix multiplied by 8 (so that the predictions are
not near ties); x = ``torch.rand(6, 1, 8, 8)`` from a generator seeded 1; y = LABELS;
noise j = ``eps[j] * sigma`` with eps = ``torch.randn(m, 6, 1, 8, 8)`` from a generator seeded 2;
λ = u / 2 with u = ``torch.rand(6)`` from a generator seeded 3.

How the draws are injected: their ``train()`` draws noise j as ``torch.randn_like(inputs) *
noise_sd`` and u as ``torch.rand(batch_size)`` from torch's global generator; while it runs,
``torch.randn_like`` returns eps[0], eps[1], … and ``torch.rand`` returns u. The loaded batch is
passed as one chunk (``_chunk_minibatch`` is replaced: in their loop the trainer's batch is one
of the m chunks of a loaded batch). ``args.eta``, ``args.warmup_v`` and ``args.n_classes`` are set
as their ``main()`` sets them, and so is ``attacker.maxnorm_s = warmup_v * maxnorm_s`` (with
``maxnorm_s = alpha * mix_step`` when not given). ``tensorboardX`` is replaced by a stub when it is
not installed (only ``train_utils`` imports it, for a ``SummaryWriter`` we do not use).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import math
import sys
import types
from pathlib import Path

import torch
from torch import nn

TRAIN_PY_BLOB = "d7aeea1b70cbcf5fc006f001b0ade5a6bd7cf614"  # git hash of code/train.py @ cb1fd33
B, SHAPE, K = 6, (1, 8, 8), 10
LABELS = [1, 1, 1, 1, 7, 0]  # the first four are the model's prediction at x, the last two not

# name -> (m, T, α, η, mix_step, maxnorm, maxnorm_s, σ, warm-up factor w_e)
CASES = {
    "plain": dict(m=2, steps=3, alpha=0.5, eta=5.0, mix_step=0, maxnorm=None, maxnorm_s=None,
                  sigma=0.25, warmup=1.0),
    "one_step_warmup": dict(m=3, steps=4, alpha=0.5, eta=1.0, mix_step=1, maxnorm=None,
                            maxnorm_s=None, sigma=0.5, warmup=0.2),
    "maxnorm": dict(m=2, steps=4, alpha=1.0, eta=2.0, mix_step=2, maxnorm=1.5, maxnorm_s=0.3,
                    sigma=0.25, warmup=1.0),
}


def inputs(m: int):
    """(model, x, y, eps (m, B, 1, 8, 8), u (B,)) as described in the module docstring; noise j
    is ``eps[j] * sigma``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, K))
    with torch.no_grad():
        model[3].weight.mul_(8.0)
    x = torch.rand((B,) + SHAPE, generator=torch.Generator().manual_seed(1))
    eps = torch.randn((m, B) + SHAPE, generator=torch.Generator().manual_seed(2))
    u = torch.rand(B, generator=torch.Generator().manual_seed(3))
    return model, x, torch.tensor(LABELS), eps, u


def bn_inputs(m: int):
    """:func:`inputs` with the model ``Sequential(Flatten, Linear(64, 16), BatchNorm1d(16), ReLU,
    Linear(16, 10))`` (seed 0, last weight × 8), its running mean linspace(−0.5, 0.5, 16) and
    running variance linspace(0.5, 2.0, 16)."""
    _, x, y, eps, u = inputs(m)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(),
                          nn.Linear(16, K))
    with torch.no_grad():
        model[4].weight.mul_(8.0)
        model[2].running_mean.copy_(torch.linspace(-0.5, 0.5, 16))  # not any batch's statistics
        model[2].running_var.copy_(torch.linspace(0.5, 2.0, 16))
    return model, x, y, eps, u


def _git_blob_hash(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def load_authors_train(checkout: Path) -> types.ModuleType:
    """Their ``code/train.py`` as a module (it parses ``sys.argv`` at import)."""
    code = checkout / "code"
    if not (code / "train.py").is_file():
        sys.exit(f"{checkout} is not a checkout of jh-jeong/smoothmix: no code/train.py")
    if _git_blob_hash(code / "train.py") != TRAIN_PY_BLOB:
        print(f"warning: code/train.py is not the file of commit cb1fd33 ({TRAIN_PY_BLOB})",
              file=sys.stderr)
    try:
        importlib.import_module("tensorboardX")
    except ImportError:
        stub = types.ModuleType("tensorboardX")
        stub.SummaryWriter = object
        sys.modules["tensorboardX"] = stub
    sys.path.insert(0, str(code))
    sys.argv = ["train.py", "mnist", "lenet"]
    return importlib.import_module("train")


class _RecordingOptimizer:
    """Stands in for SGD: keeps the gradient norm of each ``step()``, updates nothing."""

    def __init__(self, model: nn.Module):
        self.model, self.grad_norms = model, []

    def zero_grad(self):
        self.model.zero_grad(set_to_none=True)

    def step(self):
        total = sum(float(p.grad.double().pow(2).sum()) for p in self.model.parameters())
        self.grad_norms.append(math.sqrt(total))


class _Writer:
    def add_scalar(self, *args, **kwargs):
        pass


@contextlib.contextmanager
def _injected(noise_eps: torch.Tensor, u: torch.Tensor):
    """``torch.randn_like`` yields noise_eps[0], [1], …; ``torch.rand(B)`` yields u."""
    real_randn_like, real_rand = torch.randn_like, torch.rand
    draws = iter(noise_eps)

    def randn_like(t, *args, **kwargs):
        eps = next(draws)
        assert eps.shape == t.shape
        return eps.clone()

    def rand(*size, **kwargs):
        assert tuple(size) == (B,), size
        return u.clone()

    torch.randn_like, torch.rand = randn_like, rand
    try:
        yield
    finally:
        torch.randn_like, torch.rand = real_randn_like, real_rand


def _attacker(mod, c: dict):
    attacker = mod.SmoothMix_PGD(steps=c["steps"], mix_step=c["mix_step"], alpha=c["alpha"],
                                 maxnorm=c["maxnorm"], maxnorm_s=c["maxnorm_s"])
    maxnorm_s = c["alpha"] * c["mix_step"] if c["maxnorm_s"] is None else c["maxnorm_s"]
    attacker.maxnorm_s = c["warmup"] * maxnorm_s  # as main() does at every epoch
    return attacker


def _train_step(mod, c: dict, model, x, y, eps, u) -> tuple[float, float]:
    """(loss, ‖∇_θ loss‖₂) of one step of their ``train()`` on one batch, the model updated in
    nothing but its BatchNorm statistics (the optimizer records, it does not step)."""
    mod.args.num_noise_vec, mod.args.eta, mod.args.warmup_v = c["m"], c["eta"], c["warmup"]
    mod.args.n_classes = K
    mod._chunk_minibatch = lambda batch, num_batches: iter([batch])
    optimizer = _RecordingOptimizer(model)
    with _injected(eps, u), contextlib.redirect_stdout(io.StringIO()):
        loss = mod.train([(x, y)], model, optimizer, 0, c["sigma"], _attacker(mod, c),
                         torch.device("cpu"), _Writer())
    return loss, optimizer.grad_norms[0]


def run_case(mod, c: dict) -> dict:
    """One step of their ``train()`` and one call of their attack on the fixed inputs."""
    model, x, y, eps, u = inputs(c["m"])
    loss, grad_norm = _train_step(mod, c, model, x, y, eps, u)
    model.eval()
    noises = [e * c["sigma"] for e in eps]  # as their train() scales torch.randn_like
    clean, adv = _attacker(mod, c).attack(model, x, y, noises=noises)
    return {
        "loss": loss,
        "grad_norm": grad_norm,
        "adv_distance": (adv - x).flatten(1).norm(dim=1).tolist(),
        "clean_distance": (clean - x).flatten(1).norm(dim=1).tolist(),
    }


def run_bn_case(mod, c: dict) -> dict:
    """One step of their ``train()`` on :func:`bn_inputs`, then the BatchNorm's statistics."""
    model, x, y, eps, u = bn_inputs(c["m"])
    loss, grad_norm = _train_step(mod, c, model, x, y, eps, u)
    bn = model[2]
    return {
        "loss": loss,
        "grad_norm": grad_norm,
        "running_mean": _float32s(bn.running_mean),
        "running_var": _float32s(bn.running_var),
        "num_batches_tracked": int(bn.num_batches_tracked),
    }


def _float32s(t: torch.Tensor) -> list[float]:
    return [float(f"{v:.9g}") for v in t.tolist()]  # 9 digits: exact for a float32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a checkout of jh-jeong/smoothmix")
    parser.add_argument("--batchnorm", action="store_true",
                        help="print GOLDEN_BN (the model with BatchNorm) instead of GOLDEN")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    mod = load_authors_train(checkout)
    name, run = ("GOLDEN_BN", run_bn_case) if args.batchnorm else ("GOLDEN", run_case)
    print(f"# torch {torch.__version__}; {checkout}/code/train.py")
    print(f"{name} = {{")
    for case_name, case in CASES.items():
        print(f"    {case_name!r}: {run(mod, case)!r},")
    print("}")


if __name__ == "__main__":
    main()
