"""Smoke test of the data-dependent driver: ``run.py --quick`` trains, certifies both ways and
writes the table into a copy of README.md; a second call resumes without certifying again.
Not part of ``make test`` (``make studies-smoke`` runs it)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = "/usr/share/datasets/fashion-mnist"


def test_quick_run_certifies_both_ways_and_resumes(tmp_path):
    cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--out", str(tmp_path),
           "--device", "cpu", *(["--data-root", DATA] if Path(DATA).is_dir() else [])]
    first = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    rows = [line.split(" | ")[:2] for line in first.splitlines() if line.startswith("| ")]
    assert rows[2:] == [["| fixed_sigma", "3"], ["| data_dependent", "3"], ["| envelope", "–"]]
    doc = (tmp_path / "README.md").read_text()
    assert f"<!-- report:certified -->\n{first}<!-- /report:certified -->" in doc
    for name in ("fixed_sigma", "data_dependent"):
        assert (tmp_path / "records" / f"{name}.tsv.manifest.json").is_file()
    assert (tmp_path / "figures" / "certified_accuracy.png").stat().st_size > 0
    stamp = (tmp_path / "records" / "fixed_sigma.tsv").stat().st_mtime_ns
    assert subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout == first
    assert (tmp_path / "records" / "fixed_sigma.tsv").stat().st_mtime_ns == stamp
