"""Smoke test of the sequential driver: ``run.py --quick`` trains a tiny model, runs
benchmarks/sequential.py on it and writes both grids' tables into a copy of README.md.
Not part of ``make test`` (``make studies-smoke`` runs it)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = "/usr/share/datasets/fashion-mnist"


def test_quick_run_writes_both_grids(tmp_path):
    cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--out", str(tmp_path),
           *(["--data-root", DATA] if Path(DATA).is_dir() else [])]
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    doc = (tmp_path / "README.md").read_text()
    for block, grid in (("grid_075", "0_0.25_0.5_0.75"), ("grid_050", "0_0.25_0.5")):
        table = doc.split(f"<!-- report:{block} -->\n")[1].split(f"<!-- /report:{block} -->")[0]
        names = [line.split(" | ")[0][2:] for line in table.splitlines()[2:]]
        assert names == ["fixed_n"] + [f"sequential_{t}_{grid}"
                                       for t in ("union", "mixture", "targeted")]
        assert all(" | 3 | " in line for line in table.splitlines()[2:])  # 3 images each
