"""Dataset certification runners: one per-example record per input, resumable and sharded.

Every module of this package is imported here, so a new certifier only needs its own file that
calls :func:`register_task`.
"""

from ..registry import import_submodules
from ..runs.runner import (
    TASKS,
    RunConfig,
    RunContext,
    Task,
    certificate_row,
    certify_dataset,
    register_task,
    run_dataset,
)

import_submodules(__name__, __path__, skip=("runner", "inputs"))

__all__ = [
    "TASKS",
    "RunConfig",
    "RunContext",
    "Task",
    "certificate_row",
    "certify_dataset",
    "register_task",
    "run_dataset",
]
