"""The configuration of a training run: a typed, validated, frozen :class:`TrainConfig`.

Everything that determines a run except the device; it is saved as ``config.yaml`` and inside
every checkpoint, and a resumed run must present the same one. This file is the one place a
field is declared: its metadata (:func:`_doc`) holds its help text, its flag where that is not
``--field-name``, and for a name the registry its choices come from; ``smoothcert train``
generates its flags and its ``--help`` from the fields. The optimizers and learning-rate
schedules it names are in :mod:`smoothcert.training.optim`.

A config as a dict (:meth:`TrainConfig.to_dict`: ``config.yaml``, a checkpoint's config) carries
its ``format_version``; :meth:`TrainConfig.from_dict` reads older versions through
:func:`smoothcert.upgrade.upgrade_config`, and the old ``dd_*`` keyword arguments go through
:func:`smoothcert.upgrade.sigma_keywords`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..data.registry import DATASETS
from ..errors import (
    MAX_BATCH,
    SmoothcertError,
    check_bool,
    check_count,
    check_in_range,
    check_positive_finite,
    unknown_name,
)
from ..methods import METHODS, build_method
from ..models import MODELS
from ..models.archs import EXTERNAL_ZOOS, check_arch_kwargs, model_role, model_task
from ..noise.base import NOISES
from ..upgrade import CONFIG_VERSION, VERSION_KEY, accepts_sigma_keywords, upgrade_config
from .choices import arch_choices, dataset_choices, described, keyword_choices
from .labels import check_label_fields
from .optim import OPTIMIZERS, SCHEDULES
from .sigma_modes import SIGMA_MODES, SigmaMode, build_sigma_mode


def _doc(help: str, *, flag: str | None = None, metavar: str | None = None,
         choices: Callable[[], dict[str, str]] | None = None) -> dict[str, Any]:
    """A field's metadata: ``help`` (its meaning and unit), ``flag`` (the CLI spelling, default
    ``--field-name``), ``metavar``, and ``choices``: a function giving the names the field
    accepts with a one-line description each (read when help is printed, so plug-ins registered
    later are listed too)."""
    return {"help": help, "flag": flag, "metavar": metavar, "choices": choices}


# --------------------------------------------------------------------------- config
@accepts_sigma_keywords
@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (except the device).

    Validated and normalised at construction: ``method_params`` and ``sigma_mode_params`` are
    completed with the method's and the σ mode's defaults, and the optimizer settings left unset
    (``optimizer``, ``lr``, ``weight_decay``, ``lr_schedule``: None) become the method's
    (:meth:`~smoothcert.methods.TrainingMethod.training_defaults`), so equal runs have equal
    configs. Units: ``sigma`` in pixel units of [0, 1] inputs, ``lr_step_size`` and
    ``lr_milestones`` in epochs. Defaults follow Cohen et al. 2019 (SGD, lr 0.1, momentum 0.9,
    weight decay 1e-4, lr × 0.1 every 30 epochs, batch 256) and train with Gaussian noise at one
    σ; the denoiser methods default to Salman et al. 2020's Adam at lr 1e-3, diffusion to Ho et
    al. 2020's Adam at lr 2e-4 with a constant schedule and no weight decay, ablation to Levine &
    Feizi's SGD at lr 0.01 with weight decay 5e-4 and a constant schedule.

    ``sigma`` is required by a method that trains with noise and refused by one that does not
    (``standard``, ``diffusion``, ``ablation``). ``arch`` must have the role the method trains
    (a classifier, a denoiser such as ``dncnn``, a diffusion model such as ``ddpm_unet``);
    ``classifier`` is the frozen classifier checkpoint of the denoiser methods.

    ``noise`` names the noise distribution (:data:`smoothcert.noise.NOISES`) every training
    example is perturbed with, at standard deviation ``sigma`` per coordinate.

    ``sigma_mode="data_dependent"`` trains every example at its own σ_x, initialised to
    ``sigma`` and optimised by OptimizeSigma as the epochs go (Alfarra et al. 2022, Alg. 2; the
    method must support a per-sample σ); ``sigma_mode_params`` sets its parameters
    (:class:`~smoothcert.training.sigma_modes.PerExampleSigma`: ``num_steps``, ``step_size``,
    ``num_samples``, ``start_epoch``, defaulting to the authors' training scripts). Their old
    spellings, the keyword arguments ``dd_steps``, ``dd_step_size``, ``dd_num_samples`` and
    ``dd_start_epoch``, still work, with a deprecation line
    (:func:`smoothcert.upgrade.sigma_keywords`).

    ``train_size`` (default: the whole split) trains on a fixed class-balanced subset of the
    training split (:func:`smoothcert.data.datasets.balanced_subset`), the same for every run and
    seed, so
    that studies on a small machine can keep a schedule's epochs and shrink its cost.

    ``label_records`` trains ACES' selection model instead (:mod:`smoothcert.training.labels`):
    2 classes, on the training examples recorded in a certify file of the robust model, class 1
    (robust) where ``label_rule`` holds at ``label_radius``; ``label_sha256`` fixes that file.
    """

    dataset: str = field(metadata=_doc(
        "the training set (its test split gives the log's noisy test accuracy)",
        metavar="NAME", choices=lambda: dataset_choices()))
    arch: str = field(metadata=_doc(
        "architecture of the model: a classifier, or the denoiser or diffusion model the method "
        "trains (--arch-param sets its keyword arguments)", metavar="NAME",
        choices=lambda: arch_choices()))
    epochs: int = field(metadata=_doc("passes over the training set"))
    sigma: float | None = field(default=None, metadata=_doc(
        "noise level σ: the standard deviation of each noise coordinate, in pixel units of "
        "[0, 1] inputs (default: none; required by the methods that train with noise, refused "
        "by the others: standard, diffusion, ablation)"))
    method: str = field(default="gaussian", metadata=_doc(
        "the training method (its loss)", metavar="NAME",
        choices=lambda: keyword_choices(METHODS)))
    method_params: dict = field(default_factory=dict, metadata=_doc(
        "a hyperparameter of the method, e.g. --param num_noise=4 (repeatable; each method's "
        "defaults are listed below)", flag="--param", metavar="KEY=VALUE"))
    noise: str = field(default="gaussian", metadata=_doc(
        "the distribution of the training noise", metavar="NAME",
        choices=lambda: described(NOISES)))
    batch_size: int = field(default=256, metadata=_doc(
        "examples per optimizer step (the global batch under torchrun)", flag="--batch"))
    optimizer: str | None = field(default=None, metadata=_doc(
        "the optimizer, sgd or adam (default: the method's: adam for denoiser-mse, "
        "denoiser-stability and diffusion, sgd for the others)", metavar="NAME"))
    lr: float | None = field(default=None, metadata=_doc(
        "initial learning rate (default: the method's: 0.1; 1e-3 for the denoiser methods, "
        "2e-4 for diffusion, 0.01 for ablation)"))
    momentum: float = field(default=0.9, metadata=_doc("momentum of SGD, in [0, 1)"))
    nesterov: bool = field(default=False, metadata=_doc(
        "Nesterov momentum of SGD (needs momentum > 0)"))
    weight_decay: float | None = field(default=None, metadata=_doc(
        "L2 weight decay (default: the method's: 1e-4; 0 for diffusion, 5e-4 for ablation)"))
    lr_schedule: str | None = field(default=None, metadata=_doc(
        "how the learning rate changes, once per epoch (default: the method's: step; constant "
        "for diffusion and ablation)", metavar="NAME", choices=lambda: described(SCHEDULES)))
    lr_step_size: int = field(default=30, metadata=_doc(
        "step schedule: lr × lr_gamma every this many epochs", metavar="EPOCHS"))
    lr_milestones: tuple[int, ...] = field(default=(30, 60), metadata=_doc(
        "multistep schedule: lr × lr_gamma at each of these epochs", metavar="E1,E2,..."))
    lr_gamma: float = field(default=0.1, metadata=_doc(
        "factor of each learning-rate step", metavar="GAMMA"))
    seed: int = field(default=0, metadata=_doc(
        "seed of every random draw: initialisation, epoch order, augmentation, noise"))
    data_root: str | None = field(default=None, metadata=_doc(
        "folder holding the datasets' files (default: each dataset's own search; not compared "
        "on resume: the data may move)", metavar="DIR"))
    init_checkpoint: str | None = field(default=None, metadata=_doc(
        "start from the weights of this checkpoint (same arch and dataset), e.g. to fine-tune "
        "with --method heat (default: random initialisation from --seed)",
        flag="--init-from", metavar="PATH"))
    classifier: str | None = field(default=None, metadata=_doc(
        "the frozen classifier (a classifier checkpoint of the same dataset) of the denoiser "
        "methods: denoiser-stability trains against it (required), denoiser-mse logs its "
        "accuracy on the denoised test images (optional); refused by the other methods "
        "(default: none)",
        metavar="PATH"))
    sigma_mode: str = field(default="fixed", metadata=_doc(
        "how the σ of each training example is chosen", metavar="NAME",
        choices=lambda: keyword_choices(SIGMA_MODES)))
    sigma_mode_params: dict = field(default_factory=dict, metadata=_doc(
        "a parameter of the σ mode, e.g. --sigma-param start_epoch=4 (repeatable; each mode's "
        "defaults are listed below)", flag="--sigma-param", metavar="KEY=VALUE"))
    train_size: int | None = field(default=None, metadata=_doc(
        "train on a fixed class-balanced subset of N training examples, the same for every run "
        "and seed (default: the whole training split)", metavar="N"))
    test_size: int | None = field(default=None, metadata=_doc(
        "measure the log's test columns on a fixed class-balanced subset of N test examples (a "
        "segmentation or regression set's first N), the same every epoch (default: the whole "
        "test split)", metavar="N"))
    arch_kwargs: dict = field(default_factory=dict, metadata=_doc(
        "keyword argument of the architecture, e.g. --arch-param depth=17 for dncnn or "
        "dropout=0.1 for a torchvision:/timm: model (repeatable; stored in the checkpoint; "
        "default: the architecture's own)",
        flag="--arch-param",
        metavar="KEY=VALUE"))
    image_size: int | None = field(default=None, metadata=_doc(
        "side S of the square inputs of an image folder: Resize(S·8/7) + CenterCrop(S) for "
        "evaluation, RandomResizedCrop(S) + flip for training (default 224)", metavar="S"))
    label_records: str | None = field(default=None, metadata=_doc(
        "train ACES' 2-class selection model (class 1 robust, 0 core) on the training examples "
        "that have a row in FILE, a record file of the robust model on --split train, labelled "
        "by --label-rule at --label-radius (default: none, the dataset's labels)",
        metavar="FILE"))
    label_test_records: str | None = field(default=None, metadata=_doc(
        "the robust model's record file of the test split, labelled by the same rule for the "
        "log's test columns (default: none; those columns are then NaN)", metavar="FILE"))
    label_radius: float = field(default=0.0, metadata=_doc(
        "the radius r of --label-rule, in the records' radius unit", metavar="R"))
    label_rule: str = field(default="correct", metadata=_doc(
        "which rows of --label-records are class 1 (robust): correct (certified and correct "
        "at r: predict != -1, correct, radius >= r) or certified (at r, right or wrong)",
        metavar="RULE"))
    label_sha256: str | None = field(default=None, metadata=_doc(
        "the SHA-256 --label-records must have (default: the file's, recorded so that a run "
        "resumed with another file is refused)", metavar="HEX"))
    def __post_init__(self):
        for name, value in _validated(self).items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values (lists, not tuples), ready for YAML and checkpoints, with the
        config format's ``format_version`` (:data:`smoothcert.upgrade.CONFIG_VERSION`)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(method_params=dict(self.method_params), lr_milestones=list(self.lr_milestones),
                 sigma_mode_params=dict(self.sigma_mode_params),
                 arch_kwargs=dict(self.arch_kwargs))
        return {VERSION_KEY: CONFIG_VERSION, **d}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`, for a config of any version (one without
        ``format_version`` is read as version 1: :func:`smoothcert.upgrade.upgrade_config`);
        unknown or missing keys raise, listing the valid ones."""
        d = upgrade_config(d)
        del d[VERSION_KEY]
        problems = _key_problems(cls, d) + _name_problems(d)
        missing = [f.name for f in dataclasses.fields(cls) if _required(f) and f.name not in d]
        if missing:  # last: a misspelt name or key is the likelier cause of the rest
            problems.append(f"config is missing required key(s): {', '.join(missing)}")
        if problems:
            raise SmoothcertError("; ".join(problems))
        return cls(**d)

    def differences(self, other: TrainConfig) -> list[str]:
        """Keys whose values differ from ``other`` (``data_root`` excepted: the data may move)."""
        a, b = self.to_dict(), other.to_dict()
        return [k for k in a if k not in ("data_root", VERSION_KEY) and a[k] != b[k]]


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _key_problems(cls, d: Mapping[str, Any]) -> list[str]:
    """The line for the keys of ``d`` that are no field of ``cls`` (with the close field names
    each may have meant), or none."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names), key=str)
    if not unknown:
        return []
    close = [f"{_close(key, names)} for {key}" for key in unknown if _close(key, names)]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return [f"unknown config key(s) {', '.join(map(str, unknown))}; valid: {', '.join(names)}"
            f"{hint}"]


def _name_problems(d: Mapping[str, Any]) -> list[str]:
    """One line for each field of ``d`` that names no entry of its registry (dataset, arch,
    method, noise, optimizer, lr_schedule, sigma_mode), so that every misspelt name is reported
    at once, before what follows from it (a value the method needs, a missing key)."""
    problems = []
    for kind, known in _named_fields().items():
        value = d.get(kind)
        if isinstance(value, str) and value not in known and not _external_arch(kind, value) \
                and not _parametrized_noise(kind, value):
            problems.append(str(_unknown(kind, value, known)))
    return problems


def _named_fields() -> dict[str, Any]:
    """Each field that names a registry entry, and the names it accepts."""
    return {"dataset": _known_datasets(), "arch": [*_known_archs(), "torchvision:NAME",
                                                   "timm:NAME"],
            "method": METHODS, "noise": NOISES, "optimizer": OPTIMIZERS,
            "lr_schedule": SCHEDULES, "sigma_mode": SIGMA_MODES}


def _external_arch(kind: str, value: str) -> bool:
    """``torchvision:NAME`` or ``timm:NAME``: its name is checked when the model is built."""
    zoo, _, name = value.partition(":")
    return kind == "arch" and bool(name) and zoo in EXTERNAL_ZOOS


def _parametrized_noise(kind: str, value: str) -> bool:
    """``general-gaussian:k=380``: a family with parameters, checked when the noise is built."""
    family = NOISES.get(value.partition(":")[0])
    return kind == "noise" and family is not None and bool(family.parameters)


def _unknown(kind: str, value: str, known) -> SmoothcertError:
    """The error for a name that is no entry: the known names, and the closest one when a
    misspelling is likely (``gausian`` -> ``gaussian``)."""
    close = _close(value, known)
    hint = f" (did you mean {close!r}?)" if close else ""
    return SmoothcertError(f"{unknown_name(kind, value, known)}{hint}")


def _close(name: str, known) -> str | None:
    """The known name closest to ``name``, when close enough to be a misspelling of it."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.75)
    return close[0] if close else None


def _validated(c: TrainConfig) -> dict[str, Any]:
    """Checked and normalised values of every field; raises SmoothcertError on the first bad one."""
    method = build_method(_check_name("method", c.method, METHODS),
                          **_check_mapping("method_params", c.method_params))
    unset = method.training_defaults()
    arch = _check_arch(c.arch, method)
    values = {
        "dataset": _check_name("dataset", c.dataset, _known_datasets()),
        "arch": arch,
        "arch_kwargs": _check_arch_kwargs(arch, c.arch_kwargs),
        "image_size": _check_image_size(c.dataset, c.image_size),
        "sigma": _check_sigma(c.sigma, method),
        "epochs": check_count("epochs", c.epochs),
        "method_params": method.hparams(),
        "noise": NOISES[_check_str("noise", c.noise)].name,  # unknown: one line, the names
        "batch_size": check_count("batch_size", c.batch_size, maximum=MAX_BATCH),
        "optimizer": _check_name("optimizer", _or(c.optimizer, unset, "optimizer"), OPTIMIZERS),
        "lr": check_positive_finite("lr", _or(c.lr, unset, "lr")),
        "momentum": check_in_range("momentum", c.momentum, 0.0, 1.0, include_high=False),
        "nesterov": _check_nesterov(c.nesterov, c.momentum),
        "weight_decay": check_in_range("weight_decay", _or(c.weight_decay, unset, "weight_decay"),
                                       0.0, math.inf, include_high=False),
        "lr_schedule": _check_name("lr_schedule", _or(c.lr_schedule, unset, "lr_schedule"),
                                   SCHEDULES),
        "lr_step_size": check_count("lr_step_size", c.lr_step_size),
        "lr_milestones": _check_milestones(c.lr_milestones),
        "lr_gamma": check_positive_finite("lr_gamma", c.lr_gamma),
        "seed": check_count("seed", c.seed, minimum=0),
        "data_root": _check_path("data_root", c.data_root),
        "init_checkpoint": _check_path("init_checkpoint", c.init_checkpoint),
        "classifier": _check_classifier(c.classifier, method),
        "sigma_mode": _check_name("sigma_mode", c.sigma_mode, SIGMA_MODES),
        "train_size": None if c.train_size is None else check_count("train_size", c.train_size),
        "test_size": None if c.test_size is None else check_count("test_size", c.test_size),
    }
    mode = build_sigma_mode(values["sigma_mode"], **_check_mapping("sigma_mode_params",
                                                                    c.sigma_mode_params))
    _check_sigma_mode(values, mode, method)
    values.update(check_label_fields(c, method))  # ACES' selection labels (labels.py)
    _check_task(values["dataset"], arch, method)
    if method.uses_noise:
        values["noise"] = NOISES[values["noise"]].name  # canonical: general-gaussian:k=380
        _check_method_noise(method, values["noise"])
        NOISES[values["noise"]].check_sigma(values["sigma"])  # e.g. an exact sampler's bound
    return {**values, "sigma_mode_params": mode.params()}


def _or(value, defaults: Mapping[str, Any], name: str):
    """``value``, or the method's default for the field ``name`` when it is unset (None)."""
    return defaults[name] if value is None else value


def _check_sigma(sigma, method) -> float | None:
    """A σ for a method that trains with noise; none for one that does not."""
    if method.uses_noise and sigma is None:
        raise SmoothcertError(f"method {method.name} trains with noise: give --sigma")
    if not method.uses_noise and sigma is not None:
        # an ablation model is certified by ablating, not with noise: no σ anywhere
        later = "remove it" if method.input_encoding else "σ is chosen when certifying"
        raise SmoothcertError(f"method {method.name} trains without noise, so it takes no "
                              f"--sigma (got {sigma!r}); {later}")
    return None if sigma is None else check_positive_finite("sigma", sigma)


def _check_classifier(path, method) -> str | None:
    """The frozen classifier's path, where the method takes one (its file is read when the run
    starts: :meth:`~smoothcert.methods.TrainingMethod.prepare`)."""
    path = _check_path("classifier", path)
    if path is None and method.frozen_classifier == "required":
        raise SmoothcertError(f"method {method.name} trains against a frozen classifier: give "
                              "--classifier CLF.pt (a classifier checkpoint of the same dataset)")
    if path is not None and method.frozen_classifier == "none":
        raise SmoothcertError(f"method {method.name} takes no --classifier (only "
                              f"{', '.join(_classifier_methods())} do)")
    return path


def _classifier_methods() -> list[str]:
    return sorted(n for n, cls in METHODS.items() if cls.frozen_classifier != "none")


def _check_method_noise(method, noise: str) -> None:
    """A method whose loss is written for one noise (e.g. MACER's σΦ⁻¹ radius) refuses another."""
    if method.noises is not None and NOISES[noise].family not in method.noises:
        raise SmoothcertError(f"method {method.name!r} trains with noise "
                              f"{', '.join(method.noises)} only, not {noise!r}")


def _check_sigma_mode(values: dict[str, Any], mode: SigmaMode, method) -> None:
    """A per-sample σ needs a method that trains at one, and the mode may need more epochs."""
    if mode.per_sample and not method.supports_per_sample_sigma:  # (a method without noise too)
        able = sorted(n for n, cls in METHODS.items() if cls.supports_per_sample_sigma)
        raise SmoothcertError(
            f"method {method.name!r} cannot train with a per-sample σ (sigma_mode "
            f"{values['sigma_mode']}); use sigma_mode fixed, or one of: {', '.join(able)}"
        )
    mode.check_epochs(values["epochs"])
    mode.check_noise(values["noise"])


def _check_str(name: str, value) -> str:
    if not isinstance(value, str):
        raise SmoothcertError(f"{name} must be a string, got {value!r}")
    return value


def _check_mapping(name: str, value) -> Mapping:
    if not isinstance(value, Mapping):
        raise SmoothcertError(f"{name} must be a mapping, got {type(value).__name__}")
    return value


def _check_path(name: str, value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise SmoothcertError(f"{name} must be a path or null, got {value!r}")
    return os.fspath(value)


def _check_name(kind: str, value, known) -> str:
    if _check_str(kind, value) not in known:
        raise _unknown(kind, value, known)
    return value


def _check_nesterov(nesterov, momentum) -> bool:
    if check_bool("nesterov", nesterov) and not momentum > 0:
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


def _check_arch(arch, method) -> str:
    """A registered architecture, or ``torchvision:NAME`` / ``timm:NAME`` (the name is checked
    when the model is built, with close names listed), of the role the method trains."""
    zoo, _, name = _check_str("arch", arch).partition(":")
    if not (name and zoo in EXTERNAL_ZOOS):
        _check_name("arch", arch, [*_known_archs(), "torchvision:NAME", "timm:NAME"])
    role = model_role(arch)
    if role != method.trains:
        fitting = [n for n in _known_archs() if model_role(n) == method.trains]
        if method.trains == "classifier":
            fitting += ["torchvision:NAME", "timm:NAME"]
        raise SmoothcertError(f"method {method.name} trains {_ROLE_WORDS[method.trains]}, but "
                              f"--arch {arch} is {_ROLE_WORDS[role]}; archs of role "
                              f"{method.trains}: {', '.join(fitting) or 'none'}")
    return arch


def _check_task(dataset: str, arch: str, method) -> None:
    """The dataset's task (:data:`~smoothcert.data.registry.TASKS`) is one the method's loss is
    written for and, for a method that trains the smoothed model, the arch's outputs."""
    task = DATASETS[dataset].task
    if task not in method.tasks:
        fitting = sorted(n for n, m in METHODS.items() if task in m.tasks)
        raise SmoothcertError(f"method {method.name} trains {' and '.join(method.tasks)} "
                              f"models, not for {task} (dataset {dataset}); methods for "
                              f"{task}: {', '.join(fitting)}")
    if method.trains == "classifier" and model_task(arch) != task:
        fitting = [n for n in _known_archs() if model_role(n) == "classifier"
                   and model_task(n) == task]
        raise SmoothcertError(f"--arch {arch} is for {model_task(arch)} but dataset {dataset} "
                              f"is for {task}; archs for {task}: {', '.join(fitting)}")


_ROLE_WORDS = {"classifier": "a classifier", "denoiser": "a denoiser",
               "diffusion": "a diffusion model"}


def _check_arch_kwargs(arch: str, kwargs) -> dict:
    """The architecture's keyword arguments, checked and completed with their defaults
    (:func:`smoothcert.models.archs.check_arch_kwargs`)."""
    return check_arch_kwargs(arch, kwargs)


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
