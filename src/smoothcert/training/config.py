"""The configuration of a training run: a typed, validated, frozen :class:`TrainConfig`.

Everything that determines a run except the device; it is saved as ``config.yaml`` and inside
every checkpoint, and a resumed run must present the same one. ``SCHEDULES`` names the
learning-rate schedules, each stepped once per epoch.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch.optim.lr_scheduler import LRScheduler, MultiStepLR, StepLR

from ..data import DATASETS
from ..errors import SmoothcertError, check_count, check_positive_finite, unknown_name
from ..methods import METHODS, build_method
from ..models import MODELS
from ..models.archs import EXTERNAL_ZOOS
from .sigma_modes import SIGMA_MODES


# --------------------------------------------------------------------------- config
@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (except the device).

    Validated and normalised at construction: ``method_params`` is completed with the method's
    defaults, so equal runs have equal configs. Units: ``sigma`` in pixel units of [0, 1] inputs,
    ``lr_step_size`` and ``lr_milestones`` in epochs. Defaults follow Cohen et al. 2019 (SGD,
    lr 0.1, momentum 0.9, weight decay 1e-4, lr × 0.1 every 30 epochs, batch 256).

    ``sigma_mode="data_dependent"`` trains every example at its own σ_x, initialised to
    ``sigma`` and optimised by OptimizeSigma as the epochs go (Alfarra et al. 2022, Alg. 2; the
    method must support a per-sample σ). Its settings default to the authors' training scripts
    (MotasemAlfarra/Data_Dependent_Randomized_Smoothing, ``ImageNet/train_rs.py``,
    ``ImageNet/train_macer.py``), which the paper's training runs follow:

    - ``dd_steps`` = 1: K, gradient-ascent steps on σ per visit of an example, i.e. per epoch
      (``--iter_sig_tr`` default 1; the CIFAR-10 ``train_macer.py`` default is 10);
    - ``dd_step_size`` = 1e-4: α_σ, the step on σ per unit gradient of the soft radius
      (``--lr_sig`` default in every script; the paper's α = 0.0001);
    - ``dd_num_samples`` = 1: n, noise draws per step (``--gaussian_num_ds`` default 1; paper,
      App. H.3: n = 1 "for ease of computation" in training, n = 8 as an ablation);
    - ``dd_start_epoch`` = 0: epochs trained at the fixed ``sigma`` before σ_x is optimised
      (``--epoch-switch`` default 0; the paper's CIFAR-10 Cohen runs use 50 of 200 epochs).

    ``train_size`` (default: the whole split) trains on a fixed class-balanced subset of the
    training split (:func:`smoothcert.data.balanced_subset`), the same for every run and seed, so
    that studies on a small machine can keep a schedule's epochs and shrink its cost.
    """

    dataset: str
    arch: str
    sigma: float
    epochs: int
    method: str = "gaussian"
    method_params: dict = field(default_factory=dict)
    batch_size: int = 256
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4
    lr_schedule: str = "step"  # "step" | "multistep" | "constant"
    lr_step_size: int = 30  # "step": lr *= lr_gamma every lr_step_size epochs
    lr_milestones: tuple = (30, 60)  # "multistep": lr *= lr_gamma at each of these epochs
    lr_gamma: float = 0.1
    seed: int = 0
    data_root: str | None = None
    init_checkpoint: str | None = None  # start from these weights (same arch and dataset)
    sigma_mode: str = "fixed"  # "fixed" | "data_dependent" (one σ per example, Alfarra Alg. 2)
    dd_steps: int = 1  # K: OptimizeSigma steps per example per epoch
    dd_step_size: float = 1e-4  # α_σ: ascent step on σ (pixel units per unit radius gradient)
    dd_num_samples: int = 1  # n: noise draws per OptimizeSigma step
    dd_start_epoch: int = 0  # epochs at the fixed σ before σ_x is optimised
    train_size: int | None = None  # train on this many examples (a fixed class-balanced subset)
    arch_kwargs: dict = field(default_factory=dict)  # torchvision:/timm: constructor arguments
    image_size: int | None = None  # image folders: side S of the square inputs (default 224)

    def __post_init__(self):
        for name, value in _validated(self).items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values (lists, not tuples), ready for YAML and checkpoints."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(method_params=dict(self.method_params), lr_milestones=list(self.lr_milestones),
                 arch_kwargs=dict(self.arch_kwargs))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown or missing keys raise, listing the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise SmoothcertError(
                f"unknown config key(s) {', '.join(unknown)}; valid: {', '.join(names)}"
            )
        missing = [f.name for f in dataclasses.fields(cls) if _required(f) and f.name not in d]
        if missing:
            raise SmoothcertError(f"config is missing required key(s): {', '.join(missing)}")
        return cls(**d)

    def differences(self, other: TrainConfig) -> list[str]:
        """Keys whose values differ from ``other`` (``data_root`` excepted: the data may move)."""
        a, b = self.to_dict(), other.to_dict()
        return [k for k in a if k != "data_root" and a[k] != b[k]]


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _validated(c: TrainConfig) -> dict[str, Any]:
    """Checked and normalised values of every field; raises SmoothcertError on the first bad one."""
    params = c.method_params
    if not isinstance(params, Mapping):
        raise SmoothcertError(f"method_params must be a mapping, got {type(params).__name__}")
    method = build_method(_check_str("method", c.method), **params)
    values = {
        "dataset": _check_name("dataset", c.dataset, _known_datasets()),
        "arch": _check_arch(c.arch),
        "arch_kwargs": _check_arch_kwargs(c.arch, c.arch_kwargs),
        "image_size": _check_image_size(c.dataset, c.image_size),
        "sigma": check_positive_finite("sigma", c.sigma),
        "epochs": check_count("epochs", c.epochs),
        "method_params": method.hparams(),
        "batch_size": check_count("batch_size", c.batch_size),
        "lr": check_positive_finite("lr", c.lr),
        "momentum": _check_range("momentum", c.momentum, 0.0, 1.0),
        "nesterov": _check_nesterov(c.nesterov, c.momentum),
        "weight_decay": _check_range("weight_decay", c.weight_decay, 0.0, math.inf),
        "lr_schedule": _check_name("lr_schedule", c.lr_schedule, SCHEDULES),
        "lr_step_size": check_count("lr_step_size", c.lr_step_size),
        "lr_milestones": _check_milestones(c.lr_milestones),
        "lr_gamma": check_positive_finite("lr_gamma", c.lr_gamma),
        "seed": check_count("seed", c.seed, minimum=0),
        "data_root": None if c.data_root is None else os.fspath(c.data_root),
        "init_checkpoint": _check_path("init_checkpoint", c.init_checkpoint),
        "sigma_mode": _check_name("sigma_mode", c.sigma_mode, SIGMA_MODES),
        "dd_steps": check_count("dd_steps", c.dd_steps),
        "dd_step_size": check_positive_finite("dd_step_size", c.dd_step_size),
        "dd_num_samples": check_count("dd_num_samples", c.dd_num_samples),
        "dd_start_epoch": check_count("dd_start_epoch", c.dd_start_epoch, minimum=0),
        "train_size": None if c.train_size is None else check_count("train_size", c.train_size),
    }
    _check_data_dependent(values, method)
    return values


