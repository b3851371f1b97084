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
λ or the easy_focus attack as they were at the end of training, on the run's own training split
(:func:`training_split`: the ``train_size`` subset where the run had one).

``split="train"`` of the checkpoint's own dataset measures that training split too, so row
``idx`` is the example's position in it (the index the trainer gave the loss). A method with
``needs_indices`` (CAT-RS with its teacher: ŷ is a table with one row per training example) gets
``idx=`` in its loss: the example's row of its saved table on the run's training split; on any
other split (or without a saved table) its epoch hook builds the per-example state over the
measured examples instead (CAT-RS: the teacher's votes at them; the teacher file must exist).

Grad-norm files keep the per-example results (:data:`GRAD_NORM_COLUMNS`: idx, label, p_hat,
grad_norm) with a manifest ``FILE.manifest.json`` holding the settings that produced them
(:func:`grad_norms_identity`); :func:`grad_norm_file` reads such a file back instead of
computing it again, and :func:`easy_hard_comparison` turns several (one per training method)
into Sun et al.'s Table 1: easy and hard counts and mean norms, easy/hard, and the ACR.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import SmoothcertError, check_count
from ..io import atomic_write, format_row, write_json_atomic
from ..rng import derived_seed, example_generator
from ..smoothing.engine import BatchedVotes
from ..tensors import eval_mode, model_device


@dataclass(frozen=True)
class GradNorms:
    """Per example (aligned with ``idx``): its label, p̂_A of the label from ``n`` draws and
    ‖∇_θ L‖₂. ``n`` is None for a grad-norm file read without its manifest."""

    idx: np.ndarray  # int64
    labels: np.ndarray  # int64
    p_hat: np.ndarray  # float64 in [0, 1]
    norms: np.ndarray  # float64 ≥ 0
    n: int | None


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
                       generator=None, index: int | None = None) -> float:
    """‖∇_θ method.loss(model, x[None], [label])["loss"]‖₂ over the trainable parameters,
    with the model in eval mode (restored afterwards). x is one input (C, H, W); ``index`` is
    its row in the method's per-example state, passed as ``idx=`` to a method that
    ``needs_indices`` (required there)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SmoothcertError("the model has no trainable parameters; no gradient to measure")
    y = torch.tensor([label], device=x.device)
    extra = {}
    if getattr(method, "needs_indices", False):
        if index is None:
            raise SmoothcertError(f"{type(method).__name__}'s loss looks up each example by its "
                                  "training-set index: pass index=")
        extra["idx"] = torch.tensor([index], device=x.device)
    with eval_mode(model), torch.enable_grad():
        loss = method.loss(model, x[None], y, noise, generator, **extra)["loss"]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads if g is not None)))


def gradient_norms(model: nn.Module, method, noise, inputs: torch.Tensor, labels, *, n: int,
                   num_classes: int, batch_size: int = 1000, seed: int = 0, idx=None,
                   rows=None, progress=None) -> GradNorms:
    """p̂_A and the loss-gradient norm of each example (``inputs`` (N, C, H, W) in [0, 1],
    ``labels`` (N,)); ``idx`` (default 0..N−1) names the examples for their generators;
    ``rows`` (default ``idx``) are their rows in the method's per-example state, the ``idx=``
    of a method that ``needs_indices``."""
    check_count("n", n)
    device = model_device(model)
    idx = np.arange(len(inputs)) if idx is None else np.asarray(idx, dtype=np.int64)
    rows = idx if rows is None else np.asarray(rows, dtype=np.int64)
    ys, p_hat, norms = np.empty(len(idx), dtype=np.int64), np.empty(len(idx)), np.empty(len(idx))
    for i, (k, x, y) in enumerate(zip(idx, inputs, labels, strict=True)):
        gen = example_generator(seed, int(k), device)
        x, y = x.to(device), int(y)
        ys[i] = y
        p_hat[i] = label_frequency(model, x, y, noise, n, num_classes, batch_size, gen)
        norms[i] = loss_gradient_norm(model, method, x, y, noise, gen, int(rows[i]))
        if progress is not None:
            progress.update()
    return GradNorms(idx, ys, p_hat, norms, n)


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
    """A :class:`smoothcert.evaluation.tables.Table`: one row each for easy, hard and easy/hard."""
    from .tables import Table

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
                              *, device, seed: int = 0, data_root=None, examples=None):
    """``build_method(name, **params)`` in its state of the checkpoint's last training epoch.

    When the checkpoint was trained with ``name``, its hyperparameters are the defaults (``params``
    override them) and its saved method state is restored. Then ``on_epoch_start`` runs for the
    last epoch, with the run's training split (:func:`training_split`) as the epoch's data (e.g.
    easy_focus's reweighing draws from it) and a generator seeded from (seed, 0, 1).

    ``examples`` (a dataset of the measured examples), for a method that ``needs_indices``:
    its saved per-example state does not cover them (another split), so it is not restored and
    the epoch hook builds the state over ``examples`` instead; their rows are then 0 … N−1.
    """
    from ..methods import EpochContext, build_method

    meta, state = checkpoint.meta, checkpoint.train_state or {}
    same = meta.get("method", {}).get("name") == name
    method = build_method(name, **_method_hparams(name, params, meta))
    rebuild = examples is not None and method.needs_indices
    if same and "method" in state and not rebuild:
        method.load_state_dict(state["method"])
    epochs = int(meta.get("epoch", 0))
    generator = torch.Generator(device=device).manual_seed(derived_seed(seed, 0, 1))
    data = examples if rebuild else training_split(meta, data_root)
    total = int(meta.get("config", {}).get("epochs", epochs) or epochs)
    method.on_epoch_start(max(epochs - 1, 0), EpochContext(
        num_epochs=max(total, 1), model=model, train_data=data.to(device), noise=noise,
        generator=generator, device=torch.device(device)))
    return method


def training_split(meta: dict, data_root=None):
    """The examples the checkpoint's run trained on, in the trainer's order: its dataset's
    training split, or that split's class-balanced subset of the run's ``train_size``
    (:func:`smoothcert.data.datasets.balanced_subset`, which depends only on the labels)."""
    from ..data.datasets import balanced_subset, load_dataset

    config = meta.get("config") or {}
    data = load_dataset(meta["dataset"], "train", data_root=data_root,
                        image_size=config.get("image_size"))
    size = config.get("train_size")
    return data if size is None else data.subset(balanced_subset(data.labels, int(size)))


def _own_split(meta: dict, dataset: str | None, split: str) -> bool:
    """Whether ``split`` of ``dataset`` (default: the checkpoint's) is what the run trained on."""
    return split == "train" and (dataset or meta["dataset"]) == meta["dataset"]


def _method_hparams(name: str, params: dict, meta: dict) -> dict:
    """``params`` over the checkpoint's hyperparameters when it was trained with ``name``."""
    trained = meta.get("method", {})
    return {**(trained.get("hparams", {}) if trained.get("name") == name else {}), **params}


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

    from ..data.datasets import load_dataset
    from ..methods import METHODS
    from ..models.checkpoint import load_checkpoint, model_from_checkpoint
    from ..noise.gaussian import Gaussian
    from ..runs.records import global_indices

    check_count("n", n), check_count("batch", batch_size), check_count("seed", seed, 0)
    check_count("skip", skip)
    if max_count is not None:
        check_count("max", max_count)
    checkpoint = load_checkpoint(checkpoint_path, map_location=device)
    model, meta = model_from_checkpoint(checkpoint_path, device=device)
    noise = Gaussian(sigma if sigma is not None else float(meta["noise"]["sigma"]))
    own = _own_split(meta, dataset, split)
    data = (training_split(meta, data_root) if own
            else load_dataset(dataset or meta["dataset"], split, data_root=data_root))
    if data.num_classes != int(meta["num_classes"]):
        raise SmoothcertError(f"num_classes mismatch: the checkpoint has {meta['num_classes']} "
                              f"classes, dataset {data.name!r} has {data.num_classes}")
    if tuple(meta["input_shape"]) != tuple(data.input_shape):
        raise SmoothcertError(f"the checkpoint expects inputs of shape "
                              f"{tuple(meta['input_shape'])}, dataset {data.name!r} has "
                              f"{tuple(data.input_shape)}")
    idx = global_indices(len(data), skip, max_count)
    chosen = torch.tensor(idx, dtype=torch.long)
    x, y = data.batch(chosen)
    name = method or meta["method"]["name"]
    # a per-example state (CAT-RS's ŷ table) covers the run's training split when it was saved
    fresh = METHODS[name].needs_indices and not (
        own and meta.get("method", {}).get("name") == name
        and "method" in (checkpoint.train_state or {}))
    loss = method_at_end_of_training(name, params or {}, checkpoint, model, noise,
                                     device=device, seed=seed, data_root=data_root,
                                     examples=data.subset(chosen) if fresh else None)
    rows = range(len(idx)) if fresh else idx
    with tqdm(total=len(idx), disable=not progress, desc="grad-norms", unit="img") as bar:
        return gradient_norms(model, loss, noise, x, y, n=n, num_classes=data.num_classes,
                              batch_size=batch_size, seed=seed, idx=idx, rows=rows,
                              progress=bar)


# --------------------------------------------------------------------------- grad-norm files
GRAD_NORM_COLUMNS = ("idx", "label", "p_hat", "grad_norm")
"""A grad-norm file's header: one row per example of :class:`GradNorms` (``grad_norm`` is its
``norms``; ``idx`` indexes the split measured, which for ``split="train"`` of a run trained with
``train_size`` is that run's subset); ``n`` and the settings that produced the rows are in the
manifest beside it (with ``train_size`` in the identity in that case)."""


def grad_norms_identity(checkpoint_path, method: str | None = None, params: dict | None = None,
                        *, sigma: float | None = None, n: int = 100, dataset: str | None = None,
                        split: str = "train", skip: int = 1, max_count: int | None = None,
                        seed: int = 0, device="cpu") -> dict:
    """Everything that determines the rows of :func:`checkpoint_grad_norms` with these
    arguments, resolved against the checkpoint (its SHA-256; the method's name and completed
    hyperparameters, σ and dataset, the checkpoint's where not given), as JSON reads it back.
    ``batch_size`` is not part of it: p̂_A's draws come in fixed chunks whatever the batch.
    ``device_type`` is: CPU and CUDA generators draw different noise."""
    from ..io import file_sha256
    from ..methods import build_method
    from ..models.checkpoint import load_checkpoint

    meta = load_checkpoint(checkpoint_path, map_location="cpu").meta
    name = method or meta["method"]["name"]
    hparams = build_method(name, **_method_hparams(name, params or {}, meta)).hparams()
    identity = {
        "checkpoint_sha256": file_sha256(checkpoint_path), "method": name, "hparams": hparams,
        "sigma": float(sigma if sigma is not None else meta["noise"]["sigma"]),
        "n": n, "dataset": dataset or meta["dataset"], "split": split, "skip": skip,
        "max_count": max_count, "seed": seed, "device_type": torch.device(device).type,
    }
    train_size = (meta.get("config") or {}).get("train_size")
    if train_size is not None and _own_split(meta, dataset, split):  # rows: the run's subset
        identity["train_size"] = train_size
    return json.loads(json.dumps(identity))


def write_grad_norms(path, result: GradNorms, manifest: dict) -> None:
    """Write ``result`` as a grad-norm file: the manifest ``PATH.manifest.json`` (``manifest``
    plus ``columns`` and ``examples``, the row count), then the TSV, each atomically (a reader
    sees a complete file or none). Refuses a non-finite norm, which no reader would accept."""
    from ..runs.records import manifest_path

    bad = np.flatnonzero(~np.isfinite(result.norms))
    if bad.size:
        raise SmoothcertError(f"example idx {result.idx[bad[0]]} has loss-gradient norm "
                              f"{result.norms[bad[0]]} (the loss diverges there); nothing written")
    write_json_atomic(manifest_path(path), {**manifest, "columns": list(GRAD_NORM_COLUMNS),
                                            "examples": len(result.idx)})
    rows = zip(result.idx, result.labels, result.p_hat, result.norms, strict=True)
    with atomic_write(path) as f:
        f.write(format_row(GRAD_NORM_COLUMNS) + "".join(map(format_row, rows)))


def read_grad_norms(path) -> GradNorms:
    """A grad-norm file (ours, or hand-written with at least the columns
    :data:`GRAD_NORM_COLUMNS`), validated as a record file (idx unique, label an integer ≥ 0,
    p_hat in [0, 1], grad_norm finite ≥ 0). With a manifest, it must hold all the manifest's
    examples, and ``n`` is the manifest's; without one, ``n`` is None."""
    from ..runs.records import read_records

    if not Path(path).is_file():
        raise SmoothcertError(f"grad-norm file {path} does not exist; check the path")
    records = read_records(path)
    missing = [c for c in GRAD_NORM_COLUMNS if c not in records]
    if missing:
        raise SmoothcertError(f"{path} is not a grad-norm file: no column {', '.join(missing)} "
                              f"(it needs {' '.join(GRAD_NORM_COLUMNS)})")
    manifest = records.manifest or {}
    expected = manifest.get("examples", len(records))
    if len(records) != expected:
        raise SmoothcertError(f"{path} has {len(records)} rows, its manifest {expected}: the "
                              "file is incomplete or was edited; delete it and compute it again")
    return GradNorms(records["idx"].astype(np.int64), records["label"].astype(np.int64),
                     records["p_hat"].astype(np.float64), records["grad_norm"].astype(np.float64),
                     (manifest.get("identity") or {}).get("n"))


def grad_norm_file(out, checkpoint_path, method: str | None = None, params: dict | None = None,
                   *, batch_size: int = 1000, data_root=None, progress: bool = False,
                   **selection) -> GradNorms:
    """:func:`checkpoint_grad_norms` kept in the grad-norm file ``out``: computed and written
    (:func:`write_grad_norms`) when ``out`` does not exist; read back, without computing, when
    it exists with the same identity (:func:`grad_norms_identity` of ``selection``: sigma, n,
    dataset, split, skip, max_count, seed, device); refused when its identity differs."""
    from ..io import check_not_input
    from ..runs.records import manifest_path

    out = Path(out)
    check_not_input(out, [checkpoint_path], what="the checkpoint")
    check_not_input(manifest_path(out), [checkpoint_path], what="the checkpoint")
    identity = grad_norms_identity(checkpoint_path, method, params, **selection)
    if out.exists():
        return _reuse(out, identity)
    _check_writable(out)
    result = checkpoint_grad_norms(checkpoint_path, method, params, batch_size=batch_size,
                                   data_root=data_root, progress=progress, **selection)
    from ..upgrade import GRAD_NORMS_VERSION, VERSION_KEY

    write_grad_norms(out, result, {"kind": "grad-norms", VERSION_KEY: GRAD_NORMS_VERSION,
                                   "identity": identity, "checkpoint": str(checkpoint_path)})
    return result


def _reuse(out: Path, identity: dict) -> GradNorms:
    from ..runs.records import read_manifest

    if out.is_dir():
        raise SmoothcertError(f"output {out} is a directory; give a file name")
    old = read_manifest(out)
    if old is None:
        raise SmoothcertError(f"{out} exists but has no manifest; choose another --out")
    was = old.get("identity") or {}
    differ = sorted(k for k in set(was) | set(identity) if was.get(k) != identity.get(k))
    if differ:
        raise SmoothcertError(f"{out} was made with a different configuration (differs in: "
                              f"{', '.join(differ)}); use another --out or the original settings")
    return read_grad_norms(out)


def _check_writable(out: Path) -> None:
    """Before hours of computing: ``out``'s folder (created if missing) must take the file."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:
        raise SmoothcertError(f"cannot create the folder of {out}: a file is in the way") from err
    if not os.access(out.parent, os.W_OK):
        raise SmoothcertError(f"output folder {out.parent} is not writable; choose another --out")


# --------------------------------------------------------------------------- Sun et al.'s Table 1
def easy_hard_comparison(paths: Sequence, acr: Sequence | None = None):
    """Sun et al.'s Table 1 from grad-norm files: a :class:`smoothcert.evaluation.tables.Table`
    with one row
    per file — its name (:func:`~smoothcert.runs.records.distinct_labels`), its examples, the
    count and mean ‖∇_θ L‖₂ of easy and of hard examples (:func:`easy_hard`; p̂_A = ½ is in
    neither) and easy/hard — and with ``acr`` (one CERTIFY record file per grad-norm file, in
    the same order) the ACR of each
    (:func:`~smoothcert.evaluation.metrics.average_certified_radius`)."""
    from ..runs.records import distinct_labels
    from .tables import Table

    paths = list(paths)
    if not paths:
        raise SmoothcertError("easy-hard needs at least one grad-norm file")
    if acr is not None and len(acr) != len(paths):
        raise SmoothcertError(f"--acr takes one certify record file per grad-norm file, in the "
                              f"same order: got {len(acr)} for {len(paths)}")
    columns = [("name", "name", "text"), ("examples", "examples", "int"),
               ("easy", "easy", "int"), ("easy_grad_norm", "easy ‖∇θL‖", "float3"),
               ("hard", "hard", "int"), ("hard_grad_norm", "hard ‖∇θL‖", "float3"),
               ("easy_over_hard", "easy/hard", "float3")]  # (key, header, style)
    rows = []
    for name, path in zip(distinct_labels(paths), paths, strict=True):
        result = read_grad_norms(path)
        s = easy_hard(result)
        rows.append((name, len(result.idx), s.easy_count, s.easy_mean, s.hard_count,
                     s.hard_mean, s.ratio))
    if acr is not None:
        columns.append(("acr", "ACR", "float3"))
        rows = [(*row, _acr(file)) for row, file in zip(rows, acr, strict=True)]
    keys, headers, styles = zip(*columns, strict=True)
    return Table(keys=keys, headers=headers, styles=styles, rows=tuple(rows))


def _acr(path) -> float:
    """The ACR of a CERTIFY record file."""
    from ..runs.records import read_records
    from .metrics import average_certified_radius

    records = read_records(path)
    if "radius" not in records:
        raise SmoothcertError(f"{path} has no radius column; ACR needs a certify record file")
    return average_certified_radius(records)
