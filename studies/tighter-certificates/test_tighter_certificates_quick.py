"""Smoke test of the tighter-certificates driver: ``run.py --quick`` trains the models for one
epoch on 300 examples (the Gaussian and generalized-Gaussian LeNets, the standard cores),
certifies 3 images with each certifier and writes every table and verdict block into a copy of
README.md. Not part of ``make test`` (``make studies-smoke`` runs
it)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import generated_block as block  # noqa: E402
from driver import quick_readme  # noqa: E402


def test_quick_run_writes_every_table_and_verdict(tmp_path):
    doc = quick_readme(HERE, tmp_path)
    for name, files in (("dsrs", 8), ("dsrs_paper", 8), ("dsrs_xplus", 2), ("cascade", 4),
                        ("aces", 4), ("cost", 22)):
        rows = block(doc, name)[2:]
        assert len(rows) == files and all(" | 3 | " in row for row in rows), (name, rows)
    assert len(block(doc, "verdict_dsrs")[2:]) == 4
    assert len(block(doc, "verdict_dsrs_paper")[2:]) == 4
    assert len(block(doc, "verdict_dsrs_xplus")[2:]) == 1
    assert "(1) DSRS certifies more" in "".join(block(doc, "claims"))
    assert len(block(doc, "verdict_cascade")[2:]) == 8
    assert len(block(doc, "verdict_aces")[2:]) == 3
