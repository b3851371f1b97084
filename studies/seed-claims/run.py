"""Driver of the seed-claims study: train the recipes of configs/, certify each run's record
files, write the report pieces into README.md's generated blocks.

Usage (from anywhere; paths are relative to the repository root):
    python studies/seed-claims/run.py [all|train|certify|report] [RUN ...] [--device D]
                                      [--lanes N] [--data-root DIR] [--quick] [--out DIR]

Guarantees:
- Resumable: a run whose config, log and complete record files are published under
  records/RUN/ is skipped; training resumes from its checkpoint (``train --resume``) and a
  partial record file resumes row by row (``certify`` does that itself).
- Committed records are never rewritten: a file is published (copied from the work folder)
  only where records/RUN/ does not hold it yet. A retrained run whose log differs from the
  published one (timings aside) stops the driver: its model is not the one the records describe.
- Several ``certify`` processes can share the work: each record file is claimed with a lock.
- ``--quick`` runs two runs (five record files) at toy sizes into runs/studies-quick/seed-claims
  (or ``--out``), with a copy of README.md there, so the committed study is never touched.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import os
import platform
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SMOOTHCERT = [sys.executable, "-m", "smoothcert.cli"]

# cheapest first; each fine-tune after the run it starts from (FINE_TUNES)
RUNS = ["gaussian_s025", "gaussian_s050", "gaussian_s100", "consistency_s025",
        "consistency_s050", "consistency_s100", "stability_s050", "gaussian_dd_s050", "heat_s050",
        "macer_s050", "easy_focus_discard_s050", "easy_focus_reweigh_s050",
        "easy_focus_attack_s050", "easy_focus_s050", "smoothadv_s050",
        "smoothadv_consistency_s050", "clean", "heat_g0006_s050", "heat_g001_s050",
        "heat_g003_s050", "heat_g01_s050", "smoothmix_s050", "catrs_s050", "gaussian_dd900_s050",
        "catrs_teacher_s050"]
QUICK_RUNS = ["gaussian_s050", "gaussian_dd_s050"]
FINE_TUNES = {"heat_s050": "gaussian_s050", **{f"heat_g{g}_s050": "clean"
                                                for g in ("0006", "001", "003", "01")}}
# runs whose method reads another run's checkpoint as its teacher (CAT-RS's ŷ table)
TEACHERS = {"catrs_teacher_s050": "gaussian_s025"}
S050 = ["gaussian_s050", "consistency_s050", "stability_s050", "smoothadv_s050",
        "smoothadv_consistency_s050", "macer_s050", "easy_focus_s050", "easy_focus_discard_s050",
        "easy_focus_reweigh_s050", "easy_focus_attack_s050", "heat_s050", "gaussian_dd_s050"]
SEVEN = ["gaussian_s050", "smoothadv_s050", "macer_s050", "consistency_s050", "smoothmix_s050",
         "catrs_s050", "easy_focus_s050"]
LATE = ["catrs_teacher_s050"]  # Step 15: CAT-RS with its teacher, a row of SEVEN's tables when
# its records are published
HEATS = ["heat_g0006_s050", "heat_g001_s050", "heat_g003_s050", "heat_g01_s050"]
GRIDS = {"s025": "0,0.25,0.5,0.75", "s050": "0,0.25,0.5,0.75,1,1.25,1.5",
         "s100": "0,0.25,0.5,0.75,1,1.25,1.5,1.75,2,2.25,2.5,2.75,3"}


@dataclass(frozen=True)
class Sizes:
    """The study's budget: images per record file, draws, training overrides."""

    images: int = 500
    n: int = 10_000
    n0: int = 100
    n_max: int = 100_000  # the sequential certifier's room to spend more than CERTIFY
    grad_draws: int = 100
    compile: bool = True
    train: tuple[str, ...] = ()
    train_run: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (run, flags) for single runs
    stems: tuple[str, ...] | None = None  # only these record files (None: all)


FULL = Sizes()
QUICK = Sizes(images=4, n=400, n0=20, n_max=1000, grad_draws=10, compile=False,
              train=("--epochs", "1", "--train-size", "300"),
              train_run=(("gaussian_dd_s050", ("--sigma-param", "start_epoch=0")),),
              stems=("certify", "sequential", "data_dependent", "data_dependent_k900",
                     "grad_norms"))


