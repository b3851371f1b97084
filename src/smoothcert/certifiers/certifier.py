"""Certifiers: one per-input program per algorithm, registered by name.

A certifier turns one input into one record row. The dataset runner (``runs/runner.py``) owns
everything around it — the model and the examples, the per-example generators seeded from
(seed, idx), resuming, sharding, timing, the record file — and drives the programs of many
inputs through the one Monte Carlo engine, so that forward batches are filled across inputs.
A certifier's options are one frozen dataclass, its nested ``Options`` (as a training method's
hyperparameters, ``methods/base.py``), checked by :func:`smoothcert.registry.parse_options`
whichever way the certifier is built; the options, completed with the defaults, are part of a
run's identity. A certifier also declares the rules of the record columns it adds
(``column_rules``, ``relations``: :mod:`.columns`), which the record schema collects.

To add a certifier, write ``certifiers/<name>.py`` with one ``@register_certifier`` class; the
contract test (``tests/certifiers/test_certifier_contract.py``) then runs it on the closed-form
halfspace oracle, through a kill and a resume, and through shards and a merge.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import SmoothcertError
from ..noise.base import NORMS, convert_radius
from ..registry import Configurable, Registry
from ..smoothing.smoothed import Certificate
from .columns import RADIUS_COLUMNS, RADIUS_NORMS, Column, Relation, radius_column

CERTIFIERS: Registry = Registry("certifier")
"""Every per-input program of the dataset runner, the attack (``attack.py``, ``certifies`` False)
included: one name for the program in code (``RunConfig.certifier``), on the command line
(``--certifier``) and in records (the identity's ``certifier``)."""


def certifying() -> list[str]:
    """The names of the registered certifiers that give a certificate (``certifies``), sorted:
    the choices of ``--certifier``. The others (the attack) have a command of their own."""
    return sorted(name for name, cls in CERTIFIERS.items() if cls.certifies)


@dataclass(frozen=True)
class RunContext:
    """What a certifier may use across a run: rows already written (when resuming) included."""

    config: Any  # runs.runner.RunConfig
    smoothed: Any  # smoothing.Smoothed, with the run's noise at the run's σ
    dataset: Any  # runs.inputs.Examples: example(idx) -> (x, label)
    done: Any  # runs.records.Records of this shard's file (empty without a file)
    device: torch.device
    models: Mapping[str, Any] = field(default_factory=dict)  # role → runs.inputs.ModelSource


class Certifier(Configurable, abc.ABC):
    """A per-input algorithm of the dataset runner.

    Subclasses declare their options as a nested frozen dataclass ``Options`` (typed fields with
    defaults and one-line docs, checked in its ``__post_init__`` raising
    :class:`SmoothcertError`), read them as attributes of the same name, and implement
    :meth:`program`. Class attributes: ``columns`` of its records (the runner adds idx, label,
    time and seed), ``column_rules`` and ``relations`` (the rules of the columns it adds to
    :data:`.columns.CERTIFY_RULES`), ``needs_n0`` (it takes CERTIFY's selection draws ``n0``),
    ``noises`` (the noise names whose certificate it computes; None: every registered noise),
    ``certifies`` (its rows hold a certificate; False for an empirical evaluation such as the
    attack, which ``certify --certifier`` does not offer), ``varies_sigma`` (it smooths each
    input at a σ of its own, so a denoiser tuned to the run's one σ, as a diffusion denoiser's
    timestep, does not fit it), ``uses_noise`` (False: it draws no noise, e.g. ablation
    smoothing; its runs take no ``--noise``/``--sigma`` and their identity says noise "none",
    σ 0). ``model_roles``: the other models it composes with the run's, by role (ACES'
    ``selection`` and ``core``; :mod:`smoothcert.runs.roles`), checked by :meth:`check_models`.
    ``tasks``: the tasks of the models it certifies (:data:`~smoothcert.data.registry.TASKS`;
    a segmentation certifier's programs receive an (H, W) mask as the label, a regression
    one's a (D,) target, and their rows have no ``label`` column unless ``columns`` has one).
    """

    plugin_kind = "certifier"
    columns: tuple = ()
    column_rules: ClassVar[Mapping[str, Column]] = {}
    relations: ClassVar[tuple[Relation, ...]] = ()
    needs_n0: bool = False
    noises: tuple | None = None
    certifies: ClassVar[bool] = True
    varies_sigma: ClassVar[bool] = False
    uses_noise: ClassVar[bool] = True
    model_roles: ClassVar[tuple[str, ...]] = ()
    sigma_list_option: ClassVar[str | None] = None  # the option a --sigma list goes to
    tasks: ClassVar[tuple[str, ...]] = ("classification",)

    def options(self) -> dict[str, Any]:
        """The options as plain values (the run identity's ``options``)."""
        return self.option_values()

    def shardable(self) -> bool:
        """Whether examples may be split across shards (false when the certificate of one input
        depends on the others', e.g. the data-dependent memory)."""
        return True

    def clean_passes(self) -> int:
        """Forward passes of the model on the clean input, per example, beyond its n0 + n noisy
        draws (a clean prediction: 1); what ``report --cost`` adds for a model that does not
        meter its passes (an ensemble's ``member_passes`` meter them all)."""
        return 0

    def row_passes(self, records) -> np.ndarray | None:
        """Forward passes of the base classifier per row of a record file of this certifier
        (``records``: column name → values, as ``runs.records.Records``): n0 + n (the selection
        and estimation draws; a sequential file's n is the draws it used) plus
        :meth:`clean_passes`; None without an ``n`` column and a clean pass (Cohen et al.'s
        files keep only the radius). A certifier whose draws are not n0 + n counts its own
        (DSRS's Q draws, a cascade's levels, ACES' selection); None where its file cannot say."""
        clean = self.clean_passes()
        if "n" not in records:
            return np.full(len(records), float(clean)) if clean else None
        n0 = np.asarray(records["n0"], dtype=np.float64) if "n0" in records else 0.0
        return np.asarray(records["n"], dtype=np.float64) + n0 + clean

    def radius_norm(self) -> str | None:
        """What this certifier's ``radius`` column measures, when it is not a ball of the run's
        noise: None (the default) means the noise's norm (``noise.norm``: ℓ2 for Gaussian noise,
        ℓ1 for uniform), with ``radius_l1``, ``radius_l2``, ``radius_linf`` beside it where the
        certifier records them. A certifier whose radius is another quantity returns a short
        label of its unit, shown as is by ``report`` (e.g. ``"patch side, pixels"``,
        ``"ℓ0, pixels changed"``): at most 40 characters, one line, no tab. It may depend on the
        options (one certifier, two units by ``mode``) but not on the run or the rows: ``report``
        asks a certifier built from the record file's manifest (its certifier name and options),
        and refuses ``--norm`` for such files (their radius is no ℓp distance)."""
        return None

    def check(self, config) -> None:
        """Refuse a run configuration (a ``RunConfig``) this certifier cannot serve, before any
        file is written: raise :class:`~smoothcert.errors.SmoothcertError`."""
        return None

    def check_model(self, model: torch.nn.Module, input_shape) -> None:
        """Refuse the run's model, or its inputs' shape (C, H, W; None: unknown), before any
        file is written (e.g. ablation: a model without the ablation encoding). By default
        a certifier that smooths with noise refuses a model whose first layer reads encoded
        inputs (``input_encoding``: ablated pixels): noise on such a model certifies nothing
        its training prepared it for."""
        self._refuse_encoded(model, "the model")

    def _refuse_encoded(self, model: torch.nn.Module, who: str) -> None:
        """A certifier that smooths with noise takes no model of encoded inputs (above)."""
        encoding = getattr(model, "input_encoding", None)
        if self.uses_noise and encoding is not None:
            raise SmoothcertError(f"{who} reads {encoding}-encoded inputs (trained with "
                                  f"--method {encoding}); certify it with --certifier "
                                  f"{encoding}, not {self.name!r}")

    def needed_roles(self) -> tuple[str, ...]:
        """The other models this configuration reads: :attr:`model_roles` (a certifier whose
        options decide, as ACES' selection source, returns fewer)."""
        return self.model_roles

    def check_models(self, roles: frozenset) -> None:
        """Refuse the roles of the other models given (``certify --model ROLE=CKPT``) before
        anything is loaded: exactly :meth:`needed_roles`, every one of them."""
        needed = self.needed_roles()
        unknown, missing = sorted(roles - set(needed)), sorted(set(needed) - roles)
        if unknown:
            takes = f"takes the models {', '.join(needed)}" if needed else "takes no other model"
            raise SmoothcertError(f"certifier {self.name!r} {takes}, not {', '.join(unknown)}")
        if missing:
            raise SmoothcertError(f"certifier {self.name!r} needs a model for "
                                  f"{', '.join(missing)} (--model ROLE=CKPT)")

    def check_sources(self, sources: Mapping[str, Any], num_classes: int) -> None:
        """Refuse the other models themselves (role → ``runs.inputs.ModelSource``, loaded) for a
        run of ``num_classes`` classes, before any file is written (e.g. ACES: a selection model
        must have 2 classes); :meth:`check_models` has accepted their roles. By default each
        is refused as :meth:`check_model` refuses the run's model for its encoding: the roles
        of a certifier with noise (a cascade's levels, ACES' core and selection) are models of
        the same inputs."""
        for role, source in sources.items():
            self._refuse_encoded(source.model, f"the {role} model")

    def checkpoint_roles(self, count: int) -> tuple[str, ...] | None:
        """The roles of the command line's checkpoints after the first when it gives ``count``
        of them (a cascade: one per level), or None (the default): several checkpoints form
        one ensemble, the run's model."""
        return None

    def start(self, run: RunContext) -> None:
        """Called once per run before any program, with the rows already written when resuming:
        a certifier that keeps state across inputs rebuilds it here."""
        return None

    @abc.abstractmethod
    def program(self, run: RunContext, x: torch.Tensor, label: int, idx: int,
                generator: torch.Generator) -> Generator:
        """The engine program of one input x (C, H, W): it yields ``sampling.Draws`` requests,
        receives their counts, and returns the row's own columns as a dict. Every random draw
        comes from ``generator`` (seeded from (seed, idx)). A program may also compute without
        yielding (e.g. gradient steps, soft scores); the runner times it all the same."""


def register_certifier(name: str) -> Callable[[type[Certifier]], type[Certifier]]:
    """Class decorator: make a :class:`Certifier` runnable as ``--certifier name``."""

    def register(cls: type[Certifier]) -> type[Certifier]:
        cls.name = name
        return CERTIFIERS.register(name)(cls)

    return register


def build_certifier(cls: type[Certifier], given: Mapping[str, Any]) -> Certifier:
    """``cls`` with the options ``given`` (the rest at their defaults), checked by
    :func:`smoothcert.registry.parse_options`: an unknown key, a value of another type or
    outside its choices is refused with one clear line naming the certifier."""
    return cls(**given)


CERTIFY_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time",
                   "p_lower", "nA", "n0", "n", "alpha", "sigma", *RADIUS_COLUMNS, "seed")
