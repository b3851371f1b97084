"""Driver of the sequential study: the sequential certifier against fixed-n CERTIFY (n = 100,000)
on the committed Fashion-MNIST LeNet, through benchmarks/sequential.py, then the certified
accuracy of every record file into README.md's blocks.

    python studies/sequential/run.py [--timing-images K] [--data-root DIR] [--quick] [--out DIR]

Guarantees: resumable (benchmarks/sequential.py resumes complete and partial record files, so on
the committed records it only re-times); committed records are never rewritten; ``--quick``
trains a 1-epoch model on 300 examples and certifies 3 images with n = 500 under
runs/studies-quick/sequential (or ``--out``), with a copy of README.md for the tables.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import ROOT, SMOOTHCERT, call, data_flags, output_folder, parser, readme  # noqa: E402

CHECKPOINT = HERE / "records" / "fmnist_lenet_s025.pt"  # committed; its recipe beside it
GRIDS = {"grid_075": "0,0.25,0.5,0.75", "grid_050": "0,0.25,0.5"}


def main(argv=None) -> int:
    p = parser(__doc__, "sequential", "records and README.md")
    p.add_argument("--timing-images", type=int, default=4,
                   help="images CERTIFY is timed on before and after (0: no wall clock)")
    args = p.parse_args(argv)
    out = output_folder(args, HERE, "sequential")
    data = data_flags(args)
    (out / "records").mkdir(parents=True, exist_ok=True)
    doc = readme(out, HERE)
    checkpoint, sizes = CHECKPOINT, ["--timing-images", str(args.timing_images)]
    if args.quick:
        checkpoint = out / "model" / "checkpoint.pt"
        call([*SMOOTHCERT, "train", "--config", str(HERE / "records/fmnist_lenet_s025.config.yaml"),
              "--epochs", "1", "--train-size", "300", "--out", str(checkpoint.parent), "--resume",
              "--no-progress", *data])
        sizes = ["--max", "3", "--n", "500", "--timing-images", "1"]
    call([sys.executable, str(ROOT / "benchmarks" / "sequential.py"), "--checkpoint",
          str(checkpoint), "--out-dir", str(out / "records"), "--grids", *GRIDS.values(),
          "--tests", "union", "mixture", "targeted", *sizes, *data])
    for block, grid in GRIDS.items():
        suffix = grid.replace(",", "_")
        files = [out / "records" / "fixed_n.tsv"] + [
            out / "records" / f"sequential_{test}_{suffix}.tsv"
            for test in ("union", "mixture", "targeted")]
        print(call([*SMOOTHCERT, "report", *map(str, files), "--radii", grid, "--into", str(doc),
                    "--block", block], capture=True), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
