"""What ``smoothcert``'s parser reads from the library — the names of its choices (noises,
certifiers, precisions, attacks, ...) and its help's listings (each certifier with its options,
each training field with its flag, methods, datasets, architectures, ...) — without importing
torch, so that ``--help``, ``--version`` and a mistyped flag answer at once.

The names come from the registries, whose plug-ins import torch (seconds). A process that has
not imported torch (``smoothcert`` itself, until a command runs) reads them from
``catalog.json`` beside this file instead: a snapshot of :func:`live`, which
``tests/cli/test_catalog.py`` holds equal to the registries. A process that has imported torch
(a Python program, the tests) reads the registries themselves, at no further cost and with the
plug-ins it registered. After adding or changing a plug-in (or a training field), regenerate the
snapshot:

    python -m smoothcert.cli.catalog          # writes src/smoothcert/cli/catalog.json
    python -m smoothcert.cli.catalog --check  # exit 1 where the snapshot differs
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import types
import typing
from pathlib import Path

from .common import default_text, with_default

SNAPSHOT = Path(__file__).with_name("catalog.json")


def names(section: str):
    """Section ``section`` of the catalog (e.g. ``"noises"``: name -> summary), as JSON values
    (lists, not tuples): the registries' own where torch is imported, else the snapshot's."""
    if registries_loaded():
        return _as_json(SECTIONS[section]())
    return snapshot()[section]


def registries_loaded() -> bool:
    """Whether this process has imported torch: then the registries cost little beside it,
    and they hold the plug-ins the process registered itself."""
    return "torch" in sys.modules


@functools.cache
def snapshot() -> dict:
    """The committed catalog (``catalog.json``); read once, not to be changed."""
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def live() -> dict:
    """Every section, read from the library (imports torch): what ``catalog.json`` holds."""
    return {name: _as_json(build()) for name, build in SECTIONS.items()}


def _as_json(value):
    """``value`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


# --------------------------------------------------------------------------- the sections
def _noises() -> dict[str, str]:
    """``--noise``: each noise, with its summary (the certify epilog's listing)."""
    from ..noise.base import NOISES
    from ..training.choices import described

    return described(NOISES)


def _certifiers() -> dict[str, str]:
    """``--certifier``: each certifier that certifies, in the registry's order, with its
    summary and one line per option (the certify epilog's listing)."""
    from ..certifiers import CERTIFIERS, certifying
    from ..training.choices import keyword_choices

    offered = certifying()
    return {name: text for name, text in keyword_choices(CERTIFIERS).items() if name in offered}


def _transformations() -> dict[str, str]:
    """``--transform``: each semantic transformation, with its summary and one line per
    parameter (the certify epilog's listing)."""
    from ..training.choices import keyword_choices
    from ..transforms import TRANSFORMS

    return keyword_choices(TRANSFORMS)


def _precisions() -> list[str]:
    """``--precision``: the engine's autocast precisions."""
    from ..smoothing.engine import PRECISIONS

    return list(PRECISIONS)


def _attack() -> dict:
    """``attack``: the attacks (sorted) and the defaults of its settings."""
    from ..certifiers.attack import AttackSettings
    from ..registry import option_values
    from ..smoothing.attacks import ATTACKS

    return {"attacks": sorted(ATTACKS), "defaults": option_values(AttackSettings())}


def _formats() -> list[str]:
    """``report --format``, ``analyze --format``: the table formats (sorted)."""
    from ..evaluation.tables import FORMATS

    return sorted(FORMATS)


def _norms() -> list[str]:
    """``report --norm``: the norms a certified ball may be measured in."""
    from ..noise.base import NORMS

    return list(NORMS)


def _gallery() -> int:
    """``report --gallery``'s default: examples per file in the HTML page's gallery."""
    from ..evaluation.html import GALLERY

    return GALLERY


def _import_checkpoint() -> dict:
    """``import-checkpoint``: the reference formats (sorted, each with the first word of its
    source), the improved/guided-diffusion formats, their presets and the normalizations."""
    from ..denoisers.openai_unet import OPENAI_FORMATS, PRESET_FORMATS
    from ..models.importers import FORMATS, NORMALIZATIONS

    return {"formats": {name: fmt.source.split()[0] for name, fmt in sorted(FORMATS.items())},
            "openai_formats": list(OPENAI_FORMATS), "presets": sorted(PRESET_FORMATS),
            "normalizations": list(NORMALIZATIONS)}


def _train() -> dict:
    """``train``: one flag per TrainConfig field (:func:`train_field`), and the type of each
    deprecated ``--dd-*`` flag (that of the σ-mode parameter it stands for)."""
    from ..training.config import TrainConfig
    from ..training.sigma_modes import build_sigma_mode
    from ..upgrade import DATA_DEPENDENT, OLD_SIGMA_PARAMS

    hints = typing.get_type_hints(TrainConfig)
    defaults = build_sigma_mode(DATA_DEPENDENT).params()
    return {"fields": [train_field(f, hints[f.name]) for f in dataclasses.fields(TrainConfig)],
            "old_sigma_flags": {old: type(defaults[new]).__name__
                                for old, new in OLD_SIGMA_PARAMS.items()}}


SECTIONS = {"noises": _noises, "certifiers": _certifiers, "transformations": _transformations,
            "precisions": _precisions, "attack": _attack, "formats": _formats, "norms": _norms,
            "gallery": _gallery, "import-checkpoint": _import_checkpoint, "train": _train}
"""Section name -> the function that reads it from the library."""


# --------------------------------------------------------------------------- train's fields
def train_field(f: dataclasses.Field, hint) -> dict:
    """The flag of TrainConfig field ``f`` (annotated ``hint``), from its metadata: its
    ``flag``, ``dest``, ``metavar``, ``help`` (with the field's default, or that it is
    required), the ``kind`` of its values (int, float, str, bool: a switch, tuple: integers
    ``30,60``, dict: KEY=VALUE, repeatable) and the names it takes with their summaries
    (``choices``, listed in the epilog; None for a field without)."""
    choices = f.metadata["choices"]
    return {"flag": field_flag(f), "dest": f.name, "metavar": f.metadata["metavar"],
            "help": _field_help(f), "kind": _flag_type(hint).__name__,
            "choices": None if choices is None else choices()}


def field_flag(f: dataclasses.Field) -> str:
    """The flag of TrainConfig field ``f``: its metadata's, else ``--field-name``."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _flag_type(hint) -> type:
    """``int`` for ``int | None``, ``tuple`` for ``tuple[int, ...]``, the type itself else."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return typing.get_origin(hint) or hint


def _field_help(f: dataclasses.Field) -> str:
    text = f.metadata["help"]
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return f"{text}; required (flag or --config)"
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    shown = ("on" if default else "off") if isinstance(default, bool) else default_text(default)
    return with_default(text, shown)


# --------------------------------------------------------------------------- regeneration
def main(argv=None) -> int:
    """Write ``catalog.json`` from the registries; with ``--check``, exit 1 (and say so) where
    the committed one differs instead."""
    args = sys.argv[1:] if argv is None else argv
    text = json.dumps(live(), indent=1, ensure_ascii=False) + "\n"
    if "--check" in args:
        if SNAPSHOT.read_text(encoding="utf-8") != text:
            print(f"{SNAPSHOT} differs from the registries; regenerate it with "
                  "python -m smoothcert.cli.catalog", file=sys.stderr)
            return 1
        return 0
    SNAPSHOT.write_text(text, encoding="utf-8")
    print(f"catalog: {SNAPSHOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
