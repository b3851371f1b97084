"""What a dataset run certifies: a model (a smoothcert checkpoint or any pixel-space module),
possibly behind a denoiser, and examples (any map-style dataset of (x, y)), each with the
identity that goes into the records.

:class:`ModelSource` carries the model, its meta (empty for a plain module), the number of
classes and a fingerprint (the checkpoint file's sha256, or ``state_dict:<sha256>`` of a module's
tensors) that makes a resumed run refuse another model. With a denoiser (Salman et al. 2020;
Carlini et al. 2023) the model smoothed is ``Denoised(denoiser, classifier)``; the classifier and
the denoiser keep separate fingerprints, so a resumed run refuses another of either.
:class:`Examples` adapts a dataset to
what the runner reads: validated ``(x (C, H, W) float, label int)`` per index, a name and split for
the run identity, and :meth:`Examples.stream`, which decodes ahead through a
:class:`torch.utils.data.DataLoader` with worker processes when asked.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..denoisers import Denoised, DenoiserSource, load_denoiser
from ..denoisers.loading import state_dict_sha256
from ..errors import SmoothcertError, check_count, check_positive_finite, printable
from ..io import file_sha256
from ..models.checkpoint import checkpoint_file, checkpoint_role, model_from_checkpoint
from ..models.ensemble import Ensemble, fingerprint_sha256
from ..noise.base import NOISES
from ..smoothing.engine import BatchedVotes
from ..smoothing.smoothed import plain
from ..tensors import model_device
from .tasks import checked_dense_label, examples_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSource:
    """A base classifier (pixels in [0, 1] → logits) ready to certify.

    With a ``denoiser``, ``model`` is ``Denoised(denoiser.module, classifier)``: the function
    the run smooths (and accelerates: precision, channels-last and compile apply to both);
    ``meta``, ``num_classes``, ``sha256`` and ``label`` stay the classifier's.
    """

    model: nn.Module
    meta: dict  # the checkpoint's meta; {} for a module given directly
    num_classes: int
    sha256: str  # the run identity's "checkpoint_sha256": the classifier's
    label: str  # what the manifest names as the model
    device: torch.device
    denoiser: DenoiserSource | None = None  # in front of the classifier, when there is one
    ensemble: dict | None = None  # an Ensemble's members, mode and K (Ensemble.fingerprint)

    @property
    def classifier(self) -> nn.Module:
        """The classifier alone (``model`` without its denoiser)."""
        return self.model.classifier if self.denoiser is not None else self.model


def split_denoised(model, denoiser=None):
    """(classifier, denoiser spec): a :class:`~smoothcert.denoisers.Denoised` module is taken
    apart, so that its classifier and its denoiser are fingerprinted separately, as when they
    come as ``model`` and ``denoiser``; anything else is returned as it is."""
    if not isinstance(model, Denoised):
        return model, denoiser
    if denoiser is not None:
        raise SmoothcertError("the model is a Denoised module, which holds its denoiser "
                              "already; pass denoiser=None (or the classifier alone)")
    return model.classifier, model.denoiser


def load_source(model, device=None, num_classes: int | None = None) -> ModelSource:
    """A smoothcert classifier checkpoint path (loaded on ``device``, default CPU) or an
    ``nn.Module`` (moved to ``device`` only when one is given; else it stays where it is). A
    checkpoint of another role (a denoiser) is refused: it goes behind a classifier, as the
    ``denoiser``."""
    if isinstance(model, (list, tuple)):  # several checkpoints: one ensemble of them
        model = Ensemble.from_checkpoints(model, device=device or "cpu")
    if isinstance(model, Ensemble):
        return _ensemble_source(model, device, num_classes)
    if isinstance(model, (str, os.PathLike)):
        model = checkpoint_file(model)  # a train run folder names its checkpoint.pt
        module, meta = model_from_checkpoint(model, device=device or "cpu")
        check_classifier(model, meta)
        sha, label = file_sha256(model), str(model)
    elif isinstance(model, nn.Module):
        module, meta = (model.to(device) if device is not None else model), {}
        sha, label = state_dict_sha256(model), f"<{type(model).__name__} module>"
    else:
        raise SmoothcertError("model must be a smoothcert checkpoint path or a torch nn.Module, "
                              f"got {type(model).__name__}")
    classes = meta.get("num_classes", num_classes or getattr(module, "num_classes", None))
    if classes is None:
        raise SmoothcertError("pass num_classes: the module has no num_classes attribute")
    return ModelSource(module, meta, check_count("num_classes", int(classes), minimum=2), sha,
                       label, model_device(module))


def _ensemble_source(model: Ensemble, device, num_classes: int | None) -> ModelSource:
    """An :class:`Ensemble` as one base classifier: its fingerprint holds every member's (their
    files' SHA-256, or their state dicts'), the mode and K; its meta is the first checkpoint's."""
    module = model.to(device) if device is not None else model
    members = model.member_sha256 or tuple(state_dict_sha256(m) for m in model.members)
    fingerprint = model.fingerprint(members)
    classes = model.meta.get("num_classes", num_classes or getattr(model, "num_classes", None))
    if classes is None:
        raise SmoothcertError("pass num_classes: the ensemble's members have no num_classes")
    label = f"ensemble of {len(members)} ({model.mode}" + (
        f", consensus {model.consensus})" if model.consensus is not None else ")")
    return ModelSource(module, model.meta, check_count("num_classes", int(classes), minimum=2),
                       fingerprint_sha256(fingerprint), label, model_device(module),
                       ensemble=fingerprint)


