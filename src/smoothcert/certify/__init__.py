"""Dataset certification runners: one per-example record per input, resumable and sharded."""

from .runner import TASKS, RunConfig, Task, register_task, run_dataset

__all__ = ["TASKS", "RunConfig", "Task", "register_task", "run_dataset"]