def records_of(run: str) -> list[str]:
    """The record files (stems) of ``run``: what its claims need."""
    extra = {"gaussian_s025": ["sequential_nmax100k"],
             "gaussian_s050": ["data_dependent", "sequential_nmax100k", "data_dependent_k300",
                               "data_dependent_k900", "data_dependent_package", "grad_norms"],
             "consistency_s050": ["data_dependent", "data_dependent_k900", "grad_norms"],
             "gaussian_dd_s050": ["data_dependent"],
             "heat_s050": ["deterministic", "lbound_heuristic"],
             "smoothadv_s050": ["grad_norms"], "macer_s050": ["grad_norms"],
             "easy_focus_s050": ["grad_norms"]}
    only = {"clean": [], "heat_g0006_s050": ["deterministic", "certify"],
            "smoothmix_s050": ["certify", "grad_norms"], "catrs_s050": ["certify", "grad_norms"],
            "catrs_teacher_s050": ["certify", "grad_norms"],
            "gaussian_dd900_s050": ["certify", "data_dependent", "data_dependent_k900"],
            **{h: ["deterministic"] for h in HEATS[1:]}}
    return only.get(run, ["certify", "sequential", *extra.get(run, [])])


def count_of(stem: str, sizes: Sizes) -> int:
    """Rows of a record file: the first 200 (K = 300, 900) or 20 (the package's option set) of
    the images, which the CPU can afford (~80 s per image), else all of them."""
    cap = {"data_dependent_k300": 200, "data_dependent_k900": 200, "data_dependent_package": 20}
    return min(cap.get(stem, sizes.images), sizes.images)


def certify_args(run: str, stem: str, sizes: Sizes) -> list[str]:
    """The ``certify`` flags of record file ``stem`` of ``run`` (not the sample's)."""
    grid = GRIDS[run.rsplit("_", 1)[1]]
    budget = ["--n0", str(sizes.n0), "--n", str(sizes.n)]
    fast = ["--compile"] if sizes.compile else []
    dd = ["--certifier", "data-dependent"]
    return {"certify": budget + fast,
            "sequential": ["--certifier", "sequential", "--opt", "test=union-final", *budget,
                           "--radii", grid, *fast],
            "sequential_nmax100k": ["--certifier", "sequential", "--n0", str(sizes.n0),
                                    "--n", str(sizes.n_max), "--radii", grid, *fast],
            "data_dependent": dd + budget + fast,
            "data_dependent_k300": dd + ["--opt", "num_steps=300"] + budget + fast,
            "data_dependent_k900": dd + ["--opt", "num_steps=900"] + budget + fast,
            "data_dependent_package": dd + ["--opt", "preset=package"] + budget + fast,
            "deterministic": ["--certifier", "deterministic", "--n", str(sizes.n)],
            "lbound_heuristic": ["--certifier", "lbound-heuristic"]}[stem]