def check_classifier(path, meta: dict) -> None:
    """A checkpoint given as the model must hold a classifier (a denoiser goes behind one)."""
    role = checkpoint_role(meta)
    if role != "classifier":
        what = "a diffusion model" if role == "diffusion" else f"a {role}"
        raise SmoothcertError(f"{path} is {what}; pass it with --denoiser (Python: denoiser=) "
                              "and give the classifier as the model")


def with_denoiser(source: ModelSource, spec, sigma: float, noise: str | None = None
                  ) -> ModelSource:
    """``source`` behind the denoiser ``spec`` (a denoiser checkpoint path or train run folder,
    ``"diffusers:FOLDER"`` or an ``nn.Module``; None: ``source`` itself), loaded for noise level
    ``sigma`` (a diffusion denoiser's t* depends on it) on the classifier's device. A diffusion
    denoiser built for another σ, and a denoiser whose output channels the classifier does not
    take, are refused. A denoiser trained at another σ or on another noise than the run's
    (``noise``; None: not compared) is noted in one line, as a classifier is."""
    if spec is None:
        return source
    denoiser = load_denoiser(spec, sigma, device=source.device)
    trained = denoiser.trained_noise or {}
    _note_other_sigma(source, trained, sigma, noise or trained.get("name", "gaussian"),
                      whose=f"the denoiser {denoiser.label}", noise_alone=True)
    built_for = getattr(denoiser.module, "sigma", None) if denoiser.timestep is not None \
        else None
    if built_for is not None and not math.isclose(float(built_for), sigma, rel_tol=1e-9):
        raise SmoothcertError(
            f"the diffusion denoiser was built for sigma {built_for} (t* = {denoiser.timestep}) "
            f"but the run's sigma is {sigma}; build it for the run's sigma "
            f"(DiffusionDenoiser.from_pretrained(path, sigma={sigma}))")
    model = Denoised(denoiser.module, source.model)  # refuses channels that do not fit
    return dataclasses.replace(source, model=model, denoiser=denoiser)


def denoiser_fields(source: ModelSource) -> dict:
    """The run identity's ``denoiser`` and ``timestep`` of ``source``'s denoiser."""
    if source.denoiser is None:
        return {}
    return {"denoiser": source.denoiser.sha256, "timestep": source.denoiser.timestep}


