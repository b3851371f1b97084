"""Smoke test of the seed-claims driver: ``run.py --quick`` trains, certifies, publishes and
writes its report pieces into a copy of README.md, and ``smoothcert report`` reads the records.
Not part of ``make test`` (``make studies-smoke`` runs it)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = "/usr/share/datasets/fashion-mnist"


def test_quick_run_publishes_reports_and_resumes(tmp_path):
    cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--out", str(tmp_path),
           "--device", "cpu", *(["--data-root", DATA] if Path(DATA).is_dir() else [])]
    subprocess.run(cmd, check=True)
    records = tmp_path / "records" / "gaussian_s050"
    for stem in ("certify", "sequential", "data_dependent", "data_dependent_k900", "grad_norms"):
        assert (records / f"{stem}.tsv").is_file() and (records / f"{stem}.tsv.manifest.json")
    for name in ("dd_agreement", "grad_norms", "train_cost", "certify_time", "train_time"):
        assert "| --- |" in (tmp_path / "tables" / f"{name}.md").read_text()
    doc = (tmp_path / "README.md").read_text()  # the piece went into its block of the copy
    agreement = (tmp_path / "tables" / "dd_agreement.md").read_text()
    assert f"<!-- report:dd_agreement -->\n{agreement}<!-- /report:dd_agreement -->" in doc
    table = subprocess.run([sys.executable, "-m", "smoothcert.cli", "report",
                            str(records / "certify.tsv"), "--format", "csv"],
                           check=True, stdout=subprocess.PIPE, text=True).stdout
    assert table.splitlines()[1].startswith("certify,4,")  # the quick size: 4 images
    # a second call finds every run published and certifies nothing
    again = subprocess.run([*cmd, "certify"], check=True, stdout=subprocess.PIPE, text=True)
    assert again.stdout.count("done: ") == 2
