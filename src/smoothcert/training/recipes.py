"""YAML recipes for ``smoothcert train --config``.

A recipe is a mapping of :class:`~smoothcert.training.TrainConfig` fields. It may name a ``base``
recipe (a path relative to itself) whose fields it extends: the paper's schedule lives in one base
file per dataset and each method/σ recipe only states what differs. ``method_params`` mappings
merge key by key; every other field replaces the base's.

A recipe states the config format it is written in (``format_version``, as a run's
``config.yaml``); one without is read as version 1. The fields of the chain are upgraded together
(:func:`smoothcert.upgrade.upgrade_config`) from the oldest version in it, since an old key in
one file may depend on a field its base sets (the ``dd_*`` keys on ``sigma_mode``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import SmoothcertError
from ..upgrade import CONFIG_VERSION, VERSION_KEY, config_version, upgrade_config


def load_recipe(path) -> dict:
    """The fields of the recipe at ``path`` with its chain of ``base`` recipes resolved, in the
    current config format (with its ``format_version``)."""
    fields, version = _load(Path(path), seen=())
    return upgrade_config(fields, f"recipe {path}", version)


def _load(path: Path, seen: tuple) -> tuple[dict, int]:
    """The merged fields of the chain from ``path`` and the oldest format version in it."""
    if path.resolve() in seen:
        raise SmoothcertError(f"recipe {path} includes itself through 'base'")
    fields = _read(path)
    version = config_version(fields, f"recipe {path}")
    if version > CONFIG_VERSION:
        raise SmoothcertError(f"recipe {path}: config format version {version} is newer than "
                              f"this smoothcert reads ({CONFIG_VERSION}); upgrade smoothcert")
    fields.pop(VERSION_KEY, None)
    base = fields.pop("base", None)
    if base is None:
        return fields, version
    if not isinstance(base, str):
        raise SmoothcertError(f"recipe {path}: base must be the path of a recipe (a string), "
                              f"got {base!r}")
    inherited, older = _load(path.parent / base, seen + (path.resolve(),))
    params = {**_params(inherited, path.parent / base), **_params(fields, path)}
    return {**inherited, **fields, "method_params": params}, min(version, older)


def _params(fields: dict, path: Path) -> dict:
    """The recipe's ``method_params`` (empty when absent), which a base merges key by key."""
    params = fields.get("method_params")
    if params is not None and not isinstance(params, dict):
        raise SmoothcertError(f"recipe {path}: method_params must be a mapping of "
                              f"hyperparameters, got {type(params).__name__} {params!r}")
    return params or {}


def _read(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise SmoothcertError(f"cannot read recipe {path}: {e}") from e
    if not isinstance(data, dict):
        raise SmoothcertError(f"recipe {path} must be a mapping of TrainConfig fields")
    odd = [key for key in data if not isinstance(key, str)]
    if odd:
        raise SmoothcertError(f"recipe {path}: keys must be TrainConfig field names, "
                              f"got {odd[0]!r}")
    return data