def sigma_and_noise(sigma, noise: str | None, source: ModelSource,
                    denoised: bool = False) -> tuple[float, str]:
    """σ as a float and the noise's name, from the arguments or the checkpoint's metadata.

    A σ other than the one the checkpoint was trained at is allowed (e.g. a σ sweep of one
    model) but noted in one line on stderr (a logging warning): a mistyped ``--sigma`` would
    otherwise pass silently. Not for a checkpoint trained without noise, and not behind
    a denoiser (``denoised``), where the classifier is not meant to see the noise. Ensemble
    members of other σ or noise need them given (``Ensemble.training_noise``); noted per member."""
    meta = source.meta
    stored = meta.get("noise") or {}
    if isinstance(sigma, tuple(NOISES.values())):
        name = type(sigma).name  # with its parameters: general-gaussian:k=380
        if noise is not None and noise != name:
            raise SmoothcertError(f"noise {noise!r} disagrees with the noise object {sigma!r}")
        sigma, noise = sigma.scalar_sigma(), name
    members = getattr(source.classifier, "training_noise", None)  # an ensemble's members
    stored, members_note = members(sigma, noise) if members else (stored, None)
    if sigma is None:
        if meta and not stored:  # e.g. train --method standard: the classifier saw no noise
            raise SmoothcertError(f"the checkpoint {source.label} was trained without noise; "
                                  "pass --sigma")
        if "sigma" not in stored:
            raise SmoothcertError("pass sigma: a module carries no noise level")
        sigma = float(stored["sigma"])
    noise = noise if noise is not None else stored.get("name", "gaussian")
    sigma = check_positive_finite("sigma", plain(sigma))
    NOISES[noise].check_sigma(sigma)  # e.g. the discrete Gaussian's bound, before any note
    if members_note is not None and not denoised:  # no member's noise stands for the rest
        log.warning("note: certifying with %s noise at sigma %s; %s", noise, sigma, members_note)
    elif not denoised:
        _note_other_sigma(source, stored, sigma, noise)
    return sigma, noise


def _note_other_sigma(source: ModelSource, stored: dict, sigma: float, noise: str, *,
                      whose: str | None = None, noise_alone: bool = False) -> None:
    """One line when the run's σ differs from the training σ in ``stored`` (a meta's
    ``noise``) of ``whose`` (default: ``source``'s checkpoint), naming the noise too where it
    differs. With ``noise_alone`` (a denoiser, trained to remove one noise) another noise is
    noted at the same σ too, and against a noise stored without σ (a diffusion model)."""
    trained, trained_noise = stored.get("sigma"), stored.get("name", "gaussian")
    known = isinstance(trained, numbers.Real) and not isinstance(trained, bool)
    same = not known or math.isclose(float(trained), sigma, rel_tol=1e-12)
    if (not known and not (noise_alone and "name" in stored)) or \
            (same and (not noise_alone or noise == trained_noise)):
        return  # nothing recorded, or (a classifier) a comparison of noises at its σ
    what = f"{noise} noise at sigma {sigma}" if noise != trained_noise else f"sigma {sigma}"
    log.warning("note: certifying with %s; %s was trained with %s noise%s", what,
                whose or f"the checkpoint {source.label}", trained_noise,
                f" at sigma {float(trained)}" if known else "")


def check_denoiser(source: ModelSource, denoiser: str | None, timestep: int | None) -> None:
    """The denoiser of ``source`` is the one a run's configuration names (its fingerprint
    ``denoiser`` and timestep ``timestep``; None: no denoiser)."""
    den = source.denoiser
    given = (den.sha256, den.timestep) if den is not None else (None, None)
    if given != (denoiser, timestep):
        raise SmoothcertError(
            f"the run's configuration names denoiser {denoiser} (timestep {timestep}), the "
            f"model has {given[0]} (timestep {given[1]}); pass the configuration's denoiser")


def check_source(source: ModelSource, cfg) -> None:
    """The model is the one a run's configuration (a ``RunConfig``) describes: its denoiser,
    its ensemble, and its device (CPU and CUDA generators draw other noise, so a record must
    name the device that drew it)."""
    check_denoiser(source, cfg.denoiser, cfg.timestep)
    if cfg.ensemble != source.ensemble:
        raise SmoothcertError(f"the run's ensemble is {cfg.ensemble} but the model's is "
                              f"{source.ensemble}")
    if cfg.device_type != source.device.type:
        raise SmoothcertError(f"the run's device_type is {cfg.device_type!r} but the model is on "
                              f"{source.device.type!r}: the record would misstate its draws")


