"""How much a training method weighs easy against hard examples (Sun, Mao, Müller & Vechev,
"Average Certified Radius is a Poor Metric for Randomized Smoothing", 2024, §4.3 and Table 1).

Sun et al. measure "the average gradient l2 norm of easy (p_A > 0.5) and hard (p_A < 0.5)
samples ... as a proxy for the sample weight. Intuitively, samples with larger gradients
contribute more to training": the per-example gradient of the training loss with respect to the
model's **parameters**, ‖∇_θ L(x, y)‖₂ (what one example adds to an SGD step). p_A is the
probability that a noisy copy of x is classified as its label y (their ``p_correct``).

For each example we

1. estimate p̂_A = (number of n noisy draws f(x + δ) = y) / n, batched over the draws;
2. evaluate the method's loss on the one-example batch (x, y) — ``build_method(M, **params)
   .loss(model, x[None], y[None], noise, generator)["loss"]``, so every method, with its own
   noise copies, attacks or regularisers, is measured the same way — and take the L2 norm of its
   gradient over all trainable parameters (float64 sum of squares);

then average the norms over easy (p̂_A > ½) and hard (p̂_A < ½) examples; p̂_A = ½ exactly
belongs to neither (counted apart). Randomness: example ``idx`` draws from a generator seeded
from (seed, idx), p̂_A first, then the loss.

The model is in **eval mode** while the loss is evaluated (BatchNorm uses its running
statistics): one example's gradient then does not depend on the others, and the checkpoint's
buffers are not updated. The method is put in its state of the last training epoch:
its saved state (e.g. heat's teacher, easy_focus's kept examples) is restored when the checkpoint
was trained with the same method, then ``on_epoch_start(last epoch)`` sets warm-up ε, deferred
λ or the easy_focus attack as they were at the end of training.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .errors import SmoothcertError, check_count
from .rng import derived_seed, example_generator
from .sampling import BatchedVotes
from .tensors import eval_mode, model_device


@dataclass(frozen=True)
class GradNorms:
    """Per example (aligned with ``idx``): p̂_A of the label from ``n`` draws and ‖∇_θ L‖₂."""

    idx: np.ndarray  # int64
    p_hat: np.ndarray  # float64 in [0, 1]
    norms: np.ndarray  # float64 ≥ 0
    n: int


@dataclass(frozen=True)
class EasyHard:
    """Mean gradient norm of easy (p̂_A > ½) and hard (p̂_A < ½) examples and their ratio
    (None where a group is empty); ``ties`` counts the examples with p̂_A = ½."""

    easy_count: int
    hard_count: int
    ties: int
    easy_mean: float | None
    hard_mean: float | None

    @property
    def ratio(self) -> float | None:
        if self.easy_mean is None or not self.hard_mean:
            return None
        return self.easy_mean / self.hard_mean


def label_frequency(model: nn.Module, x: torch.Tensor, label: int, noise, n: int,
                    num_classes: int, batch_size: int, generator=None) -> float:
    """p̂ = (number of n draws with argmax f(x + δ) = label) / n for one input x (C, H, W)."""
    with eval_mode(model):
        counts = BatchedVotes().votes(model, x, noise, n, num_classes, batch_size, generator)
    return int(counts[label]) / n


def loss_gradient_norm(model: nn.Module, method, x: torch.Tensor, label: int, noise,
                       generator=None) -> float:
    """‖∇_θ method.loss(model, x[None], [label])["loss"]‖₂ over the trainable parameters,
    with the model in eval mode (restored afterwards). x is one input (C, H, W)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SmoothcertError("the model has no trainable parameters; no gradient to measure")
    y = torch.tensor([label], device=x.device)
    with eval_mode(model), torch.enable_grad():
        loss = method.loss(model, x[None], y, noise, generator)["loss"]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads if g is not None)))


def gradient_norms(model: nn.Module, method, noise, inputs: torch.Tensor, labels, *, n: int,
                   num_classes: int, batch_size: int = 1000, seed: int = 0, idx=None,
                   progress=None) -> GradNorms:
    """p̂_A and the loss-gradient norm of each example (``inputs`` (N, C, H, W) in [0, 1],
    ``labels`` (N,)); ``idx`` (default 0..N−1) names the examples for their generators."""
    check_count("n", n)
    device = model_device(model)
    idx = np.arange(len(inputs)) if idx is None else np.asarray(idx, dtype=np.int64)
    p_hat, norms = np.empty(len(idx)), np.empty(len(idx))
    for i, (k, x, y) in enumerate(zip(idx, inputs, labels, strict=True)):
        gen = example_generator(seed, int(k), device)
        x, y = x.to(device), int(y)
        p_hat[i] = label_frequency(model, x, y, noise, n, num_classes, batch_size, gen)
        norms[i] = loss_gradient_norm(model, method, x, y, noise, gen)
        if progress is not None:
            progress.update()
    return GradNorms(idx, p_hat, norms, n)


