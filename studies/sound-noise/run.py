"""Driver of the sound-noise study: the discrete Gaussian (``--noise discrete-gaussian``) against
the float Gaussian, throughput and certified accuracy, through benchmarks/sound_noise.py, then
the certified accuracy of each model under both noises into README.md's blocks.

    python studies/sound-noise/run.py [--throughput] [--data-root DIR] [--quick] [--out DIR]

Models: the sequential study's committed LeNet (σ = 0.25) and the seed-claims study's
gaussian_s050 (σ = 0.5), which is retrained by ``studies/seed-claims/run.py train gaussian_s050``
when runs/seed-claims/ does not hold it (its sha256 is in the records' manifests, so a different
model is refused, not mixed in). Guarantees: resumable (the benchmark resumes record files);
committed records are never rewritten; ``--quick`` trains a 1-epoch model on 300 examples and
certifies 3 images with n = 300 under runs/studies-quick/sound-noise (or ``--out``), with a copy
of README.md for the tables.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import ROOT, SMOOTHCERT, call, data_flags, output_folder, parser, readme  # noqa: E402

BENCHMARK = [sys.executable, str(ROOT / "benchmarks" / "sound_noise.py")]
LENET = ROOT / "studies" / "sequential" / "records" / "fmnist_lenet_s025.pt"
GAUSSIAN_S050 = ROOT / "runs" / "seed-claims" / "gaussian_s050" / "checkpoint.pt"
# record folder: (checkpoint, images, skip, radii of the report)
MODELS = {"sound_s025": (LENET, 200, 50, "0,0.25,0.5,0.75"),
          "sound_s050": (GAUSSIAN_S050, 200, 20, "0:1.5:0.25")}


def main(argv=None) -> int:
    p = parser(__doc__, "sound-noise", "records and README.md")
    p.add_argument("--throughput", action="store_true",
                   help="also time both noises (CERTIFY of random images, random weights)")
    args = p.parse_args(argv)
    out = output_folder(args, HERE, "sound-noise")
    data = data_flags(args)
    out.mkdir(parents=True, exist_ok=True)
    doc = readme(out, HERE)
    models, n = MODELS, "10000"
    if args.quick:
        tiny = out / "model" / "checkpoint.pt"
        call([*SMOOTHCERT, "train", "--config", str(LENET.with_suffix(".config.yaml")),
              "--epochs", "1", "--train-size", "300", "--out", str(tiny.parent), "--resume",
              "--no-progress", *data])
        models, n = {"sound_s025": (tiny, 3, 50, "0,0.25,0.5,0.75")}, "300"
    if args.throughput or args.quick:
        sizes = ["--n", "200", "--images", "1", "--rounds", "1"] if args.quick else [
            "--n", "4000", "--images", "2", "--rounds", "3"]
        call([*BENCHMARK, "--models", "lenet", *([] if args.quick else ["cifar_resnet20"]),
              *sizes, "--device", "cpu"])
    for name, (checkpoint, images, skip, radii) in models.items():
        if not checkpoint.is_file():
            call([sys.executable, str(ROOT / "studies/seed-claims/run.py"), "train",
                  "gaussian_s050", *data])
        folder = out / "records" / name
        call([*BENCHMARK, "--models", "--checkpoint", str(checkpoint), "--max", str(images),
              "--skip", str(skip), "--n", n, "--radii", *radii_list(radii), "--out-dir",
              str(folder), "--device", "cpu", *data])
        files = [str(folder / f"{noise}.tsv") for noise in ("gaussian", "discrete-gaussian")]
        print(call([*SMOOTHCERT, "report", *files, "--radii", radii, "--into", str(doc),
                    "--block", name], capture=True), end="")
    return 0


def radii_list(radii: str) -> list[str]:
    """The benchmark's --radii (a list) from the report's (a comma list or start:stop:step)."""
    if ":" not in radii:
        return radii.split(",")
    start, stop, step = map(float, radii.split(":"))
    return [f"{start + i * step:g}" for i in range(int(round((stop - start) / step)) + 1)]


if __name__ == "__main__":
    sys.exit(main())
