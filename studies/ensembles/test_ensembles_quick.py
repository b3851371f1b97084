"""Smoke test of the ensembles driver: ``run.py --quick`` trains six toy LeNets, certifies 3
images with every variant (2 with the cost step's) and writes the four tables into a copy of
README.md. Not part of
``make test`` (``make studies-smoke`` runs it)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = "/usr/share/datasets/fashion-mnist"


def test_quick_run_writes_both_tables(tmp_path):
    cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--out", str(tmp_path),
           *(["--data-root", DATA] if Path(DATA).is_dir() else [])]
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    doc = (tmp_path / "README.md").read_text()
    for block in ("s025", "s050"):
        table = doc.split(f"<!-- report:{block} -->\n")[1].split(f"<!-- /report:{block} -->")[0]
        names = [line.split(" | ")[0][2:] for line in table.splitlines()[2:]]
        assert names == ["seed0", "seed1", "seed2", "ensemble", "ensemble_k2", "ensemble_k3",
                         "runner_up_seed0", "runner_up_ensemble"]
        assert all(" | 3 | " in line for line in table.splitlines()[2:])  # 3 images each

    for block in ("cost_s025", "cost_s050"):
        text = doc.split(f"<!-- report:{block} -->\n")[1].split(f"<!-- /report:{block} -->")[0]
        table = [line for line in text.splitlines() if line.startswith("| ")]
        assert [line.split(" | ")[0][2:] for line in table[2:]] == [
            "seed0", "ensemble", "ensemble_k2", "ensemble_softmax", "ensemble_exact"]
        passes = [float(line.split(" | ")[-2]) for line in table[2:]]  # 2 images, n0 + n = 300
        assert passes[:3] == [300, 900, passes[2]] and 600 <= passes[2] <= 900, passes
        assert 600 <= passes[4] <= passes[3] == 900, passes  # exact: 2 or 3 members per draw
        assert "ensemble_softmax's (every column but time and member_passes): yes" in text


def test_runner_up_gain_table():
    """Rest on one class: the runner-up's bound is a little below CERTIFY's (α split); rest
    spread: above it, and nonzero where CERTIFY abstains."""
    out = subprocess.run([sys.executable, str(HERE / "runner_up_gain.py")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    rows = [line.strip("| ").split(" | ") for line in out.splitlines()[4:]]
    assert len(rows) == 24
    for _, p_a, rest, certify, runner_up, _ in rows:
        certify, runner_up = float(certify), float(runner_up)
        if rest == "one":
            assert runner_up <= certify and (certify == 0) == (float(p_a) <= 0.5)
        else:
            assert runner_up > max(certify, 0.1)
