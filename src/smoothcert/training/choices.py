"""The help texts of ``smoothcert train`` and ``certify``: the names a field or flag accepts,
each with a one-line summary read off its plug-in (:func:`described`, :func:`keyword_choices`),
and the datasets and architectures with theirs."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

from ..data.registry import DATASETS
from ..models import MODELS
from ..models.archs import EXTERNAL_ZOOS
from ..registry import describe_options


def _summary(obj, width: int = 180) -> str:
    """A one-line summary of ``obj`` for help texts: the first sentence of its docstring, without
    paper titles (the summary keeps authors and venue; the docstring has the title) or markup,
    cut after at most ``width`` characters ('' for no docstring)."""
    text = " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split())
    text = re.sub(r',? "[^"]*"', "", text).replace("``", "")
    text = re.split(r"(?<!\bal)\. (?=[A-Z])", text)[0].rstrip(".")
    if len(text) > width:
        text = text[: width - 1].rsplit(" ", 1)[0] + ","
    return text[:-1].rstrip() + " …" if text.endswith((",", ":", ";")) else text


def described(registry: Mapping[str, Any]) -> dict[str, str]:
    return {name: _summary(entry) for name, entry in registry.items()}


def keyword_choices(registry: Mapping[str, type]) -> dict[str, str]:
    """Each plug-in's summary, then one line per option (a method's hyperparameters, a σ mode's
    parameters, a certifier's options): ``key (type, default D): doc``, read off its options
    dataclass (:func:`~smoothcert.registry.describe_options`); the help lays them out as
    continuation rows ("\t" starts one)."""
    return {name: "\n\t".join([_summary(cls), *describe_options(cls.Options)])
            for name, cls in registry.items()}


def dataset_choices() -> dict[str, str]:
    return {name: _dataset_summary(spec) for name, spec in DATASETS.items()}


def _dataset_summary(spec) -> str:
    c, h, w = spec.input_shape
    classes = f"{spec.num_classes} classes" if spec.num_classes else "classes from the folder"
    if spec.streamed:
        return f"{classes}, {c}×S×S inputs (--image-size, default {h}), image folder streamed " \
               "from --data-root"
    return f"{classes}, {c}×{h}×{w} inputs, held in memory"


def arch_choices() -> dict[str, str]:
    zoos = {f"{zoo}:NAME": _summary(build) for zoo, build in EXTERNAL_ZOOS.items()}
    return {**described(MODELS), **zoos}
