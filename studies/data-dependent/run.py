"""Driver of the data-dependent study: fixed-σ CERTIFY against Alfarra et al.'s data-dependent
certification of one Fashion-MNIST LeNet (Gaussian σ = 0.25, the full 90-epoch recipe).

    python studies/data-dependent/run.py [--device D] [--data-root DIR] [--quick] [--out DIR]

Guarantees: resumable (a complete record file is not certified again, so the model is trained
only while a record file is missing or partial; training and certification resume where they
stopped); committed records are never rewritten; ``--quick`` (1 epoch on 300 examples, 3 images,
n = 300) writes only under runs/studies-quick/data-dependent (or ``--out``), with a copy of
README.md for the table.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import ROOT, SMOOTHCERT, call, data_flags, output_folder, parser, readme  # noqa: E402

RECIPE = ROOT / "configs" / "fashion-mnist" / "gaussian_s025.yaml"
FILES = {"fixed_sigma": [], "data_dependent": ["--certifier", "data-dependent"]}


def complete(path: Path, rows: int) -> bool:
    return path.is_file() and sum(1 for _ in path.open()) > rows


def main(argv=None) -> int:
    p = parser(__doc__, "data-dependent", "records, figures and README.md")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    args = p.parse_args(argv)
    out = output_folder(args, HERE, "data-dependent")
    work = out / "work" if args.quick else ROOT / "runs" / "data-dependent"
    data = data_flags(args)
    device = ["--device", args.device, "--no-progress", *data]
    images, n, n0 = (3, 300, 20) if args.quick else (200, 10_000, 100)
    for folder in (out / "records", out / "figures"):
        folder.mkdir(parents=True, exist_ok=True)
    doc = readme(out, HERE)
    records = {name: out / "records" / f"{name}.tsv" for name in FILES}
    if not all(complete(path, images) for path in records.values()):
        quick = ["--epochs", "1", "--train-size", "300"] if args.quick else []
        call([*SMOOTHCERT, "train", "--config", str(RECIPE), "--out", str(work), "--resume",
              *quick, *device], capture=True)
        for name, flags in FILES.items():
            if not complete(records[name], images):
                call([*SMOOTHCERT, "certify", str(work / "checkpoint.pt"), *flags,
                      "--sigma", "0.25", "--n0", str(n0), "--n", str(n), "--alpha", "0.001",
                      "--batch", "10000", "--skip", "50", "--max", str(images),
                      "--out", str(records[name]), *device], capture=True)
        if not (out / "records" / "train_log.tsv").exists():
            shutil.copyfile(work / "log.tsv", out / "records" / "train_log.tsv")
    files = [str(path) for path in records.values()]
    print(call([*SMOOTHCERT, "report", *files, "--radii", "0:1:0.125", "--envelope",
                "--into", str(doc), "--block", "certified"], capture=True), end="")
    call([*SMOOTHCERT, "report", *files, "--radii", "0:1.25:0.25",
          "--plot", str(out / "figures" / "certified_accuracy.png"),
          "--ecdf", str(out / "figures" / "pa_ecdf.png")], capture=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
