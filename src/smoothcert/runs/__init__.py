"""Dataset runs: one record per example, resumable and sharded.

``runner.py`` (``certify_dataset``, ``RunConfig``), ``inputs.py`` (the model and the examples),
``rows.py`` (a run's rows through the engine), ``records.py`` (record files and manifests).
The per-input programs, the attack included, are the certifiers (``certifiers/``).
"""

from .runner import RunConfig, certifier_class, certify_dataset, execute, run_dataset

__all__ = ["RunConfig", "certifier_class", "certify_dataset", "execute", "run_dataset"]