"""Cohen et al.'s columns first, then CERTIFY's, the radius in every norm and the seed."""


def certificate_row(c: Certificate, label: int) -> dict:
    """The columns of a CERTIFY record from a :class:`Certificate` (−1: abstention), with the
    radius in every norm where the certificate has them (``c.radii``; one made by hand may
    not)."""
    predict = -1 if c.abstained else c.prediction
    return {"predict": predict, "radius": c.radius, "correct": int(predict == label),
            "p_lower": c.p_lower, "nA": c.count, "n0": c.n0, "n": c.n, "alpha": c.alpha,
            "sigma": c.sigma, **(radius_columns(c.radii) if c.radii else {})}


def radius_columns(radii: Mapping[str, float]) -> dict[str, float]:
    """``{"radius_l1": .., "radius_l2": .., "radius_linf": ..}`` from radii by norm."""
    return {radius_column(norm): float(radii[norm]) for norm in RADIUS_NORMS}


def converted_radii(radius: float, norm: str, dim: int) -> dict[str, float]:
    """The radius in every norm implied by a certified ``norm`` ball of ``radius`` at an input
    of ``dim`` = C·H·W coordinates, by the norms' inequalities alone
    (:func:`~smoothcert.noise.base.convert_radius`): what a certifier records whose certificate
    is one ball in one norm (the runner-up's, a sequential grid radius, a memory-adjusted
    ball), since the noise's direct radii in other norms hold for p_lower, not for that ball.
    ``radii[norm]`` is ``radius`` itself."""
    return {target: float(radius) if target == norm
            else float(convert_radius(float(radius), norm, target, dim)) for target in NORMS}
