"""A certifier's other models, by role: ACES' selection and core models, a cascade's levels.

Most certifiers smooth one classifier (the run's model). Some compose several: a certifier
declares the roles it takes (``Certifier.model_roles``, checked by ``check_models``), and
``certify_dataset(..., models={role: checkpoint or module})`` or ``smoothcert certify --model
ROLE=CKPT`` gives them. Each is loaded like the run's model (a checkpoint path, a train run
folder or an ``nn.Module``) on the run's device, its input shape checked against the data (its
classes may differ: a selection model has two), and fingerprinted: the run identity's
``models`` maps each role to its SHA-256, so a rerun with another model in a role is refused.
Certifiers reach them as ``RunContext.models`` (role → :class:`~.inputs.ModelSource`) and
forward draws through them with ``Draws(model=..., num_classes=...)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from ..errors import SmoothcertError
from ..tensors import eval_mode
from .inputs import Examples, ModelSource, load_source


def load_roles(models: Mapping | None, certifier, device) -> dict[str, ModelSource]:
    """The models of ``models`` (role → checkpoint or module) loaded on ``device``, after the
    certifier has accepted their roles (``certifier.check_models``: a role it does not take,
    or one it needs and did not get, is one line)."""
    models = dict(models or {})
    for role in models:
        if not isinstance(role, str) or not role:
            raise SmoothcertError(f"a model's role must be a non-empty name, got {role!r}")
    certifier.check_models(frozenset(models))
    return {role: load_source(spec, device) for role, spec in sorted(models.items())}


def role_fingerprints(sources: Mapping[str, ModelSource]) -> dict | None:
    """The run identity's ``models``: role → SHA-256 (None when there are none, so that the
    identities of runs of one model stay what they were)."""
    return {role: s.sha256 for role, s in sorted(sources.items())} or None


def check_role_shapes(sources: Mapping[str, ModelSource], data: Examples) -> None:
    """Each role's model must read the data's inputs (its classes are the certifier's to
    check)."""
    for role, source in sources.items():
        shape = source.meta.get("input_shape") or getattr(source.model, "input_shape", None)
        if shape is not None and data.input_shape is not None \
                and tuple(shape) != tuple(data.input_shape):
            raise SmoothcertError(f"the {role} model expects inputs of shape {tuple(shape)}, "
                                  f"dataset {data.name!r} has {tuple(data.input_shape)}")


@contextlib.contextmanager
def roles_in_eval_mode(sources: Mapping[str, ModelSource]):
    """Every role's model in eval mode for the block (restored after)."""
    with contextlib.ExitStack() as stack:
        for source in sources.values():
            stack.enter_context(eval_mode(source.model))
        yield
