"""Dataset runs: one record per example, resumable and sharded.

``runner.py`` (``certify_dataset``, ``RunConfig``), ``inputs.py`` (the model and the examples),
``records.py`` (record files and manifests), ``attack.py`` (the attack program).
"""

from . import attack  # noqa: F401  (registers the attack program)
from .runner import EVALUATIONS, RunConfig, certify_dataset, execute, run_dataset, task_class

__all__ = ["EVALUATIONS", "RunConfig", "certify_dataset", "execute", "run_dataset", "task_class"]
