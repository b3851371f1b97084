"""Import the checkpoints released with the reference implementations, normalization made explicit.

A reference checkpoint is a ``torch.save`` of a dict that holds the state dict of the model, but
not its input normalization: the reference ``NormalizeLayer`` keeps its means and stds as plain
tensor attributes, not buffers, so they never reach the file. What the model subtracted and
divided by is therefore read from the reference code and stated here, per format and dataset.
The import builds our ``Sequential(NormalizeLayer(mean, std), net)``, loads the file's weights
into ``net`` with ``strict=True`` and writes a smoothcert checkpoint whose meta and state dict
carry that mean and std, so that ``ours(x) == reference_net((x − mean) / std)`` for pixels x.

Layouts, read in the stored public copies of the repositories (paths inside each repository).
The code of cohen, salman, jeong and acr-weakness builds ImageNet's torchvision ``resnet50`` as
``DataParallel(resnet50())`` inside the ``Sequential``, so its keys are ``1.module.<torchvision
key>`` and the file's ``arch`` entry is ``"resnet50"``, our ``resnet50`` (``Sequential(
NormalizeLayer, torchvision resnet50)``; ``torchvision:resnet50`` is accepted as the same):

- ``cohen``, locuslab/smoothing: ``code/train.py`` saves ``{'epoch': epoch + 1, 'arch',
  'state_dict': model.state_dict(), 'optimizer'}`` where ``code/architectures.py`` builds
  ``Sequential(get_normalize_layer(dataset), net)``, so the keys are ``1.<net key>``; the ImageNet
  ResNet-50 is wrapped in ``DataParallel`` first (``1.module.<key>``), the CIFAR ResNets are not.
  ``code/datasets.py``: ``NormalizeLayer`` computes (x − means) / sds with CIFAR-10 mean (0.4914,
  0.4822, 0.4465), std (0.2023, 0.1994, 0.2010) and ImageNet mean (0.485, 0.456, 0.406), std
  (0.229, 0.224, 0.225); its only datasets are cifar10 and imagenet. ``code/archs/cifar_resnet.py``
  (bearpaw's CIFAR ResNet) has the attribute names of our ``cifar_resnet*``.
- ``salman``, Hadisalman/smoothing-adversarial: ``code/train_pgd.py`` saves the same dict from the
  same ``Sequential`` (ImageNet: ``DataParallel(resnet50)`` at every commit), but
  ``code/architectures.py`` as released (commit 3911bd8) uses ``get_input_center_layer`` for every
  dataset, ImageNet included: ``InputCenterLayer`` computes x − mean, no division (std 1), with
  the constants above; the default here is that ("center"). A later commit (cc80077, which adds
  the ImageNet32 pre-training) switched back to the standardizing layer and warns to certify with
  the layer used in training, and in the repository's issue #3 the author told a user whose
  released ImageNet model mispredicted to switch from the standardizing to the centering layer.
  The README (from commit b345ddc, "Download our pretrained models") maps the released folders:
  ``imagenet/`` and the other cifar10 models → ``InputCenterLayer``; ``imagenet32/``,
  ``cifar10/finetune_cifar_from_imagenetPGD2steps/`` and ``cifar10/self_training/`` →
  ``NormalizeLayer``. Neither layer has state, so the file cannot tell which one trained it: for
  those three folders and for models trained with the later code pass
  ``normalization="standardize"``, and check the clean accuracy after import.
- ``jeong``, jh-jeong/smoothing-consistency: ``code/train_utils.py`` (``prologue``) and
  ``code/train_consistency.py`` (like its ``train_cohen.py``, ``train_salman.py``, …) save the
  same dict from the same ``Sequential``, ImageNet's ResNet-50 in ``DataParallel``;
  ``code/datasets.py`` standardizes cifar10 and imagenet with the constants above (its
  ``train_salman.py`` too: it builds its models with this ``architectures.py``) and uses
  ``torch.nn.Identity()`` for mnist (no normalization: mean 0, std 1). ``code/archs/lenet.py``
  has the attribute names of our ``lenet`` (conv1, conv2, fc1, fc2); ``code/archs/cifar_resnet.py``
  (at commit a11954a) is the same file as Cohen et al.'s.
- ``acr-weakness``, eth-sri/acr-weakness (Sun et al., "Average Certified Radius is a Poor Metric
  for Randomized Smoothing"; our method ``easy_focus``): ``code/train.py`` saves ``{'epoch':
  epoch, 'arch', 'state_dict': model.state_dict(), 'optimizer'}`` (``epoch`` is the 0-based index
  of the last finished epoch there; its baseline scripts ``code/train_cohen.py``,
  ``train_consistency.py``, ``train_salman.py``, ``train_macer.py``, ``train_smoothmix.py``,
  ``train_catrs.py`` and ``train_stab.py`` save ``epoch + 1``, all in the same layout, so a file
  does not tell which script wrote it and the import records ``easy_focus``). The model comes from
  ``get_architecture`` of ``code/architectures.py``, called by ``prologue`` in
  ``code/train_utils.py``: Jeong & Shin's ``Sequential(get_normalize_layer(dataset), net)``, the
  ImageNet ResNet-50 in ``DataParallel``, the CIFAR ResNets and LeNet bare. ``code/datasets.py``
  standardizes cifar10 and imagenet with the constants above (cifar100 with its own, not a dataset
  of ours) and uses ``torch.nn.Identity()`` for mnist and fmnist (our fashion-mnist); its
  ``NormalizeLayer`` keeps the constants as plain attributes, as Cohen et al.'s does.
  ``code/archs/cifar_resnet.py`` and ``code/archs/lenet.py`` are the same files as Cohen et al.'s
  and Jeong & Shin's; its ``cifar_resnet50`` and ``cifar100_resnet110`` have no counterpart here.
  ``script/imagenet/train_*.sh`` and ``certify_*.sh`` train and certify ``imagenet resnet50``
  with ``code/train.py`` and ``code/certify.py`` (which rebuilds the model from the file's
  ``arch``). The released checkpoints (a mega.nz folder linked from ``README.md``) are not in the
  repository and were not opened: the layout is the one the code above writes, not checked on a
  released file.
- ``macer``, RuntianZ/macer: ``main.py`` saves ``{'net': base_model.state_dict(), 'epoch'}``, the
  bare network (the ``DataParallel`` wrapper is a different object), so the keys are the net's
  own; its transforms are ``ToTensor()`` only for mnist, cifar10 and svhn and ``rs/core.py`` adds
  noise to those pixels, so there is no normalization (mean 0, std 1). ``model.py``: ``resnet110``
  (``ResNet_Cifar``, basic blocks [18, 18, 18]) and ``LeNet`` have our attribute names; its
  ``AvgPool2d(8, stride=1)`` equals our ``AvgPool2d(8)`` on the final 8×8 maps. MACER's ImageNet
  checkpoints are not produced by that repository, so no ImageNet normalization is assumed.

- ``denoised-smoothing``, microsoft/denoised-smoothing (Salman et al., NeurIPS 2020, "Denoised
  Smoothing"): denoisers, not classifiers. ``code/train_denoiser.py`` saves ``{'epoch': epoch + 1,
  'arch', 'state_dict': denoiser.state_dict(), 'optimizer'}`` where ``code/architectures.py``
  builds ``cifar_dncnn`` (``DnCNN(image_channels=3, depth=17, n_channels=64)``),
  ``cifar_dncnn_wide`` (``n_channels=128``) and ``imagenet_dncnn`` (the 64-channel one inside
  ``DataParallel``: keys ``module.dncnn.N.*``), bare, without a normalization layer: the denoiser
  takes the noisy pixels in [0, 1] (``train_denoiser.py`` adds the noise to ``ToTensor()``
  images) and the classifier behind it normalizes. ``code/archs/dncnn.py`` is our ``dncnn``
  (keys ``dncnn.N.*``), so the import is the role-"denoiser" checkpoint of ``dncnn`` with the
  file's depth and width, no normalization (mean 0, std 1 recorded). The file does not say
  which objective trained it (``--objective denoising|stability``; the released folders name it,
  e.g. ``mse_obj``); the import records ``denoiser-mse``. Their MemNet denoisers (``memnet``,
  ``imagenet_memnet``) have no counterpart here and are refused.

In every format, a ``module.`` component (``DataParallel``) is dropped wherever it occurs in a
key (``module.1.…``, ``1.module.…``, ``module.…``). Files written before PyTorch 0.4.1 lack the
BatchNorm ``num_batches_tracked`` counters; they are filled with 0 (they do not affect eval-mode
outputs). None of the files stores the training σ, so the caller must give it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import SmoothcertError, check_positive_finite, unknown_name
from ..io import check_not_input, file_sha256
from ..registry import Registry
from .archs import MODELS, build_model
from .checkpoint import MAX_EPOCH, check_finite, check_meta, checkpoint_meta, save_checkpoint

# "reference": what the format's code used for the dataset; the others override it.
NORMALIZATIONS = ("reference", "standardize", "center", "none")

# Per-channel statistics of pixels in [0, 1] from locuslab/smoothing code/datasets.py
# (_CIFAR10_MEAN/_CIFAR10_STDDEV, _IMAGENET_MEAN/_IMAGENET_STDDEV); the datasets.py of Salman et
# al., of Jeong & Shin and of eth-sri/acr-weakness hold the same numbers.
REFERENCE_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
_STATS_SOURCE = "locuslab/smoothing code/datasets.py"


@dataclass(frozen=True)
class ReferenceFormat:
    """How one reference implementation saves its models (see the module docstring)."""

    name: str
    method: str  # our training method that reproduces the reference's
    weights_key: str  # the saved dict's entry holding the state dict
    sequential: bool  # keys are Sequential(normalization, net)'s: "1.<net key>"
    normalization: Mapping[str, str]  # dataset -> "standardize" | "center" | "none"
    source: str  # repository and files the layout was read from
    role: str = "classifier"  # the role of the model it holds (smoothcert.models.ROLES)


FORMATS: Registry = Registry("checkpoint format")


def _register(fmt: ReferenceFormat) -> None:
    FORMATS.register(fmt.name)(fmt)


_register(ReferenceFormat(
    "cohen", "gaussian", "state_dict", True, {"cifar10": "standardize", "imagenet": "standardize"},
    "locuslab/smoothing code/train.py, code/architectures.py, code/datasets.py"))
_register(ReferenceFormat(
    "salman", "smoothadv", "state_dict", True, {"cifar10": "center", "imagenet": "center"},
    "Hadisalman/smoothing-adversarial code/train_pgd.py, code/architectures.py (3911bd8), "
    "code/datasets.py"))
_register(ReferenceFormat(
    "jeong", "consistency", "state_dict", True,
    {"cifar10": "standardize", "imagenet": "standardize", "mnist": "none"},
    "jh-jeong/smoothing-consistency code/train_consistency.py, code/architectures.py, "
    "code/datasets.py"))
_register(ReferenceFormat(
    "acr-weakness", "easy_focus", "state_dict", True,
    {"cifar10": "standardize", "imagenet": "standardize", "mnist": "none", "fashion-mnist": "none"},
    "eth-sri/acr-weakness code/train.py, code/train_utils.py, code/architectures.py, "
    "code/datasets.py"))
_register(ReferenceFormat(
    "denoised-smoothing", "denoiser-mse", "state_dict", False,
    {"cifar10": "none", "imagenet": "none"},
    "microsoft/denoised-smoothing code/train_denoiser.py, code/architectures.py, "
    "code/archs/dncnn.py", role="denoiser"))
_register(ReferenceFormat(
    "macer", "macer", "net", False, {"mnist": "none", "cifar10": "none", "svhn": "none"},
    "RuntianZ/macer main.py, model.py"))


@dataclass(frozen=True)
class Normalization:
    """The per-channel (x − mean) / std that the imported model applies to pixels in [0, 1]."""

    mode: str  # "standardize", "center" (std 1) or "none" (mean 0, std 1)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str


def resolve_normalization(fmt: ReferenceFormat, spec, mode: str = "reference") -> Normalization:
    """The normalization of ``fmt``'s models of dataset ``spec`` (a ``DatasetSpec``), or the one
    ``mode`` asks for. "standardize" and "center" use the reference constants where the reference
    code has them (cifar10, imagenet), else the dataset registry's mean and std."""
    if mode not in NORMALIZATIONS:
        raise unknown_name("normalization", mode, NORMALIZATIONS)
    if mode == "reference":
        if spec.name not in fmt.normalization:
            raise SmoothcertError(
                f"the {fmt.name} code ({fmt.source.split()[0]}) has no {spec.name} models, so no "
                f"reference normalization is known; pass --normalization standardize, center or "
                f"none to state what the file was trained with"
            )
        mode = fmt.normalization[spec.name]
    channels = spec.input_shape[0]
    if mode == "none":
        return Normalization("none", (0.0,) * channels, (1.0,) * channels, "identity")
    if spec.name in REFERENCE_STATS:
        (mean, std), source = REFERENCE_STATS[spec.name], _STATS_SOURCE
    else:
        mean, std, source = spec.mean, spec.std, f"smoothcert dataset registry ({spec.name})"
    if mode == "center":
        std = (1.0,) * len(mean)
    return Normalization(mode, tuple(mean), tuple(std), source)


