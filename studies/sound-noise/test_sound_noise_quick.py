"""Smoke test of the sound-noise driver: ``run.py --quick`` trains a tiny model, times both
noises, certifies it under both and writes the table into a copy of README.md.
Not part of ``make test`` (``make studies-smoke`` runs it)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = "/usr/share/datasets/fashion-mnist"


def test_quick_run_certifies_under_both_noises(tmp_path):
    cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--out", str(tmp_path),
           *(["--data-root", DATA] if Path(DATA).is_dir() else [])]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    assert "| lenet |" in out  # the throughput table
    doc = (tmp_path / "README.md").read_text()
    table = doc.split("<!-- report:sound_s025 -->\n")[1].split("<!-- /report:sound_s025 -->")[0]
    rows = [line.split(" | ")[:2] for line in table.splitlines()[2:]]
    assert rows == [["| gaussian", "3"], ["| discrete-gaussian", "3"]]
    for noise in ("gaussian", "discrete-gaussian"):
        assert (tmp_path / "records" / "sound_s025" / f"{noise}.tsv.manifest.json").is_file()