def easy_hard(result: GradNorms) -> EasyHard:
    """Split :class:`GradNorms` at p̂_A = ½ and average the norms of each side."""
    easy, hard = result.p_hat > 0.5, result.p_hat < 0.5
    return EasyHard(
        easy_count=int(easy.sum()),
        hard_count=int(hard.sum()),
        ties=int((~easy & ~hard).sum()),
        easy_mean=float(result.norms[easy].mean()) if easy.any() else None,
        hard_mean=float(result.norms[hard].mean()) if hard.any() else None,
    )


def easy_hard_table(summary: EasyHard):
    """A :class:`smoothcert.report.Table`: one row each for easy, hard and easy/hard."""
    from .report import Table

    return Table(
        keys=("group", "p_hat", "count", "mean_grad_norm"),
        headers=("group", "p̂_A", "n", "mean ‖∇θ L‖₂"),
        styles=("text", "text", "int", "float3"),
        rows=(("easy", "> 0.5", summary.easy_count, summary.easy_mean),
              ("hard", "< 0.5", summary.hard_count, summary.hard_mean),
              ("easy/hard", None, None, summary.ratio)),
    )


# --------------------------------------------------------------------------- from a checkpoint
def method_at_end_of_training(name: str, params: dict, checkpoint, model: nn.Module, noise,
                              *, device, seed: int = 0, data_root=None):
    """``build_method(name, **params)`` in its state of the checkpoint's last training epoch.

    When the checkpoint was trained with ``name``, its hyperparameters are the defaults (``params``
    override them) and its saved method state is restored. Then ``on_epoch_start`` runs for the
    last epoch, with the training split as the epoch's data (e.g. easy_focus's reweighing draws
    from it) and a generator seeded from (seed, 0, 1).
    """
    from .data import load_dataset
    from .methods import EpochContext, build_method

    meta, state = checkpoint.meta, checkpoint.train_state or {}
    trained = meta.get("method", {})
    same = trained.get("name") == name
    method = build_method(name, **{**(trained.get("hparams", {}) if same else {}), **params})
    if same and "method" in state:
        method.load_state_dict(state["method"])
    epochs = int(meta.get("epoch", 0))
    generator = torch.Generator(device=device).manual_seed(derived_seed(seed, 0, 1))
    data = load_dataset(meta["dataset"], "train", data_root=data_root).to(device)
    total = int(meta.get("config", {}).get("epochs", epochs) or epochs)
    method.on_epoch_start(max(epochs - 1, 0), EpochContext(
        num_epochs=max(total, 1), model=model, train_data=data, noise=noise,
        generator=generator, device=torch.device(device)))
    return method


def checkpoint_grad_norms(checkpoint_path, method: str | None = None, params: dict | None = None,
                          *, sigma: float | None = None, n: int = 100, batch_size: int = 1000,
                          dataset: str | None = None, split: str = "train", skip: int = 1,
                          max_count: int | None = None, seed: int = 0, device="cpu",
                          data_root=None, progress: bool = False) -> GradNorms:
    """:func:`gradient_norms` of the examples ``skip``/``max_count`` select from a split, for a
    saved checkpoint: ``method`` (default: the checkpoint's own, with its hyperparameters)
    in its end-of-training state (:func:`method_at_end_of_training`), noise σ (default: the
    checkpoint's)."""
    from tqdm.auto import tqdm

    from .data import load_dataset
    from .models.checkpoint import load_checkpoint, model_from_checkpoint
    from .noise import Gaussian
    from .runs.records import global_indices

    check_count("n", n), check_count("batch", batch_size), check_count("seed", seed, 0)
    check_count("skip", skip)
    if max_count is not None:
        check_count("max", max_count)
    checkpoint = load_checkpoint(checkpoint_path, map_location=device)
    model, meta = model_from_checkpoint(checkpoint_path, device=device)
    noise = Gaussian(sigma if sigma is not None else float(meta["noise"]["sigma"]))
    data = load_dataset(dataset or meta["dataset"], split, data_root=data_root)
    if data.num_classes != int(meta["num_classes"]):
        raise SmoothcertError(f"num_classes mismatch: the checkpoint has {meta['num_classes']} "
                              f"classes, dataset {data.name!r} has {data.num_classes}")
    if tuple(meta["input_shape"]) != tuple(data.input_shape):
        raise SmoothcertError(f"the checkpoint expects inputs of shape "
                              f"{tuple(meta['input_shape'])}, dataset {data.name!r} has "
                              f"{tuple(data.input_shape)}")
    name = method or meta["method"]["name"]
    loss = method_at_end_of_training(name, params or {}, checkpoint, model, noise,
                                     device=device, seed=seed, data_root=data_root)
    idx = global_indices(len(data), skip, max_count)
    x, y = data.batch(torch.tensor(idx, dtype=torch.long))
    with tqdm(total=len(idx), disable=not progress, desc="grad-norms", unit="img") as bar:
        return gradient_norms(model, loss, noise, x, y, n=n, num_classes=data.num_classes,
                              batch_size=batch_size, seed=seed, idx=idx, progress=bar)