def check_compatible(source: ModelSource, data: Examples) -> None:
    """The model's classes and input shape against the dataset's, where both are known. Behind
    a denoiser the data must fit the denoiser's input; the classifier then needs only the same
    channels (its height and width may differ: ``Denoised`` resizes to them)."""
    meta = source.meta
    if data.num_classes is not None and source.num_classes != data.num_classes:
        raise SmoothcertError(
            f"num_classes mismatch: the model has {source.num_classes} classes, "
            f"dataset {data.name!r} has {data.num_classes}"
        )
    shape = meta.get("input_shape") or getattr(source.classifier, "input_shape", None)
    if source.denoiser is not None:
        _check_denoiser_shape(source, shape, data)
    elif shape is not None and data.input_shape is not None and \
            tuple(shape) != tuple(data.input_shape):
        raise SmoothcertError(
            f"the model expects inputs of shape {tuple(shape)}, "
            f"dataset {data.name!r} has {tuple(data.input_shape)}"
        )
    classes = meta.get("classes")
    if classes is not None and data.classes is not None and list(classes) != list(data.classes):
        differ = sorted(set(classes) ^ set(data.classes))[:5]
        detail = f"names only in one: {', '.join(differ)}" if differ else "same names, other order"
        raise SmoothcertError(
            f"the checkpoint's {len(classes)} classes differ from the {len(data.classes)} "
            f"classes of {data.name!r} ({printable(detail)}); certify on the data the model "
            "was trained on"
        )


def _check_denoiser_shape(source: ModelSource, classifier_shape, data: Examples) -> None:
    """The data against the denoiser's input shape, the classifier's channels against the
    data's (the denoiser keeps the channels), where they are known."""
    given = tuple(data.input_shape) if data.input_shape is not None else None
    wanted = source.denoiser.input_shape
    if wanted is not None and given is not None and tuple(wanted) != given:
        raise SmoothcertError(
            f"the denoiser expects inputs of shape {tuple(wanted)}, dataset {data.name!r} has "
            f"{given}; denoise data of its size (image folders: --image-size)")
    if classifier_shape is not None and given is not None and classifier_shape[0] != given[0]:
        raise SmoothcertError(
            f"the classifier takes {classifier_shape[0]}-channel inputs "
            f"{tuple(classifier_shape)}, dataset {data.name!r} has {given[0]} channels {given}")