def read_reference(path: str | os.PathLike) -> object:
    """``torch.load(path, weights_only=True)`` on CPU; a file that needs code to unpickle is
    refused with one clear error."""
    path = Path(path)
    if not path.is_file():
        raise SmoothcertError(f"{path} does not exist; check the path")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise SmoothcertError(
            f"{path} is not a plain state-dict checkpoint: weights-only loading refused it "
            f"({type(err).__name__}); it may hold pickled code (e.g. a whole model saved with "
            f"torch.save(model)): re-save model.state_dict() where you trust the file"
        ) from err


def reference_weights(obj, fmt: ReferenceFormat, where) -> dict[str, torch.Tensor]:
    """The network weights in a loaded reference file, keyed as in our model (``1.<net key>`` for
    a classifier, the bare module's own keys for a denoiser), with every ``module.`` component
    dropped; a NaN or inf weight is refused."""
    weights = obj.get(fmt.weights_key) if isinstance(obj, dict) else None
    if not isinstance(weights, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        held = ", ".join(map(repr, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise SmoothcertError(
            f"{where} is not a {fmt.name} checkpoint: that holds a state dict under "
            f"{fmt.weights_key!r}, this file holds {held or 'nothing'}; check --format"
        )
    check_finite(weights, where)  # named by the file's own keys, as load_checkpoint refuses
    out: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        name = ".".join(part for part in str(key).split(".") if part != "module")
        name = name if fmt.sequential or fmt.role != "classifier" else f"1.{name}"
        if name in out:
            raise SmoothcertError(f"{where} holds {name!r} twice (with and without 'module.')")
        out[name] = value
    return out


def load_reference_weights(
    model: nn.Module, weights: dict[str, torch.Tensor], where, target: str = "the model"
) -> None:
    """Load ``weights`` into ``model``'s network (strict), keeping a classifier's normalization
    buffers (a denoiser has none: all its keys come from the file); one error, naming
    ``target``, lists a few missing, unexpected and mis-shaped keys."""
    expected = model.state_dict()
    norm = {k: expected[k] for k in ("0.mean", "0.std") if k in expected}
    under_net = not norm or any(k.startswith("1.") for k in weights)
    weights = dict(weights)
    for key, value in expected.items():  # absent from files written before PyTorch 0.4.1
        if key.endswith(".num_batches_tracked") and key not in weights:
            weights[key] = value
    # The references' normalization layers have no state: "0.*" in a file is foreign.
    unexpected = [k for k in weights if k not in expected or k in norm]
    missing = [k for k in expected if k not in weights and k not in norm]
    shapes = [f"{k} {tuple(weights[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
              if k in weights and weights[k].shape != v.shape]
    if missing or unexpected or shapes:
        raise SmoothcertError(f"{where} does not fit {target}: " + _fit_report(
            missing, unexpected, shapes, under_net) + "; check --arch, --dataset and --format")
    model.load_state_dict({**weights, **norm}, strict=True)


def _fit_report(missing: list[str], unexpected: list[str], shapes: list[str],
                under_net: bool) -> str:
    parts = [f"{len(keys)} {what} ({_few(keys)})" for what, keys in
             (("missing keys", missing), ("unexpected keys", unexpected),
              ("shape mismatches (file vs model)", shapes)) if keys]
    if not under_net:
        parts.append("no file key starts with '1.' (the Sequential(NormalizeLayer, net) layout)")
    return ", ".join(parts)


def _few(keys: list[str], count: int = 3) -> str:
    return ", ".join(keys[:count]) + (", …" if len(keys) > count else "")


def import_checkpoint(
    path: str | os.PathLike,
    fmt: str,
    *,
    arch: str | None,
    dataset: str,
    sigma: float,
    out: str | os.PathLike,
    normalization: str = "reference",
    overwrite: bool = False,
) -> Path:
    """Convert the reference checkpoint at ``path`` (format ``fmt``, a key of :data:`FORMATS`)
    into a smoothcert checkpoint at ``out``; returns ``out``.

    The model is ``build_model(arch, …)`` for ``dataset`` with the normalization of
    :func:`resolve_normalization`; ``sigma`` (pixel units) is the training noise level, which the
    reference files do not store (0: trained on clean images, as the classifiers of denoised
    smoothing; the meta then has no noise, and certification must be given σ). A denoiser
    format (``denoised-smoothing``) gives a role-"denoiser" checkpoint of ``dncnn`` whose depth
    and width come from the file (``arch`` None or "dncnn"; no normalization). The meta records
    the format's method, σ and ``imported_from`` (format, file, sha256, normalization and its
    source). Everything a later load checks is checked before ``out`` is written, atomically:
    the weights' keys and shapes, that every weight is finite, the file's epoch and the meta;
    an existing ``out`` is refused unless ``overwrite``, and ``out`` naming the input file
    always.
    """
    from ..data.registry import dataset_spec

    reference, spec = FORMATS[fmt], dataset_spec(dataset)
    arch, sigma, norm = _checked_request(reference, spec, arch, sigma, normalization)
    out = _checked_out(out, path, overwrite)
    obj = read_reference(path)
    model, arch_kwargs, norm, stated_arch = _reference_model(obj, reference, spec, arch, norm,
                                                             path)
    meta = _imported_meta(path, obj, reference, spec, arch, sigma, norm, normalization,
                          arch_kwargs, stated_arch)
    check_meta(meta, f"the import of {path}")  # as load_checkpoint will check it
    return save_checkpoint(out, model, meta)


def _imported_meta(path, obj, reference: ReferenceFormat, spec, arch: str, sigma, norm,
                   normalization: str, arch_kwargs, stated_arch) -> dict:
    """The meta of an imported checkpoint: the format's method, σ (no noise for a clean
    classifier), the file's epoch, and ``imported_from`` (format, file, sha256, source,
    normalization and where its constants come from)."""
    meta = checkpoint_meta(
        arch=arch, dataset=spec.name, num_classes=spec.num_classes or 0,
        input_shape=spec.input_shape, mean=norm.mean, std=norm.std,
        noise=None if sigma is None else {"name": "gaussian", "sigma": sigma},
        method={"name": reference.method, "hparams": {}}, epoch=_epoch(obj, path),
        config={"format": reference.name, "arch": arch, "dataset": spec.name, "sigma": sigma,
                "normalization": normalization},
        arch_kwargs=arch_kwargs, role=reference.role,
    )
    meta["imported_from"] = {
        "format": reference.name, "file": os.fspath(path), "sha256": file_sha256(path),
        "source": reference.source, "arch_in_file": stated_arch, "normalization": norm.mode,
        "normalization_source": norm.source}
    return meta


def _checked_out(out, path, overwrite: bool) -> Path:
    """``out`` as a Path, refused when it is the input file (even with ``overwrite``: the
    reference file must survive) or exists and ``overwrite`` is off."""
    out = Path(out)
    check_not_input(out, [path])
    if out.exists() and not overwrite:
        raise SmoothcertError(f"{out} already exists; choose another --out or pass --force")
    return out


def _reference_model(obj, reference: ReferenceFormat, spec, arch: str, norm, where):
    """(model holding the file's weights, arch_kwargs or None, normalization, the file's own
    'arch' entry): a denoiser's depth and width read from the file, without normalization (it
    takes raw pixels); a classifier as ``arch`` behind ``norm``."""
    weights = reference_weights(obj, reference, where)
    arch_kwargs = None
    if reference.role == "denoiser":
        arch_kwargs, stated_arch = _dncnn_params(obj, weights, where)
        channels = spec.input_shape[0]
        norm = Normalization("none", (0.0,) * channels, (1.0,) * channels, "identity")
    else:
        stated_arch = _check_arch(obj, arch, where)
    model = build_model(arch, spec.num_classes or 0, spec.input_shape, norm.mean, norm.std,
                        arch_kwargs)
    load_reference_weights(model, weights, where, f"{arch} for {spec.name}")
    return model, arch_kwargs, norm, stated_arch


def _checked_request(reference: ReferenceFormat, spec, arch: str | None, sigma: float,
                     normalization: str):
    """(arch, σ or None for a clean classifier, the classifier's normalization or None for a
    denoiser): the import's arguments checked before any file is read."""
    sigma = None if sigma == 0 else check_positive_finite("sigma", sigma)
    if reference.role == "denoiser":
        if sigma is None:
            raise SmoothcertError("a denoiser is trained for a noise level: pass its --sigma > 0")
        return _denoiser_arch(reference, arch, normalization, spec), sigma, None
    if arch is None:
        raise SmoothcertError(f"the {reference.name} format holds classifiers: pass --arch, "
                              f"e.g. cifar_resnet110, or resnet50 for ImageNet")
    return arch, sigma, resolve_normalization(reference, spec, normalization)


# The DnCNN entries of microsoft/denoised-smoothing code/architectures.py: the file's 'arch' ->
# our dncnn's parameters. Its MemNet denoisers ('memnet', 'imagenet_memnet') are not ours.
DNCNN_ARCHS: dict[str, dict[str, int]] = {
    "cifar_dncnn": {"depth": 17, "width": 64},
    "cifar_dncnn_wide": {"depth": 17, "width": 128},
    "imagenet_dncnn": {"depth": 17, "width": 64},
}


def _denoiser_arch(reference: ReferenceFormat, arch, normalization: str, spec) -> str:
    """``dncnn``, after refusing another --arch or a normalization (denoisers take pixels)."""
    if arch not in (None, "dncnn"):
        raise SmoothcertError(f"the {reference.name} format holds DnCNN denoisers, not {arch}; "
                              "pass --arch dncnn or leave --arch out")
    if normalization not in ("reference", "none"):
        raise SmoothcertError(f"a {reference.name} denoiser takes raw pixels in [0, 1]: "
                              f"--normalization {normalization} does not apply; leave it out")
    if spec.name not in reference.normalization:
        known = ", ".join(sorted(reference.normalization))
        raise SmoothcertError(f"the {reference.name} code ({reference.source.split()[0]}) has no "
                              f"{spec.name} denoisers; its datasets are {known}")
    return "dncnn"


def _dncnn_params(obj, weights: dict[str, torch.Tensor], where) -> tuple[dict, str | None]:
    """Depth and width of the DnCNN in the file, and the file's 'arch' entry: from that entry
    (:data:`DNCNN_ARCHS`), or read off the weights when it has none (width: the first
    convolution's outputs; depth: the number of convolutions). The strict load then checks every
    weight against them."""
    stated = obj.get("arch")
    if isinstance(stated, str):
        if stated not in DNCNN_ARCHS:
            raise SmoothcertError(
                f"{where} says arch {stated!r}; only the DnCNN denoisers "
                f"({', '.join(DNCNN_ARCHS)}) of microsoft/denoised-smoothing can be imported")
        return dict(DNCNN_ARCHS[stated]), stated
    first = weights.get("dncnn.0.weight")
    if first is None or first.dim() != 4:
        raise SmoothcertError(f"{where} holds no DnCNN weights (no 'dncnn.0.weight'); check "
                              "--format")
    convs = [k for k, v in weights.items() if k.startswith("dncnn.") and k.endswith(".weight")
             and v.dim() == 4]
    return {"depth": len(convs), "width": int(first.shape[0])}, None


# Other spellings of the network an ``arch`` entry names: our resnet50 is torchvision's.
_SAME_NETWORK: dict[str, frozenset[str]] = {"resnet50": frozenset({"torchvision:resnet50"})}


def _check_arch(obj, arch: str, where) -> str | None:
    """The file's own ``arch`` entry; refuse one of our architectures other than ``arch``. The
    references' names that are not ours ("cifar_densenet40", "imagenet32_resnet110", …) are kept
    as provenance only: the strict key check decides."""
    stated = obj.get("arch") if isinstance(obj, dict) else None
    if not isinstance(stated, str):
        return None
    if stated in MODELS and stated != arch and arch not in _SAME_NETWORK.get(stated, ()):
        raise SmoothcertError(f"{where} says arch {stated!r}, --arch is {arch!r}; pass --arch "
                              f"{stated}")
    return stated


def _epoch(obj, where) -> int:
    """Completed training epochs as the file states them (Cohen et al. save epoch + 1, MACER its
    1-based epoch, eth-sri/acr-weakness's ``train.py`` the 0-based index, one less); 0 when
    absent or not a count. An integer above :data:`MAX_EPOCH` is refused: a checkpoint cannot
    hold it (load_checkpoint would refuse the file written)."""
    epoch = obj.get("epoch") if isinstance(obj, dict) else None
    if type(epoch) is int and epoch > MAX_EPOCH:
        raise SmoothcertError(f"{where} says epoch {epoch}, more than any training run "
                              f"({MAX_EPOCH}); the file is corrupt or its 'epoch' is not a count "
                              "of epochs: fix or remove that entry")
    return epoch if type(epoch) is int and epoch >= 0 else 0
