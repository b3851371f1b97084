"""Smoke test of the segmentation-and-boxes driver: ``run.py --quick`` trains the five models for
one epoch on 300 examples, certifies 3 images with each run and writes every table and verdict
block into a copy of README.md. Not part of ``make test`` (``make studies-smoke`` runs it)."""

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
    for name, files in (("segment", 8), ("median", 2), ("verdict_holm", 4), ("clean_error", 3)):
        rows = block(doc, name)[2:]
        assert len(rows) == files and all(" 3 |" in row for row in rows), (name, rows)
    assert len(list((tmp_path / "records" / "seg_s025_t075_holm.tsv.map").glob("*.png"))) == 3
