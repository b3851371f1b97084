"""Smoke test of the tighter-certificates driver: ``run.py --quick`` trains the four models for
one epoch on 300 examples, certifies 3 images with each certifier and writes every table and
verdict block into a copy of README.md. Not part of ``make test`` (``make studies-smoke`` runs
it)."""

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
    for name, files in (("dsrs", 8), ("cascade", 4), ("aces", 4), ("cost", 12)):
        rows = block(doc, name)[2:]
        assert len(rows) == files and all(" | 3 | " in row for row in rows), (name, rows)
    assert len(block(doc, "verdict_dsrs")[2:]) == 4
    assert len(block(doc, "verdict_cascade")[2:]) == 8
    assert len(block(doc, "verdict_aces")[2:]) == 3
