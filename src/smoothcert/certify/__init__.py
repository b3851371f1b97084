"""Dataset certification runners: one per-example record per input, resumable and sharded.

Every module of this package is imported here, so a new certifier only needs its own file that
calls :func:`register_task`.
"""

import importlib
import pkgutil

from .runner import (
    TASKS,
    RunConfig,
    RunContext,
    Task,
    certificate_row,
    register_task,
    run_dataset,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "runner":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "TASKS",
    "RunConfig",
    "RunContext",
    "Task",
    "certificate_row",
    "register_task",
    "run_dataset",
]