class Examples:
    """A map-style dataset of (x, y) seen as the runner needs it.

    ``x`` must be a floating-point tensor (C, H, W) of pixels in [0, 1], ``y`` an int (or a
    0-d integer tensor). ``name`` and ``split`` go into the run identity: the dataset's own
    ``name``/``split`` attributes (smoothcert datasets have them), else the class name and
    "test". ``num_classes``, ``input_shape`` and ``classes`` are the dataset's when it states
    them (``None`` otherwise).
    """

    def __init__(self, dataset, name: str | None = None, split: str | None = None):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise SmoothcertError("dataset must be a map-style dataset (with __getitem__ and "
                                  f"__len__) of (x, y), got {type(dataset).__name__}")
        self.dataset = dataset
        self.name = name or getattr(dataset, "name", None) or type(dataset).__name__
        self.split = split or getattr(dataset, "split", None) or "test"
        self.num_classes = getattr(dataset, "num_classes", None)
        self.input_shape = getattr(dataset, "input_shape", None)
        self.classes = getattr(dataset, "classes", None)
        self.task, self.ignore_index = examples_task(dataset)  # labels: see runs/tasks.py

    def __len__(self) -> int:
        return len(self.dataset)

    def example(self, idx: int, num_classes: int | None = None) -> tuple[torch.Tensor, int]:
        """Example ``idx`` validated: (x float (C, H, W), label int, in [0, num_classes) when
        ``num_classes`` is given)."""
        item = self.dataset.example(idx) if hasattr(self.dataset, "example") \
            else self.dataset[idx]
        if self.task == "classification":
            return _checked(item, idx, self.name, num_classes)
        x = _checked_x(item, idx, self.name)
        return x, checked_dense_label(item[1], f"{self.name}[{idx}]", self.task, num_classes,
                                      self.ignore_index, x.shape)

    def stream(self, indices: Sequence[int], workers: int | None = None,
               num_classes: int | None = None) -> Iterator[tuple[int, torch.Tensor, int]]:
        """(idx, x, label) for ``indices`` in order, read lazily; with ``workers`` > 0 worker
        processes decode ahead (``None``: :func:`default_workers`). A label outside
        [0, ``num_classes``) stops the stream at its example (before its row is written)."""
        workers = default_workers(self.dataset) if workers is None else workers
        check_count("workers", workers, minimum=0)
        if workers == 0 or not indices:
            return ((idx, *self.example(idx, num_classes)) for idx in indices)
        return self._loaded(list(indices), workers, num_classes)

    def known_labels(self) -> Sequence | None:
        """Every label, read without decoding an image, where the dataset allows it: the
        items of a list of pairs, a ``TensorDataset``'s second tensor, or the ``labels`` or
        ``targets`` of smoothcert's and torchvision's datasets (unless a ``target_transform``
        changes them, or they hold other things than integers); else None, and each label is
        checked when its example is read."""
        data = self.dataset
        if self.task != "classification":  # masks and targets: checked as they are read
            return None
        if isinstance(data, (list, tuple)):
            pairs = all(isinstance(item, (tuple, list)) and len(item) >= 2 for item in data)
            return [item[1] for item in data] if pairs else None
        if isinstance(data, torch.utils.data.TensorDataset) and len(data.tensors) >= 2:
            return _listed(data.tensors[1])
        if getattr(data, "target_transform", None) is not None:
            return None
        for name in ("labels", "targets"):
            labels = getattr(data, name, None)
            if labels is not None and not callable(labels) and len(labels) == len(data):
                labels = _listed(labels)
                return labels if all(_is_label(y) for y in labels) else None
        return None

    def _loaded(self, indices: list[int], workers: int, num_classes: int | None):
        loader = torch.utils.data.DataLoader(
            _Picked(self, indices, num_classes), batch_size=None, num_workers=workers)
        try:
            for idx, (x, label) in zip(indices, loader, strict=True):
                yield idx, x, label
        except SmoothcertError as err:  # re-raised from a worker with its traceback
            raise SmoothcertError(_last_line(str(err))) from None


class _Picked(torch.utils.data.Dataset):
    """The examples at ``indices``, in order, validated in the worker that decodes them."""

    def __init__(self, examples: Examples, indices: list[int], num_classes: int | None):
        self.examples, self.indices, self.num_classes = examples, indices, num_classes

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.examples.example(self.indices[i], self.num_classes)


def default_workers(dataset) -> int:
    """Decoding workers: none for data already in memory, else one per core but one (at most 8),
    so that decoding keeps ahead of the model without starving it."""
    if not getattr(dataset, "streamed", False) and not hasattr(dataset, "samples"):
        return 0
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def check_labels(data: Examples, indices: Sequence[int], num_classes: int) -> None:
    """Every label of ``indices`` an integer in [0, num_classes), where the labels can be read
    without the images (:meth:`Examples.known_labels`); the others are checked as they are
    read. Run before a record file is opened: a row of label −1 or 42 (of 10 classes) would
    make the file unreadable, or count as a wrong prediction."""
    labels = data.known_labels()
    if labels is None:
        return
    for idx in indices:
        _checked_label(labels[idx], idx, data.name, num_classes)


def _checked(item, idx: int, name: str, num_classes: int | None = None
             ) -> tuple[torch.Tensor, int]:
    return _checked_x(item, idx, name), _checked_label(item[1], idx, name, num_classes)


