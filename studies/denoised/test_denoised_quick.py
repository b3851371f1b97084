"""Smoke test of the denoised-smoothing driver: ``run.py --quick`` trains the toy classifiers,
denoisers and DDPM, certifies the six pipelines at σ = 0.5, publishes the records, writes the
tables into a copy of README.md, and a second call redoes nothing.
Not part of ``make test`` (``make studies-smoke`` runs it)."""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import VERDICT_WORDS  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
PIPELINES = ["standard", "mse", "stab", "mse_stab", "ddpm", "gaussian"]


def block(doc: str, name: str) -> list[str]:
    """The table rows (header and rule dropped) of README block ``name``."""
    text = doc.split(f"<!-- report:{name} -->\n")[1].split(f"<!-- /report:{name} -->")[0]
    return text.splitlines()[2:]


def test_quick_run_certifies_every_pipeline_and_resumes(tmp_path):
    cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--out", str(tmp_path),
           *(["--data-root", DATA] if Path(DATA).is_dir() else [])]
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    records = tmp_path / "records" / "s050"
    for pipeline in PIPELINES:
        assert (records / f"{pipeline}.tsv").is_file()
    manifest = json.loads((records / "ddpm.tsv.manifest.json").read_text())
    assert "timestep" in json.dumps(manifest)  # the one-shot step t* is in the run identity
    doc = (tmp_path / "README.md").read_text()
    rows = block(doc, "s050")
    assert [row.split(" | ")[0][2:] for row in rows] == PIPELINES
    assert all(row.split(" | ")[1] == "3" for row in rows)  # 3 images each
    cost = block(doc, "cost")
    assert [row.split(" | ")[0][2:] for row in cost] == PIPELINES
    assert all(float(row.split(" | ")[1]) > 0 for row in cost)  # seconds per image
    shares = block(doc, "verdicts")  # the gap shares at σ = 0.5
    assert len(shares) == 1 and shares[0].startswith("| 0.5 | ")
    assert len(shares[0].split(" | ")) == 5
    intervals = block(doc, "intervals")  # five ACR intervals and both claims' verdicts
    assert len(intervals) == 1 and intervals[0].count(" [") == 5
    cells = intervals[0].split(" | ")
    assert cells[3] in VERDICT_WORDS, cells  # the driver's words (driver.judge)
    assert cells[7].rstrip(" |") in VERDICT_WORDS, cells
    capacity = block(doc, "capacity")  # parameters and training of each denoiser
    assert [row.split(" | ")[0][2:] for row in capacity] == ["mse", "stab", "mse_stab", "ddpm"]
    assert all(int(row.split(" | ")[1].replace(",", "")) > 0 for row in capacity)
    for run in ("standard", "gaussian_s050", "mse_s050", "stab_s050", "mse_stab_s050", "ddpm"):
        assert (tmp_path / "records" / "runs" / run / "log.tsv").is_file()
    again = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    assert "checkpoint:" not in again and "records:" not in again  # nothing trained or certified
