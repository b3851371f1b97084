"""YAML recipes for ``smoothcert train --config``.

A recipe is a mapping of :class:`~smoothcert.training.TrainConfig` fields. It may name a ``base``
recipe (a path relative to itself) whose fields it extends: the paper's schedule lives in one base
file per dataset and each method/σ recipe only states what differs. ``method_params`` mappings
merge key by key; every other field replaces the base's.

A recipe states the config format it is written in (``format_version``, as a run's
``config.yaml``); one without is read as version 1. The fields of the chain are upgraded together
(:func:`smoothcert.upgrade.upgrade_config`) from the oldest version in it, since an old key in
one file may depend on a field its base sets (the ``dd_*`` keys on ``sigma_mode``).

The YAML files smoothcert reads (recipes, a run's ``config.yaml`` in ``report --train``) go
through :func:`read_yaml` (``yaml.safe_load``: no tag runs code) and the ``KEY=VALUE`` flags
through :func:`yaml_problem`, so what cannot be read is one line.
"""

from __future__ import annotations

import re
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
    data = read_yaml(path, "recipe")
    if not isinstance(data, dict):
        raise SmoothcertError(f"recipe {path} must be a mapping of TrainConfig fields")
    odd = [key for key in data if not isinstance(key, str)]
    if odd:
        raise SmoothcertError(f"recipe {path}: keys must be TrainConfig field names, "
                              f"got {odd[0]!r}")
    return data


# --------------------------------------------------------------------------- YAML, one line
def read_yaml(path, what: str):
    """The YAML document in the file at ``path`` (a recipe, a run's ``config.yaml``), read with
    ``yaml.safe_load``, so no tag ever constructs an object or runs code. A file that cannot be
    read, is not UTF-8 text or is not YAML is one SmoothcertError line naming ``what``, the
    path and the first problem (where YAML says, its line and column)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise SmoothcertError(f"{what} {path} is not a text file: {not_utf8(err)}") from None
    except OSError as err:
        raise SmoothcertError(f"cannot read {what} {path}: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as err:
        raise SmoothcertError(f"{what} {path} is not valid YAML: {yaml_problem(err)}") from None
    if contains_itself(data):
        raise SmoothcertError(f"{what} {path} contains itself (a YAML alias inside its anchor)")
    return data


def not_utf8(err: UnicodeDecodeError) -> str:
    """Where a file stops being UTF-8 text, in a few words."""
    return f"byte {err.object[err.start]:#04x} at offset {err.start} is not UTF-8"


def yaml_problem(err: BaseException) -> str:
    """What ``yaml.safe_load`` found wrong, in one line: the problem without PyYAML's quoted
    source lines, then its line and column (1-based) when it has them. A tag that asks for a
    Python object (``!!python/object/apply:...``) is named as refused: safe_load never builds
    one."""
    if isinstance(err, RecursionError):
        return "nested too deeply"
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    tag = re.search(r"constructor for the tag '([^']*)'", problem)
    if isinstance(err, yaml.constructor.ConstructorError) and tag:
        problem = f"tag {tag.group(1).replace('tag:yaml.org,2002:', '!!')!r} is not allowed, " \
                  "only plain YAML values"
    mark = getattr(err, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else problem


def contains_itself(value, outer: tuple = ()) -> bool:
    """Whether a list or mapping from YAML holds itself at some depth (``&a [*a]``): configs and
    options are plain trees, and converting or saving a cycle would never end."""
    if not isinstance(value, (list, dict)):
        return False
    if id(value) in outer:
        return True
    items = value.values() if isinstance(value, dict) else value
    return any(contains_itself(item, (*outer, id(value))) for item in items)