class Study:
    """One invocation: where runs are trained (work), published (out) and at which sizes."""

    def __init__(self, args):
        self.sizes = QUICK if args.quick else FULL
        self.out = Path(args.out) if args.out else (
            ROOT / "runs/studies-quick/seed-claims" if args.quick else HERE)
        self.work = Path(args.work) if args.work else (
            self.out / "work" if args.quick else ROOT / "runs/seed-claims")
        self.device = args.device
        self.data = ["--data-root", args.data_root] if args.data_root else []
        self.doc = self.out / "README.md"
        if args.quick and not self.doc.exists():  # the blocks the report pieces go into
            self.out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HERE / "README.md", self.doc)

    def stems(self, run: str) -> list[str]:
        """The record files of ``run`` that this invocation produces."""
        only = self.sizes.stems
        return [s for s in records_of(run) if only is None or s in only]

    def rec(self, run: str, stem: str) -> Path:
        return self.out / "records" / run / f"{stem}.tsv"

    def complete(self, path: Path) -> bool:
        """``path`` holds every row of its stem (plus the header)."""
        if not path.is_file():
            return False
        with path.open() as f:
            return sum(1 for _ in f) > count_of(path.stem, self.sizes)

    def published(self, run: str) -> bool:
        folder = self.out / "records" / run
        return ((folder / "config.yaml").is_file() and (folder / "log.tsv").is_file()
                and all(self.complete(self.rec(run, s)) for s in self.stems(run)))

    # -------------------------------------------------------------------------- train
    def train(self, run: str) -> None:
        """Train ``run`` (resuming), appending this call's wall time to wall_time.tsv."""
        folder = self.work / run
        if (folder / "trained").exists():
            return
        cmd = [*SMOOTHCERT, "train", "--config", str(HERE / "configs" / f"{run}.yaml"),
               "--out", str(folder), "--resume", "--device", self.device, "--no-progress",
               *self.data, *self.sizes.train, *dict(self.sizes.train_run).get(run, ())]
        if run in FINE_TUNES:
            parent = self.work / FINE_TUNES[run] / "checkpoint.pt"
            if not parent.is_file():
                sys.exit(f"{run} fine-tunes {parent}, which is missing: train "
                         f"{FINE_TUNES[run]} first (delete its records folder if published)")
            cmd += ["--init-from", str(parent)]
        if run in TEACHERS:
            cmd += ["--param", f"teacher_checkpoint={self.teacher(run)}"]
        folder.mkdir(parents=True, exist_ok=True)
        before, started, start = epochs_logged(folder), time.strftime("%FT%TZ", time.gmtime()), \
            time.monotonic()
        call(cmd)
        wall = folder / "wall_time.tsv"
        if not wall.exists():
            wall.write_text("started\tseconds\tepochs_before\tepochs_after\tdevice\thardware\n")
        with wall.open("a") as f:
            f.write(f"{started}\t{time.monotonic() - start:.1f}\t{before}\t"
                    f"{epochs_logged(folder)}\t{self.device}\t{hardware()}\n")
        (folder / "trained").touch()

    def teacher(self, run: str) -> str:
        """The checkpoint of ``run``'s teacher (relative to the repository root where it lies
        below it, so the recorded config names no machine's folders), trained first where it
        is absent: checkpoints are not in git. A retrained teacher must match its published
        log (timings aside), as every retrained run must."""
        name = TEACHERS[run]
        ckpt = self.work / name / "checkpoint.pt"
        if not ckpt.is_file():
            (self.work / name / "trained").unlink(missing_ok=True)
            self.train(name)
        self.same_training(name)
        return os.path.relpath(ckpt, ROOT) if ckpt.is_relative_to(ROOT) else str(ckpt)

    # ------------------------------------------------------------------------ certify
    def certify_file(self, run: str, stem: str) -> bool:
        """Certify one record file; False when another process holds its claim."""
        path = self.work / run / f"{stem}.tsv"
        if self.complete(path) or self.complete(self.rec(run, stem)):
            return True
        self.same_training(run)
        if run in TEACHERS and stem == "grad_norms":  # its loss at test images asks the teacher
            self.teacher(run)
        ckpt = str(self.work / run / "checkpoint.pt")
        sample = ["--skip", "20", "--seed", "0", "--device", self.device, "--no-progress",
                  *self.data, "--max", str(count_of(stem, self.sizes)), "--out", str(path)]
        if stem == "grad_norms":  # Sun et al.'s Table 1, on the certified test images
            cmd = [*SMOOTHCERT, "analyze", "grad-norms", ckpt, "--split", "test",
                   "--n", str(self.sizes.grad_draws), *sample]
        else:
            cmd = [*SMOOTHCERT, "certify", ckpt, *certify_args(run, stem, self.sizes),
                   "--alpha", "0.001", "--batch", "10000", *sample]
        with open(f"{path}.claim", "w") as claim:
            try:
                fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            call(cmd, stdout=subprocess.DEVNULL)
        if not self.complete(path):
            sys.exit(f"{path} is incomplete after certify")
        return True

    def same_training(self, run: str) -> None:
        """A retrained run must match its published log, timings aside."""
        old, new = self.out / "records" / run / "log.tsv", self.work / run / "log.tsv"
        if old.is_file() and new.is_file() and untimed(old) != untimed(new):
            sys.exit(f"{new} differs from the published {old} beyond its timings: the retrained "
                     f"model is not the one whose records are published; delete "
                     f"{old.parent} to redo the run")

    def publish(self, run: str) -> None:
        """Copy run's config, logs and complete record files (never its checkpoint) to
        records/RUN/; a file published before is kept as it is."""
        src, dst = self.work / run, self.out / "records" / run
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("config.yaml", "log.tsv", "wall_time.tsv"):
            if (src / name).is_file() and not (dst / name).exists():
                shutil.copyfile(src / name, dst / name)
        for stem in self.stems(run):
            if self.complete(src / f"{stem}.tsv") and not (dst / f"{stem}.tsv").exists():
                shutil.copyfile(src / f"{stem}.tsv.manifest.json",
                                dst / f"{stem}.tsv.manifest.json")
                shutil.copyfile(src / f"{stem}.tsv", dst / f"{stem}.tsv")  # last: with manifest

    def training_now(self) -> bool:
        """A ``train`` process of this study (its pid in WORK/train.pid) is alive."""
        pid = self.work / "train.pid"
        try:
            os.kill(int(pid.read_text()), 0)
        except (OSError, ValueError):
            return False
        return True

    @contextmanager
    def training(self):
        """Mark this process as the study's one ``train`` process while the block runs."""
        if self.training_now():
            sys.exit(f"a train process is running: {(self.work / 'train.pid').read_text()}")
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "train.pid").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (self.work / "train.pid").unlink()

    def certify_all(self, runs: list[str]) -> None:
        """Certify and publish the trained runs; wait for runs a train process is training."""
        while True:
            busy = waiting = False
            for run in runs:
                if self.published(run):
                    continue
                if not (self.work / run / "trained").exists():
                    waiting = True
                    continue
                for stem in self.stems(run):
                    busy |= not self.certify_file(run, stem)
                    self.publish(run)  # each finished file at once, so the report can use it
                self.publish(run)
            if not busy and not waiting:
                return
            if waiting and not busy and not self.training_now():
                sys.exit("runs not trained yet, and no train process is running")
            time.sleep(1 if self.sizes is QUICK else 20)


