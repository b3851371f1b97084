"""Driver of the denoised-smoothing study: an off-the-shelf (``standard``) Fashion-MNIST LeNet
certified alone, behind trained DnCNN denoisers (MSE, stability, MSE then stability) and behind
our own small DDPM (one-shot), against the Gaussian-trained LeNet of the same σ; then the tables
into README.md's blocks.

    python studies/denoised/run.py [all|report] [--data-root DIR] [--quick] [--out DIR]
                                   [--work DIR]

Guarantees:
- Resumable: the steps run in a fixed order (STEPS: the cheap classifiers and their records
  first, the DDPM last); a trained run (WORK/RUN/trained) is not retrained, nor one whose model
  is published (records/runs/RUN: it is copied into a fresh work folder), training resumes
  from its checkpoint (``train --resume``), a partial record file resumes row by row
  (``certify`` does that itself) and a complete published record file is not redone.
- Committed records are never rewritten: a file is published (copied from the work folder,
  manifest first) only where records/ does not hold it yet; a retrained run whose log differs
  from the published one (timings aside) stops the driver.
- One driver at a time per work folder (a lock); the tables are rewritten after every
  published record file (``--quick``: once, at the end), so README.md shows what is finished
  while the study runs.
- ``--quick`` trains toy models (one epoch on 300 images, tiny DnCNN and DDPM) for σ = 0.5 only
  and certifies 3 images with n = 100 under runs/studies-quick/denoised (or ``--out``), with a
  copy of README.md for the tables.
"""

from __future__ import annotations

import csv
import fcntl
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import (  # noqa: E402
    ACR_SHARE,
    ROOT,
    SMOOTHCERT,
    acr_interval,
    call,
    combine,
    data_flags,
    judge,
    output_folder,
    parser,
    readme,
    splice_block,
)

SIGMAS = {"s025": "0.25", "s050": "0.5", "s100": "1.0"}
# the report's radii: steps of σ/2 up to 2σ, below the largest radius n = 1,000 draws can
# certify at α = 0.001 (2.46σ)
RADII = {"s025": "0:0.5:0.125", "s050": "0:1:0.25", "s100": "0:2:0.5"}
# pipeline (record file stem) -> the denoiser run in front of the standard LeNet (None: none);
# "gaussian" certifies the Gaussian-trained LeNet of the σ instead
PIPELINES = {"standard": None, "mse": "mse", "stab": "stab", "mse_stab": "mse_stab",
             "ddpm": "ddpm", "gaussian": None}
DENOISED = ["mse", "stab", "mse_stab", "ddpm"]
DNCNNS = ["mse", "stab", "mse_stab"]
STABILITY = ["stab", "mse_stab"]
# Salman et al.'s claim holds if either stability denoiser beats MSE: two comparisons, so each
# interval is at 97.5% (Bonferroni: 95% for the pair). Carlini et al.'s holds if the DDPM beats
# every DnCNN (an intersection-union test: each at 95% is 95% for all three). Neither paper
# states an ACR effect at this scale: each interval's margin δ is the driver's ACR_SHARE (5%) of
# the first pipeline's ACR.
SALMAN_LEVEL, CARLINI_LEVEL = 0.975, 0.95


@dataclass(frozen=True)
class Sizes:
    """The study's budget: certified images (every ``skip``-th test image), draws, training."""

    sigmas: tuple[str, ...] = ("s025", "s050", "s100")
    images: int = 100
    skip: int = 100
    n0: int = 100
    n: int = 1000
    train: tuple[str, ...] = ()  # flags added to every train call
    dncnn: tuple[str, ...] = ()  # flags added to the denoisers' train calls
    ddpm: tuple[str, ...] = ()


FULL = Sizes()
QUICK = Sizes(sigmas=("s050",), images=3, skip=500, n0=20, n=100,
              train=("--epochs", "1", "--train-size", "300"),
              dncnn=("--arch-param", "depth=3", "--arch-param", "width=8"),
              ddpm=("--arch-param", "width=8", "--arch-param", "levels=2",
                    "--arch-param", "layers_per_block=1", "--batch", "64"))