def _check_data_dependent(values: dict[str, Any], method) -> None:
    """Data-dependent σ needs a method that trains at a per-sample σ, and at least one epoch
    from ``dd_start_epoch`` on."""
    if values["sigma_mode"] != "data_dependent":
        return
    if not method.supports_per_sample_sigma:
        able = sorted(n for n, cls in METHODS.items() if cls.supports_per_sample_sigma)
        raise SmoothcertError(
            f"method {method.name!r} cannot train with a per-sample σ (sigma_mode "
            f"data_dependent); use sigma_mode fixed, or one of: {', '.join(able)}"
        )
    if values["dd_start_epoch"] >= values["epochs"]:
        raise SmoothcertError(
            f"dd_start_epoch ({values['dd_start_epoch']}) must be below epochs "
            f"({values['epochs']}), or no epoch trains with data-dependent σ"
        )


def _check_str(name: str, value) -> str:
    if not isinstance(value, str):
        raise SmoothcertError(f"{name} must be a string, got {value!r}")
    return value


def _check_path(name: str, value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise SmoothcertError(f"{name} must be a file path or null, got {value!r}")
    return os.fspath(value)


def _check_name(kind: str, value, known) -> str:
    if _check_str(kind, value) not in known:
        raise unknown_name(kind, value, known)
    return value


def _check_range(name: str, value, low: float, high: float) -> float:
    """low <= value < high."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not low <= value < high:
        raise SmoothcertError(f"{name} must be a number in [{low}, {high}), got {value!r}")
    return float(value)


def _check_nesterov(nesterov, momentum) -> bool:
    if not isinstance(nesterov, bool):
        raise SmoothcertError(f"nesterov must be true or false, got {nesterov!r}")
    if nesterov and not momentum > 0:
        raise SmoothcertError("nesterov momentum needs momentum > 0")
    return nesterov


def _check_milestones(milestones) -> tuple:
    values = tuple(milestones) if isinstance(milestones, (list, tuple)) else None
    ok = values is not None and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values
    )
    if not ok or list(values) != sorted(set(values)):
        raise SmoothcertError(
            f"lr_milestones must be strictly increasing epochs >= 1, got {milestones!r}"
        )
    return values


def _check_arch(arch) -> str:
    """A registered architecture, or ``torchvision:NAME`` / ``timm:NAME`` (the name is checked
    when the model is built, with close names listed)."""
    zoo, _, name = _check_str("arch", arch).partition(":")
    if name and zoo in EXTERNAL_ZOOS:
        return arch
    return _check_name("arch", arch, [*_known_archs(), "torchvision:NAME", "timm:NAME"])


def _check_arch_kwargs(arch: str, kwargs) -> dict:
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise SmoothcertError(f"arch_kwargs must be a mapping of names to values, got {kwargs!r}")
    if kwargs and arch.partition(":")[0] not in EXTERNAL_ZOOS:
        raise SmoothcertError(f"arch_kwargs are for torchvision: and timm: models, not {arch}")
    return dict(kwargs)


def _check_image_size(dataset, image_size) -> int | None:
    if image_size is None:
        return None
    if isinstance(dataset, str) and dataset in DATASETS and not DATASETS[dataset].streamed:
        raise SmoothcertError(f"image_size is for image folders; {dataset} has a fixed size")
    return check_count("image_size", image_size)


def _known_datasets():
    return DATASETS


def _known_archs():
    return MODELS


# --------------------------------------------------------------------------- schedules
def _step(opt, c: TrainConfig) -> LRScheduler:
    return StepLR(opt, step_size=c.lr_step_size, gamma=c.lr_gamma)


def _multistep(opt, c: TrainConfig) -> LRScheduler:
    return MultiStepLR(opt, milestones=list(c.lr_milestones), gamma=c.lr_gamma)


def _constant(opt, c: TrainConfig) -> LRScheduler:
    return MultiStepLR(opt, milestones=[], gamma=1.0)


SCHEDULES: dict[str, Callable[[Any, TrainConfig], LRScheduler]] = {
    "step": _step,
    "multistep": _multistep,
    "constant": _constant,
}
"""Learning-rate schedules by name, each stepped once per epoch."""