def call(cmd: list[str], **kwargs) -> None:
    """Run one CLI call; its failure ends the driver with its exit code (the CLI said why)."""
    rc = subprocess.run(cmd, **kwargs).returncode
    if rc:
        print(f"failed (exit {rc}): {' '.join(cmd)}", file=sys.stderr)
        sys.exit(rc)


def epochs_logged(folder: Path) -> int:
    log = folder / "log.tsv"
    return max(sum(1 for _ in log.open()) - 1, 0) if log.is_file() else 0


def hardware() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.splitlines()
    except OSError:
        gpu = []
    return gpu[0] if gpu else f"{platform.machine()} CPU"


def untimed(log: Path) -> list[list[str]]:
    """Rows of a training log without its seconds and peak_mem_mb columns."""
    rows = list(csv.reader(log.open(), delimiter="\t"))
    keep = [i for i, c in enumerate(rows[0]) if c not in ("seconds", "peak_mem_mb")]
    return [[row[i] for i in keep] for row in rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="all", choices=("all", "train", "certify", "report"))
    p.add_argument("runs", nargs="*", metavar="RUN", help="a subset of the runs (default: all)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.add_argument("--lanes", type=int, default=1,
                   help="all: processes at once; one trains while the others certify")
    p.add_argument("--data-root", help="folder of the Fashion-MNIST files (default: the "
                                       "library's search)")
    p.add_argument("--quick", action="store_true", help="two runs at toy sizes (the smoke test)")
    p.add_argument("--out", help="where records, tables, figures and README.md are written "
                                 "(default: this folder; --quick: runs/studies-quick/seed-claims)")
    p.add_argument("--work", help="where runs train (default: runs/seed-claims; --quick: OUT/work)")
    args = p.parse_args(argv)
    os.chdir(ROOT)
    study = Study(args)
    known = QUICK_RUNS if args.quick else RUNS
    unknown = sorted(set(args.runs) - set(RUNS))
    if unknown:
        p.error(f"unknown run {unknown[0]}; runs: {' '.join(RUNS)}")
    runs = [r for r in known if r in args.runs] if args.runs else known
    todo = [r for r in runs if not study.published(r)]
    for run in sorted(set(runs) - set(todo), key=runs.index):
        print(f"done: {run} ({study.out / 'records' / run})")
    if args.mode == "train":
        with study.training():
            for run in todo:
                study.train(run)
    elif args.mode == "certify":
        study.certify_all(todo)
    elif args.mode == "all":
        run_all(study, todo, args, sys.argv[1:] if argv is None else argv)
    if args.mode in ("all", "report"):
        sys.path.insert(0, str(HERE))
        from pieces import splice, write_report  # the report step, a sibling of this file

        write_report(study.out, study.doc, sys.modules[__name__])
        if study.out == HERE:  # the headline tables of the studies' index
            for name in ("claim_words", "seven_s050"):
                splice(HERE.parent / "README.md", f"seed-claims.{name}",
                       (HERE / "tables" / f"{name}.md").read_text(encoding="utf-8"))
    return 0


def run_all(study: Study, todo: list[str], args, argv: list[str]) -> None:
    """Train, then certify; with --lanes N, N - 1 certify processes start at once beside the
    training, certifying each run as soon as it is trained."""
    base = [a for a in argv if a not in ("all", *args.runs)]
    with study.training():
        helpers = [subprocess.Popen([sys.executable, __file__, "certify", *todo, *base])
                   for _ in range(args.lanes - 1)] if todo else []
        for run in todo:
            study.train(run)
    study.certify_all(todo)
    for helper in helpers:
        if helper.wait():
            sys.exit(f"a certify lane failed (exit {helper.returncode})")


if __name__ == "__main__":
    sys.exit(main())