def steps(sizes: Sizes) -> list[tuple[str, str]]:
    """(kind, name) in the order that gives results earliest: the classifiers and their record
    files, then per denoiser kind (cheapest first) its runs and records, the DDPM last."""
    out = [("train", "standard")] + [("train", f"gaussian_{s}") for s in sizes.sigmas]
    out += [("certify", f"{p}_{s}") for s in sizes.sigmas for p in ("standard", "gaussian")]
    for kind in ("mse", "mse_stab", "stab"):
        out += [("train", f"{kind}_{s}") for s in sizes.sigmas]
        out += [("certify", f"{kind}_{s}") for s in sizes.sigmas]
    out += [("train", "ddpm")] + [("certify", f"ddpm_{s}") for s in sizes.sigmas]
    return out


class Study:
    """One invocation: where runs train (work), records are published (out), at which sizes."""

    def __init__(self, args):
        self.sizes = QUICK if args.quick else FULL
        self.out = output_folder(args, HERE, "denoised")
        self.work = Path(args.work) if args.work else (
            self.out / "work" if args.quick else ROOT / "runs" / "denoised")
        self.data = data_flags(args)
        self.doc = readme(self.out, HERE)

    def rec(self, record: str) -> Path:
        pipeline, s = record.rsplit("_", 1)
        return self.out / "records" / s / f"{pipeline}.tsv"

    def complete(self, path: Path) -> bool:
        """``path`` holds a row for every certified image (plus the header)."""
        return path.is_file() and sum(1 for _ in path.open()) > self.sizes.images

    # -------------------------------------------------------------------------- train
    def train(self, run: str) -> None:
        """Train ``run`` (resuming), or restore it from its published model, and publish its
        config, logs and (where a later step needs it) model."""
        folder = self.work / run
        if not kept_model(run) and self.complete(self.rec(run)):
            return  # a Gaussian reference whose one use, its record file, is published
        if not (folder / "trained").exists() and not self.restore(run):
            cmd = [*SMOOTHCERT, "train", "--config", str(HERE / "configs" / f"{run}.yaml"),
                   "--out", str(folder), "--resume", "--no-progress", *self.data,
                   *self.sizes.train, *self.model_flags(run)]
            folder.mkdir(parents=True, exist_ok=True)
            started, start = time.strftime("%FT%TZ", time.gmtime()), time.monotonic()
            call(cmd)
            wall = folder / "wall_time.tsv"
            if not wall.exists():
                wall.write_text("started\tseconds\n")
            with wall.open("a") as f:
                f.write(f"{started}\t{time.monotonic() - start:.1f}\n")
            (folder / "trained").touch()
        self.same_training(run)
        dst = self.out / "records" / "runs" / run
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("config.yaml", "log.tsv", "wall_time.tsv", *kept_model(run)):
            if (dst / name).exists():
                continue
            if (folder / name).is_dir():  # the DDPM's diffusers folder
                shutil.copytree(folder / name, dst / f"{name}.partial")
                (dst / f"{name}.partial").rename(dst / name)
            else:
                shutil.copyfile(folder / name, dst / name)

    def restore(self, run: str) -> bool:
        """Copy a published run (its model byte for byte, config and logs) into the work folder
        of a fresh checkout, so that a later session goes on without retraining; False when the
        run's model is not published."""
        src, folder = self.out / "records" / "runs" / run, self.work / run
        names = ("config.yaml", "log.tsv", "wall_time.tsv", *kept_model(run))
        if not kept_model(run) or not all((src / name).exists() for name in names):
            return False
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            if (src / name).is_dir():
                shutil.copytree(src / name, folder / name, dirs_exist_ok=True)
            else:
                shutil.copyfile(src / name, folder / name)
        (folder / "trained").touch()
        return True

    def model_flags(self, run: str) -> list[str]:
        """The frozen classifier, the run a fine-tune starts from, the quick sizes."""
        kind = run.rsplit("_", 1)[0]
        if run == "ddpm":
            return list(self.sizes.ddpm)
        if kind not in ("mse", "stab", "mse_stab"):
            return []
        flags = ["--classifier", str(self.work / "standard" / "checkpoint.pt"), *self.sizes.dncnn]
        if kind == "mse_stab":
            flags += ["--init-from", str(self.work / run.replace("mse_stab", "mse") /
                                         "checkpoint.pt")]
        return flags

    def same_training(self, run: str) -> None:
        """A retrained run must match its published log, timings aside."""
        old, new = self.out / "records" / "runs" / run / "log.tsv", self.work / run / "log.tsv"
        if old.is_file() and untimed(old) != untimed(new):
            sys.exit(f"{new} differs from the published {old} beyond its timings: the retrained "
                     f"model is not the one whose records are published; delete {old.parent} "
                     f"and its record files to redo the run")

    # ------------------------------------------------------------------------ certify
    def certify(self, record: str) -> bool:
        """Certify one pipeline at one σ into the work folder, then publish the file; False
        when it was published before."""
        dst = self.rec(record)
        if self.complete(dst):
            return False
        pipeline, s = record.rsplit("_", 1)
        path = self.work / "records" / s / f"{pipeline}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        model = f"gaussian_{s}" if pipeline == "gaussian" else "standard"
        den = PIPELINES[pipeline]
        denoiser = [] if den is None else ["--denoiser", (
            f"diffusers:{self.work / 'ddpm' / 'diffusers'}" if den == "ddpm"
            else str(self.work / f"{den}_{s}" / "checkpoint.pt"))]
        sizes = self.sizes
        call([*SMOOTHCERT, "certify", str(self.work / model / "checkpoint.pt"), *denoiser,
              "--sigma", SIGMAS[s], "--n0", str(sizes.n0), "--n", str(sizes.n), "--alpha",
              "0.001", "--batch", "1000", "--skip", str(sizes.skip), "--max", str(sizes.images),
              "--seed", "0", "--out", str(path), "--no-progress", *self.data])
        if not self.complete(path):
            sys.exit(f"{path} is incomplete after certify")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f"{path}.manifest.json", f"{dst}.manifest.json")
        shutil.copyfile(path, dst)  # last: a published record file has its manifest
        return True

    # ------------------------------------------------------------------------- report
    def report(self) -> None:
        """Each σ's table (``smoothcert report --into``) and the cost table, from the
        published record files; a block whose files are not published yet is left as it is."""
        for s in self.sizes.sigmas:
            files = [str(self.rec(f"{p}_{s}")) for p in PIPELINES if self.complete(
                self.rec(f"{p}_{s}"))]
            if files:
                print(call([*SMOOTHCERT, "report", *files, "--radii", RADII[s], "--into",
                            str(self.doc), "--block", s], capture=True), end="")
        splice(self.doc, "cost", self.cost_table())
        splice(self.doc, "verdicts", self.verdicts())
        splice(self.doc, "intervals", self.interval_table())
        splice(self.doc, "capacity", self.capacity_table())

    def acr(self, s: str) -> dict[str, float]:
        """ACR of each published pipeline at σ ``s``, as ``smoothcert report`` computes it."""
        files = [str(self.rec(f"{p}_{s}")) for p in PIPELINES if self.complete(
            self.rec(f"{p}_{s}"))]
        if not files:
            return {}
        table = call([*SMOOTHCERT, "report", *files, "--format", "csv"], capture=True)
        return {row["name"]: float(row["acr"]) for row in csv.DictReader(table.splitlines())}

    def verdicts(self) -> str:
        """Per σ, the share of the ACR gap between the standard LeNet alone and the
        Gaussian-trained one that each denoiser recovers (a description; the verdicts are the
        intervals' table); "—" where a record file is not published yet."""
        lines = ["| σ | " + " | ".join(f"{p} recovers" for p in DENOISED) + " |",
                 "| --- |" + " ---: |" * len(DENOISED)]
        for s in self.sizes.sigmas:
            acr = self.acr(s)
            share = {p: (acr[p] - acr["standard"]) / (acr["gaussian"] - acr["standard"])
                     for p in DENOISED if {p, "standard", "gaussian"} <= acr.keys()
                     and acr["gaussian"] > acr["standard"]}
            cells = [f"{100 * share[p]:.0f}%" if p in share else "—" for p in DENOISED]
            lines.append(f"| {SIGMAS[s]} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def interval_table(self) -> str:
        """Per σ, the paired bootstrap intervals of the ACR differences each claim rests on and
        the claims' verdicts by the rules README.md states (:func:`salman`, :func:`carlini`)."""
        pairs = [(b, "mse", SALMAN_LEVEL) for b in STABILITY]
        pairs += [("ddpm", a, CARLINI_LEVEL) for a in DNCNNS]
        lines = ["| σ | " + " | ".join(f"{b} − {a}" for b, a, _ in pairs[:2])
                 + " | Salman et al. | " + " | ".join(f"{b} − {a}" for b, a, _ in pairs[2:])
                 + " | Carlini et al. |", "| --- |" + " ---: |" * 2 + " --- |"
                 + " ---: |" * 3 + " --- |"]
        for s in self.sizes.sigmas:
            published = {p for p in PIPELINES if self.complete(self.rec(f"{p}_{s}"))}
            diff = {(b, a): acr_interval(self.rec(f"{a}_{s}"), self.rec(f"{b}_{s}"), level)
                    for b, a, level in pairs if {a, b} <= published}
            acr = self.acr(s)
            judged = {(b, a): judge(i, ACR_SHARE * acr[a]) for (b, a), i in diff.items()}
            cells = [judged[b, a].cell() if (b, a) in judged else "—" for b, a, _ in pairs]
            lines.append(f"| {SIGMAS[s]} | {cells[0]} | {cells[1]} | {salman(judged)} | "
                         + " | ".join(cells[2:]) + f" | {carlini(judged)} |")
        return "\n".join(lines) + "\n"

    def capacity_table(self) -> str:
        """What each denoiser is: its parameters (the published model) and its training
        compute (epochs run × training images, from the published log and config; wall
        seconds of training, each σ's run "/"-joined; a fine-tune's include the run it starts
        from), next to the Carlini verdict."""
        lines = ["| denoiser | parameters | trained for | epochs × images | training (s) |",
                 "| --- | ---: | --- | ---: | ---: |"]
        for kind in DENOISED:
            runs = ["ddpm"] if kind == "ddpm" else [f"{kind}_{s}" for s in self.sizes.sigmas]
            folder = self.out / "records" / "runs"
            if not all((folder / run / "log.tsv").is_file() for run in runs):
                continue
            what = "every σ (t* per σ)" if kind == "ddpm" else "one σ each"
            wall = " / ".join(f"{train_seconds(folder, run):.0f}" for run in runs)
            lines.append(f"| {kind} | {parameters(folder / runs[0]):,} | {what} | "
                         f"{training_images(folder, runs[0]):,} | {wall} |")
        return "\n".join(lines) + "\n"

    def cost_table(self) -> str:
        """Seconds of certification per image (the records' time column: n0 + n draws through
        the pipeline) and of training (the runs' wall time), from the published files."""
        lines = ["| pipeline | " + " | ".join(f"s/image σ = {SIGMAS[s]}"
                                               for s in self.sizes.sigmas)
                 + " | training (s) |", "| --- |" + " ---: |" * (len(self.sizes.sigmas) + 1)]
        for p, den in PIPELINES.items():
            cells = [mean_time(self.rec(f"{p}_{s}")) for s in self.sizes.sigmas]
            runs = ["standard"] if p == "standard" else (
                [f"gaussian_{s}" for s in self.sizes.sigmas] if p == "gaussian"
                else ["ddpm"] if p == "ddpm" else [f"{den}_{s}" for s in self.sizes.sigmas])
            lines.append(f"| {p} | " + " | ".join(cells) + f" | {self.train_time(runs)} |")
        return "\n".join(lines) + "\n"

    def train_time(self, runs: list[str]) -> str:
        """Wall seconds of ``runs``' training, one number per run ("/"-joined)."""
        times = []
        for run in runs:
            wall = self.out / "records" / "runs" / run / "wall_time.tsv"
            if not wall.is_file():
                return ""
            rows = list(csv.DictReader(wall.open(), delimiter="\t"))
            times.append(f"{sum(float(r['seconds']) for r in rows):.0f}")
        return " / ".join(times)


def kept_model(run: str) -> tuple[str, ...]:
    """What of a trained run is published besides its logs: the model that later steps certify
    (the standard LeNet's and every DnCNN's checkpoint, the DDPM's diffusers folder), so that
    the study goes on from a fresh checkout; the Gaussian references are done once their
    records are published (their checkpoints stay in the work folder)."""
    if run == "ddpm":
        return ("diffusers",)
    return () if run.startswith("gaussian") else ("checkpoint.pt",)


def salman(judged: dict) -> str:
    """Claim 1 at one σ ("a stability-trained denoiser beats an MSE one"): the verdicts
    (``driver.judge``) of either stability denoiser's ACR interval over MSE's (each at
    SALMAN_LEVEL), one sufficing (``driver.combine``, "any")."""
    votes = [judged[b, "mse"] for b in STABILITY if (b, "mse") in judged]
    return combine(votes, "any") if len(votes) == len(STABILITY) else "—"


def carlini(judged: dict) -> str:
    """Claim 2 at one σ ("one-shot denoising with a diffusion model is competitive with trained
    denoisers", tested as: the DDPM's ACR is above every DnCNN's): the verdicts of its three
    intervals, all needed (``driver.combine``, "all")."""
    votes = [judged["ddpm", a] for a in DNCNNS if ("ddpm", a) in judged]
    return combine(votes, "all") if len(votes) == len(DNCNNS) else "—"


def parameters(run: Path) -> int:
    """Trainable parameters of a published denoiser: a checkpoint's model (loaded through the
    library) or a diffusers UNet's weights (counted from the safetensors header)."""
    if (run / "checkpoint.pt").is_file():
        from smoothcert.models.checkpoint import model_from_checkpoint

        model, _ = model_from_checkpoint(run / "checkpoint.pt")
        return sum(p.numel() for p in model.parameters() if p.requires_grad)
    from safetensors import safe_open

    weights = run / "diffusers" / "unet" / "diffusion_pytorch_model.safetensors"
    with safe_open(str(weights), framework="np") as f:
        names = f.keys()  # a safe_open handle is not iterable itself
        return sum(int(np.prod(f.get_slice(k).get_shape())) for k in names)


def train_seconds(folder: Path, run: str) -> float:
    """Wall seconds of ``run``'s training (its wall_time.tsv), plus those of the run it
    fine-tunes (mse_stab starts from mse)."""
    rows = csv.DictReader((folder / run / "wall_time.tsv").open(), delimiter="\t")
    parent = run.replace("mse_stab", "mse")
    own = sum(float(r["seconds"]) for r in rows)
    return own + (train_seconds(folder, parent) if parent != run else 0.0)


def training_images(folder: Path, run: str) -> int:
    """Epochs in ``run``'s published log × its training-set size (its config's train_size), plus
    those of the run it fine-tunes (mse_stab starts from mse)."""
    config = yaml.safe_load((folder / run / "config.yaml").read_text(encoding="utf-8"))
    epochs = sum(1 for _ in (folder / run / "log.tsv").open()) - 1
    own = epochs * int(config["train_size"])
    parent = run.replace("mse_stab", "mse")
    return own + (training_images(folder, parent) if parent != run else 0)


def mean_time(path: Path) -> str:
    """The mean of a record file's ``time`` column (seconds per image), "" when unpublished."""
    if not path.is_file():
        return ""
    rows = list(csv.DictReader(path.open(), delimiter="\t"))
    return f"{sum(float(r['time']) for r in rows) / len(rows):.2f}" if rows else ""


def splice(doc: Path, name: str, text: str) -> None:
    """Replace the lines between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``."""
    if not splice_block(doc, name, text):
        sys.exit(f"{doc}: no block {name}")


def untimed(log: Path) -> list[list[str]]:
    """Rows of a training log without its seconds and peak_mem_mb columns."""
    rows = list(csv.reader(log.open(), delimiter="\t"))
    keep = [i for i, c in enumerate(rows[0]) if c not in ("seconds", "peak_mem_mb")]
    return [[row[i] for i in keep] for row in rows]


def main(argv=None) -> int:
    p = parser(__doc__, "denoised", "records and README.md")
    p.add_argument("mode", nargs="?", default="all", choices=("all", "report"))
    p.add_argument("--work", help="where runs train and certify (default: runs/denoised; "
                                  "--quick: OUT/work)")
    args = p.parse_args(argv)
    study = Study(args)
    if args.mode == "all":
        study.work.mkdir(parents=True, exist_ok=True)
        with open(study.work / "driver.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                sys.exit(f"another run.py is working in {study.work}")
            for kind, name in steps(study.sizes):
                print(f"== {kind} {name} ({time.strftime('%H:%M:%S', time.gmtime())})", flush=True)
                if kind == "train":
                    study.train(name)
                elif study.certify(name) and not args.quick:
                    study.report()  # the tables grow while the study runs
    study.report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
