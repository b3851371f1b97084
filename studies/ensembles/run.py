"""Driver of the ensembles study (Horváth et al., ICLR 2022): three Gaussian-trained
Fashion-MNIST LeNets (seeds 0, 1, 2) per σ ∈ {0.25, 0.5}, certified alone and as one ensemble
(the mean of their logits), with and without K-consensus, with CERTIFY and with the runner-up's
bound; then the tables (certified accuracy, ACR, seconds and forward passes per image) into
README.md's blocks.

    python studies/ensembles/run.py [train|certify|report|all] [--device DEV] [--data-root DIR]
                                    [--quick] [--out DIR]

- ``train`` trains the six LeNets into WORK/models/lenet_<σ>_seed<i>/ (WORK: ``--work``, default
  runs/studies/ensembles; a run with a checkpoint is not retrained) with the sequential study's
  recipe (studies/sequential/records/fmnist_lenet_s025.config.yaml: 4 epochs, lr 0.05) at the
  σ and seed.
- ``certify`` writes OUT/records/<σ>/<name>.tsv: seed0, seed1, seed2 (CERTIFY), ensemble,
  ensemble_k2, ensemble_k3 (CERTIFY of the ensemble, K-consensus 2 and 3 of 3), runner_up_seed0
  and runner_up_ensemble (``--certifier runner-up``), on every 20th test image (500), n0 = 100,
  n = 10,000, α = 0.001; ``certify`` resumes a partial file itself.
- ``cost`` (not part of ``all``) writes OUT/records/cost_<σ>/<name>.tsv on every 200th test
  image (50), n0 = 100, n = 10,000: seed0, ensemble, ensemble_k2 (logits mode),
  ensemble_softmax and ensemble_exact (softmax mode, ``--consensus exact``), one after another
  on one device; an ensemble's records count its member passes per example.
- ``report`` fills README.md's blocks ``s025`` and ``s050`` with ``report --cost``, and
  ``cost_s025``, ``cost_s050`` (where ``cost`` ran) with the same and whether ensemble_exact's
  rows equal ensemble_softmax's (every column but the cost columns).
- ``--quick``: one epoch on 300 images, 3 images at n = 200 (cost: 2), under
  runs/studies-quick/ensembles.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import (  # noqa: E402
    ROOT,
    SMOOTHCERT,
    Comparison,
    call,
    data_flags,
    output_folder,
    parser,
    readme,
    splice_block,
    summary,
    write_verdicts,
)

SIGMAS = {"s025": "0.25", "s050": "0.5"}
SEEDS = (0, 1, 2)
RECIPE = ROOT / "studies/sequential/records/fmnist_lenet_s025.config.yaml"
RADII = {"s025": "0:1:0.25", "s050": "0:2:0.5"}
# Horváth et al.'s claim, the ensemble certifies more than each member: ensemble − member in ACR
# and certified accuracy (claimed greater, the driver's margins: 2 points, 5% of the member's ACR)
VERDICT_RADII = {"s025": (0.25, 0.5, 0.75), "s050": (0.5, 1.0, 1.5)}
VERDICTS = [Comparison("verdict_ensemble", f"{key}/seed{s}", f"{key}/ensemble", radii)
            for key, radii in VERDICT_RADII.items() for s in SEEDS]


def train(args, work: Path) -> None:
    for key, sigma in SIGMAS.items():
        for seed in SEEDS:
            out = work / "models" / f"lenet_{key}_seed{seed}"
            if (out / "checkpoint.pt").exists():
                continue
            quick = ["--epochs", "1", "--train-size", "300"] if args.quick else []
            call([*SMOOTHCERT, "train", "--config", str(RECIPE), "--sigma", sigma, "--seed",
                  str(seed), *quick, "--device", args.device, "--no-progress", *data_flags(args),
                  "--out", str(out)])


def runs(work: Path, key: str) -> dict:
    """Record name → (checkpoints, extra flags)."""
    models = [str(work / "models" / f"lenet_{key}_seed{s}") for s in SEEDS]
    out = {f"seed{s}": ([m], []) for s, m in zip(SEEDS, models)}
    out["ensemble"] = (models, [])
    out["ensemble_k2"] = (models, ["--consensus", "2"])
    out["ensemble_k3"] = (models, ["--consensus", "3"])
    out["runner_up_seed0"] = (models[:1], ["--certifier", "runner-up"])
    out["runner_up_ensemble"] = (models, ["--certifier", "runner-up"])
    return out


def certify(args, work: Path, out: Path) -> None:
    size = ["--n", "200", "--skip", "1000", "--max", "3"] if args.quick else \
        ["--n", "10000", "--skip", "20", "--max", "500"]
    for key, sigma in SIGMAS.items():
        for name, (models, extra) in runs(work, key).items():
            target = out / "records" / key / f"{name}.tsv"
            target.parent.mkdir(parents=True, exist_ok=True)
            call([*SMOOTHCERT, "certify", *models, *extra, "--sigma", sigma, "--n0", "100",
                  *size, "--alpha", "0.001", "--batch", args.batch, "--device", args.device,
                  "--no-progress", *data_flags(args), "--out", str(target)])


def cost_runs(work: Path, key: str) -> dict:
    """The cost step's record name → (checkpoints, extra flags)."""
    models = [str(work / "models" / f"lenet_{key}_seed{s}") for s in SEEDS]
    softmax = ["--ensemble-mode", "softmax"]
    return {"seed0": (models[:1], []), "ensemble": (models, []),
            "ensemble_k2": (models, ["--consensus", "2"]), "ensemble_softmax": (models, softmax),
            "ensemble_exact": (models, [*softmax, "--consensus", "exact"])}


