"""Smoke test of the threat-models driver: ``run.py --quick`` trains every run for one epoch on
300 examples, certifies 3 images each and writes every table and verdict block into a copy of
README.md. Not part of ``make test`` (``make studies-smoke`` runs it)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import generated_block as block  # noqa: E402
from driver import quick_readme  # noqa: E402


def test_quick_run_writes_every_table_and_verdict(tmp_path):
    doc = quick_readme(HERE, tmp_path)
    units = {"l1": "ℓ1", "linf": "ℓ∞", "l2": "ℓ2", "patches": "patch side, pixels",
             "l0": "ℓ0, pixels changed"}
    for name, unit in units.items():
        rows = block(doc, name)[2:]
        assert rows and all(f" | {unit} | 3 | " in row for row in rows), (name, rows)
    for name, count in (("verdict_l1", 2), ("verdict_linf", 3), ("verdict_patches", 1)):
        rows = block(doc, name)[2:]
        assert len(rows) == count and all(" | 3 | " in row for row in rows), (name, rows)