def _checked_x(item, idx: int, name: str) -> torch.Tensor:
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise SmoothcertError(f"{name}[{idx}] is not an (x, y) pair")
    x = item[0]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3:
        raise SmoothcertError(
            f"{name}[{idx}] x must be a float tensor (C, H, W) of pixels in [0, 1] (e.g. from "
            f"transforms.ToTensor()), got {_describe(x)}")
    return x


def _checked_label(y, idx: int, name: str, num_classes: int | None) -> int:
    """y as an int class label (an int, a numpy integer or a 0-d integer tensor, not a
    bool), in [0, num_classes) when that is given."""
    if isinstance(y, torch.Tensor):
        y = y.item() if y.numel() == 1 and not y.is_floating_point() else y
    if not _is_label(y):
        raise SmoothcertError(f"{name}[{idx}] y must be an integer class label, got {y!r}")
    if num_classes is not None and not 0 <= y < num_classes:
        raise SmoothcertError(f"{name}[{idx}] has label {int(y)}, outside the model's "
                              f"{num_classes} classes 0..{num_classes - 1}")
    return int(y)


def checked_shard(shard) -> tuple[int, int]:
    """(index, count) of ``shard``, with 0 <= index < count (numpy integers are integers)."""
    pair = isinstance(shard, (tuple, list)) and len(shard) == 2
    index, count = map(plain, shard) if pair else (-1, -1)
    if type(count) is not int or type(index) is not int or count < 1 or not 0 <= index < count:
        raise SmoothcertError(f"shard must be (index, count) with 0 <= index < count, got {shard}")
    return index, count


def checked_indices(indices) -> tuple[int, ...]:
    """An explicit index list: non-empty, integers >= 0, none repeated."""
    values = tuple(indices) if isinstance(indices, Iterable) else ()  # 3: not a list
    if not values or not all(type(i) is int and i >= 0 for i in values):
        raise SmoothcertError("indices must be a non-empty list of integers >= 0")
    if len(set(values)) != len(values):
        raise SmoothcertError("indices must not repeat an index")
    return values


def _is_label(y) -> bool:
    return isinstance(y, numbers.Integral) and not isinstance(y, bool)


def _listed(labels) -> Sequence:
    """A tensor or array of labels as a list of Python numbers (one conversion, not one
    indexing per example)."""
    return labels.tolist() if hasattr(labels, "tolist") else labels


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def _last_line(message: str) -> str:
    """The original message of an error re-raised by a DataLoader worker (its last line)."""
    last = [line for line in message.strip().splitlines() if line.strip()][-1]
    return last.split("SmoothcertError: ", 1)[-1].strip()


def as_examples(dataset, name: str | None = None, split: str | None = None) -> Examples:
    return dataset if isinstance(dataset, Examples) else Examples(dataset, name, split)


__all__ = ["Examples", "ModelSource", "as_examples", "check_classifier", "check_compatible",
           "check_denoiser", "check_labels", "check_source", "checked_indices", "checked_shard",
           "default_workers", "denoiser_fields", "file_sha256", "load_source", "sigma_and_noise",
           "split_denoised", "state_dict_sha256", "with_denoiser"]


def resolved_engine(given: dict) -> dict:
    """The engine settings that differ from the defaults, checked by building an engine."""
    defaults = BatchedVotes().settings()
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise SmoothcertError(f"unknown engine setting {', '.join(unknown)}; "
                              f"valid: {', '.join(defaults)}")
    settings = {key: _engine_typed(key, value, defaults[key]) for key, value in given.items()}
    BatchedVotes(**settings)
    return {key: value for key, value in settings.items() if value != defaults[key]}


def _engine_typed(key: str, value, default):
    """``value`` as the type of the engine setting's ``default`` (an int is accepted for a
    float). The engine's settings are not a plug-in's options: they have no options dataclass."""
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if default is not None and not isinstance(value, kind):
        raise SmoothcertError(f"engine setting {key} must be of type {kind.__name__}, got "
                              f"{value!r}")
    return value