def cost(args, work: Path, out: Path) -> None:
    size = ["--n", "200", "--skip", "1000", "--max", "2"] if args.quick else \
        ["--n", "10000", "--skip", "200", "--max", "50"]
    for key, sigma in SIGMAS.items():
        folder = out / "records" / f"cost_{key}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, (models, extra) in cost_runs(work, key).items():
            call([*SMOOTHCERT, "certify", *models, *extra, "--sigma", sigma, "--n0", "100",
                  *size, "--alpha", "0.001", "--batch", args.batch, "--device", args.device,
                  "--no-progress", *data_flags(args), "--out", str(folder / f"{name}.tsv")])


def rows_without_cost(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    drop = {header.index("time"), header.index("member_passes")}
    return ["\t".join(c for i, c in enumerate(line.split("\t")) if i not in drop)
            for line in lines]


def cost_table(out: Path, key: str) -> str:
    """``report --cost`` of the cost step's files (passes/img: an ensemble's member passes),
    and whether the exact consensus changed any row."""
    folder = out / "records" / f"cost_{key}"
    files = [str(folder / f"{name}.tsv") for name in cost_runs(Path(), key)]
    table = call([*SMOOTHCERT, "report", *files, "--radii", RADII[key], "--cost"], capture=True)
    same = rows_without_cost(folder / "ensemble_exact.tsv") == rows_without_cost(
        folder / "ensemble_softmax.tsv")
    return table + ("\nensemble_exact's rows equal ensemble_softmax's (every column but time "
                    f"and member_passes): {'yes' if same else 'NO'}\n")


def report(out: Path) -> None:
    doc = readme(out, HERE)
    for key in SIGMAS:
        files = [str(out / "records" / key / f"{name}.tsv") for name in runs(Path(), key)]
        table = call([*SMOOTHCERT, "report", *files, "--radii", RADII[key], "--cost"],
                     capture=True)
        splice_block(doc, key, table)
        if (out / "records" / f"cost_{key}" / "ensemble_exact.tsv").exists():
            splice_block(doc, f"cost_{key}", cost_table(out, key))
    write_claim(doc, write_verdicts(out, doc, VERDICTS))
    print(f"tables: {doc}")


def write_claim(doc: Path, found: dict) -> None:
    """README.md's ``claim_ensemble`` block: the words of VERDICTS' intervals per σ
    (``driver.summary``; a label is the member and the quantity)."""
    lines = []
    for key, sigma in SIGMAS.items():
        judged = {f"{first.split('/')[1]} {what}": v for (first, _), found_ in found.items()
                  if first.startswith(f"{key}/") for what, v in found_.items()}
        if judged:
            lines.append(f"- σ = {sigma}: {summary(judged)}\n")
    if lines:
        splice_block(doc, "claim_ensemble", "".join(lines))


def main() -> None:
    p = parser(__doc__, "ensembles")
    p.add_argument("step", nargs="?", default="all",
                   choices=["train", "certify", "cost", "report", "all"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", default="1000")
    p.add_argument("--work", help="where the models are trained (default: runs/studies/ensembles"
                                  ", --quick: OUT/work)")
    args = p.parse_args()
    out = output_folder(args, HERE, "ensembles")
    work = Path(args.work) if args.work else (
        out / "work" if args.quick or args.out else ROOT / "runs" / "studies" / "ensembles")
    if args.step in ("train", "all"):
        train(args, work)
    if args.step in ("certify", "all"):
        certify(args, work, out)
    if args.step == "cost" or (args.step == "all" and args.quick):
        cost(args, work, out)
    if args.step in ("report", "all"):
        report(out)


if __name__ == "__main__":
    main()
