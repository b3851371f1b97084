"""Smoke test of the threat-models driver: ``run.py --quick`` trains every run for one epoch on
300 examples, certifies 3 images each and writes every table and verdict block into a copy of
README.md. Not part of ``make test`` (``make studies-smoke`` runs it)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import generated_block as block  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def test_quick_run_writes_every_table_and_verdict(tmp_path):
    cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--out", str(tmp_path),
           *(["--data-root", DATA] if Path(DATA).is_dir() else [])]
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    doc = (tmp_path / "README.md").read_text()
    units = {"l1": "ℓ1", "linf": "ℓ∞", "l2": "ℓ2", "patches": "patch side, pixels",
             "l0": "ℓ0, pixels changed"}
    for name, unit in units.items():
        rows = block(doc, name)[2:]
        assert rows and all(f" | {unit} | 3 | " in row for row in rows), (name, rows)
    for name, count in (("verdict_l1", 2), ("verdict_linf", 3), ("verdict_patches", 1)):
        rows = block(doc, name)[2:]
        assert len(rows) == count and all(" | 3 | " in row for row in rows), (name, rows)
