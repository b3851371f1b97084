"""Smoke test of the semantic-transformations driver: ``run.py --quick`` trains the seven LeNets
for one epoch on 300 examples, certifies 3 images per record file (n = 300) and writes every
table, verdict and the cost block into a copy of README.md. Not part of ``make test``
(``make studies-smoke`` runs it; pyproject's testpaths is tests/)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import generated_block as block  # noqa: E402
from driver import quick_readme  # noqa: E402

TRANSFORMS = ("brightness", "contrast", "brightness_contrast", "blur_exp2", "translation3",
              "rotation10", "scaling10")
EXTRA = {"rotation10": ["rotation10_gaussian"], "scaling10": ["scaling10_gaussian"]}


def test_quick_run_writes_every_table_and_verdict(tmp_path):
    doc = quick_readme(HERE, tmp_path)
    for t in TRANSFORMS:
        rows = block(doc, f"table_{t}")[2:]  # ours, on the 3 images both files hold
        names = [f"| {t}_tss", f"| {t}_standard", *(f"| {e}" for e in EXTRA.get(t, []))]
        assert [r.split(" | ")[0] for r in rows] == names, rows
        assert all(" | 3 | " in r for r in rows), rows
        theirs = block(doc, f"authors_{t}")[2:]  # the authors' 500 MNIST images
        assert len(theirs) == 1 and theirs[0].startswith(f"| authors_{t} | 500 | "), theirs
    verdicts = block(doc, "verdicts")[2:]
    assert len(verdicts) == len(TRANSFORMS) + 2 and all(" | 3 | " in r for r in verdicts)
    claims = block(doc, "claims")
    assert len(claims) == len(TRANSFORMS) and all("**" in line for line in claims)
    cost = block(doc, "cost")[2:]
    assert any(r.startswith("| gaussian_cost | 3 | ") for r in cost), cost
