"""Registries: the named entries (datasets, architectures, methods, formats, ...) behind the
Python API, the CLI choices and the parametrized tests."""

from __future__ import annotations

import importlib
import pkgutil

from .errors import unknown_name


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
