"""Registries: the named entries (datasets, architectures, methods, formats, ...) behind the
Python API, the CLI choices and the parametrized tests."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

from .errors import SmoothcertError, unknown_name


def import_submodules(package: str, path, skip: tuple = ()) -> None:
    """Import every module of ``package`` (its ``__path__``) but ``skip``: each registers its
    entries on import, so a new method or certifier needs only its own file."""
    for module in pkgutil.iter_modules(path):
        if module.name not in skip:
            importlib.import_module(f"{package}.{module.name}")


class Registry(dict):
    """A dict from name to entry whose misses raise one SmoothcertError listing the known names."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def __missing__(self, name):
        raise unknown_name(self.kind, name, self)

    def register(self, name: str):
        """Decorator: add the decorated object under ``name`` (a name is registered once)."""

        def add(entry):
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self[name] = entry
            return entry

        return add

    def build(self, name: str, what: str, **options: Any):
        """The entry ``name`` (a class whose options are keyword-only ``__init__`` arguments with
        defaults) built with ``options``, the rest at their defaults. The one boundary of training
        methods and σ modes: an unknown name, an unknown ``what`` (hyperparameter, parameter) or
        an invalid value raises one :class:`SmoothcertError` naming the valid choices."""
        cls = self[name]
        valid = list(keyword_defaults(cls))
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise SmoothcertError(f"unknown {what}(s) {', '.join(unknown)} for {self.kind} "
                                  f"{name!r}; valid: {', '.join(valid) or '(none)'}")
        try:
            return cls(**options)
        except SmoothcertError as err:
            raise SmoothcertError(f"{self.kind} {name!r}: {err} ({what}s: {', '.join(valid)})"
                                  ) from None


def keyword_defaults(cls) -> dict[str, Any]:
    """The keyword-only arguments of ``cls.__init__`` and their defaults, in declaration order:
    the options of a plug-in (a method's hyperparameters, a certifier's options, ...)."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
