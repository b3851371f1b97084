"""Semantic transformations (TSS, Li et al., CCS 2021; issue 47, item 5): seconds per image of
``certify_dataset(..., certifier="tss")`` for each transformation against CERTIFY's with
Gaussian noise, the transformation's drawing alone against Gaussian's, and (``--authors
PATH``) the authors' per-row loop against ours.

For every smoothing, timed in one run on one device and model (``lenet`` at Fashion-MNIST's
1×28×28, random weights: the cost of a forward does not depend on them), on ``--images``
random 8-bit inputs, median over ``--rounds`` interleaved rounds (every job runs once per
round, so the drift of a shared machine hits all of them alike):

* ``certify``: ``certify_dataset(model, ..., certifier="tss", options={"transform": T})`` (for
  the first row, ``gaussian``: CERTIFY with Gaussian noise at ``--sigma``) with n0 and n draws
  per image at ``--batch``: the engine, the radius and the record pipeline but the file;
* ``draws``: the smoothing alone, ``perturb_`` into a ``--batch``-row buffer (what the engine
  draws through: the parameters from the image's generator, then T(x, θ) row by row in one
  batched call; Gaussian noise: ``normal_`` plus the input), as many batches as the
  certification has draws;
* ``authors``: with ``--authors PATH`` (a clone of AI-secure/semantic-randomized-smoothing),
  their transformer's ``process(x.repeat((batch, 1, 1, 1)))``, what their ``_sample_noise``
  does per batch before the forward: ``BrightnessTransformer`` (a shift then a scale, each a
  Python loop over rows, a ``torch.randn(1)`` per row; the same for contrast),
  ``TranslationTransformer`` (a loop over rows of slice copies), ``ExpGaussianTransformer``
  & co. (a loop of ``cv2.GaussianBlur`` per row; only where OpenCV imports, against our
  ``kernel=opencv``, its counterpart) and ``NoiseTransformer`` (Cohen's ``randn_like``, the
  Gaussian row), on ``--authors-batches`` batches, on the host (their code draws there and
  moves the batch to the GPU after). Their module is imported as it is, with stand-ins in
  ``sys.modules`` for numba (imported, never called by these loops) and, where it does not
  import, OpenCV (then the blur row is skipped); ``--cv2 DIR`` adds a folder (a throwaway
  virtual environment's site-packages) at the end of ``sys.path`` to import OpenCV from.

"× Gaussian" is the median over rounds of the job's time over Gaussian's in the same round;
"authors ÷ ours" the median over rounds of their time per row over ours in the same round.

    python benchmarks/tss_cost.py --threads 1 --images 2 --rounds 3 --n 10000 --authors /tmp/tss
    python benchmarks/tss_cost.py --device cuda --images 20 --batch 1000
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import random
import statistics
import subprocess
import sys
import types
from pathlib import Path

import torch
from certify_throughput import make_model
from common import start_run
from sound_noise import timed

from smoothcert.errors import SmoothcertError
from smoothcert.noise import NOISES
from smoothcert.runs import certify_dataset
from smoothcert.transforms import build_transformation

SHAPE, CLASSES = (1, 28, 28), 10
GAUSSIAN = "gaussian"
TRANSFORMS = ("brightness:sigma_b=0.3,sigma_k=0.3", "contrast:sigma_k=0.3,sigma_b=0.3",
              "blur:distribution=exponential,scale=2,kernel=exact",
              "blur:distribution=exponential,scale=2,kernel=opencv", "translation:sigma=3")
"""The paper's MNIST settings (``data/main_results``: brightness and contrast σ_k = σ_b = 0.3,
blur exponential λ = 2, translation σ = 3), blur with both kernels."""


def smoothings(args) -> dict:
    """Row label -> the object the engine draws through (``perturb_``)."""
    out = {GAUSSIAN: NOISES["gaussian"](args.sigma)}
    for text in args.transforms:
        out[text] = build_transformation(text)
    return out


def certify(model, data, label: str, args) -> None:
    common = dict(n0=args.n0, n=args.n, batch=args.batch, num_classes=CLASSES,
                  device=args.device)
    if label == GAUSSIAN:
        certify_dataset(model, data, noise="gaussian", sigma=args.sigma, **common)
    else:
        certify_dataset(model, data, certifier="tss", options={"transform": label}, **common)


def draw_batches(args) -> int:
    """Batches of ``--batch`` rows per image in the ``draws`` job."""
    return max(1, (args.n0 + args.n) // args.batch)


def draws(smoothing, xs: torch.Tensor, args) -> None:
    """``perturb_`` of every image's n0 + n draws into one buffer, a batch at a time."""
    buffer = torch.empty((args.batch, *SHAPE), device=xs.device)
    g = torch.Generator(xs.device).manual_seed(0)
    for x in xs:
        for _ in range(draw_batches(args)):
            smoothing.perturb_(buffer, x, g)
    buffer.sum().item()  # one sync at the end


# The authors' code -------------------------------------------------------------------------

def _stand_in(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__stand_in__ = True
    if name == "numba":
        module.jit = lambda *args, **kwargs: (lambda f: f)
    else:
        def missing(*args, **kwargs):
            raise RuntimeError("cv2 is a stand-in here: OpenCV is not importable")
        module.GaussianBlur, module.BORDER_REFLECT101 = missing, 4
    return module


@contextlib.contextmanager
def _borrowed(root: Path, cv2_dir: str | None):
    """sys.path with ``root`` first (and ``cv2_dir`` last), stand-ins for numba and cv2 where
    they do not import, no bytecode written; everything as it was on leaving (their module
    keeps what it imported)."""
    saved_path, saved_bytecode = list(sys.path), sys.dont_write_bytecode
    names = ("cv2", "numba", "semantic", "semantic.transforms", "semantic.transformers",
             "semantic.C")
    saved = {name: sys.modules.get(name) for name in names}
    sys.path.insert(0, str(root))
    if cv2_dir:
        sys.path.append(str(cv2_dir))
    sys.dont_write_bytecode = True  # leave their clone as it is
    try:
        for name in ("cv2", "numba"):
            try:
                importlib.import_module(name)
            except ImportError:
                sys.modules[name] = _stand_in(name)
        yield
    finally:
        sys.path[:] = saved_path
        sys.dont_write_bytecode = saved_bytecode
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def load_authors(path: str | None, cv2_dir: str | None = None) -> tuple:
    """(their ``semantic.transformers`` or None, a line saying what was loaded or why not,
    whether their OpenCV blur can run)."""
    if not path:
        return None, "authors' rows: skipped (no --authors PATH given)", False
    root = Path(path)
    if not (root / "semantic" / "transformers.py").is_file():
        return None, f"authors' rows: skipped ({root}/semantic/transformers.py not found)", False
    with _borrowed(root, cv2_dir), contextlib.redirect_stdout(io.StringIO()):
        # their module prints "Fast kernel not available" (a C kernel for rotation only)
        module = importlib.import_module("semantic.transformers")
    cv2 = module.transforms.cv2
    real_cv2 = not getattr(cv2, "__stand_in__", False)
    commit = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %cs"],
                            capture_output=True, text=True).stdout.strip() or "no git"
    numba = "numba stand-in" if getattr(module.transforms.numba, "__stand_in__", False) \
        else "numba"
    opencv = (f"OpenCV {cv2.__version__}" if real_cv2 else
              "cv2 stand-in: their blur skipped (OpenCV is not importable; --cv2 DIR)")
    return module, f"authors' code: {root} ({commit}); {numba}, {opencv}", real_cv2


def authors_transformer(tr, label: str, smoothing, x: torch.Tensor, real_cv2: bool):
    """Their transformer for the row ``label`` (its ``process`` is what their certify draws
    through), or None with the reason."""
    if label == GAUSSIAN:
        return tr.NoiseTransformer(smoothing.sigma), ""
    family = smoothing.name
    if family in ("brightness", "contrast"):
        kind = tr.BrightnessTransformer if family == "brightness" else tr.ContrastTransformer
        return kind(smoothing.sigma_k, smoothing.sigma_b), ""
    if family == "translation":
        return tr.TranslationTransformer(smoothing.sigma, x.cpu()), ""
    if family == "blur":
        if smoothing.kernel != "opencv":
            return None, "no counterpart: theirs is OpenCV's kernel"
        if not real_cv2:
            return None, "skipped: no OpenCV"
        kind = {"uniform": tr.GaussianTransformer, "exponential": tr.ExpGaussianTransformer,
                "folded-gaussian": tr.FoldGaussianTransformer}[smoothing.distribution]
        return kind(smoothing.scale), ""
    return None, "no counterpart"


def authors_draws(transformer, x: torch.Tensor, args) -> None:
    """Their ``_sample_noise`` up to the forward, ``--authors-batches`` times: the batch of
    ``--batch`` copies of x and their ``process`` of it, on the host."""
    x = x.cpu()
    for _ in range(args.authors_batches):
        transformer.process(x.repeat((args.batch, 1, 1, 1)))


# Measuring ---------------------------------------------------------------------------------

def jobs(model, xs, args, authors=None, real_cv2=False) -> tuple[dict, dict]:
    """((row, what) -> a function of no arguments returning seconds; row -> why it has no
    authors' job)."""
    device = xs.device
    data = torch.utils.data.TensorDataset(xs.cpu(), torch.zeros(len(xs), dtype=torch.long))
    out, missing = {}, {}
    for label, smoothing in smoothings(args).items():
        out[label, "certify"] = lambda label=label: timed(
            lambda: certify(model, data, label, args), device)
        out[label, "draws"] = lambda s=smoothing: timed(lambda: draws(s, xs, args), device)
        if authors is None:
            continue
        transformer, why = authors_transformer(authors, label, smoothing, xs[0], real_cv2)
        if transformer is None:
            missing[label] = why
            continue
        out[label, "authors"] = lambda t=transformer: timed(
            lambda: authors_draws(t, xs[0], args), torch.device("cpu"))
    return out, missing


def measure(args, authors=None, real_cv2=False) -> tuple[dict, dict]:
    """Every job once as a warm-up, then ``--rounds`` interleaved rounds; the list of times of
    every job, and the rows without an authors' job (and why)."""
    device = torch.device(args.device)
    model = make_model("lenet", device)
    g = torch.Generator().manual_seed(0)
    xs = (torch.randint(0, 256, (args.images, *SHAPE), generator=g).float() / 255).to(device)
    torch.manual_seed(0)  # their draws come from torch's and Python's global generators
    random.seed(0)
    work, missing = jobs(model, xs, args, authors, real_cv2)
    return interleaved(work, args.rounds), missing


def interleaved(work: dict, rounds: int) -> dict:
    """Every job of ``work`` (key -> a function returning seconds) once as a warm-up, then
    ``rounds`` rounds of every job in turn: key -> its times."""
    times = {key: [] for key in work}
    for job in work.values():
        job()
    for _ in range(rounds):
        for key, job in work.items():
            times[key].append(job())
    return times


def rows_per_job(what: str, args) -> int:
    if what == "authors":
        return args.authors_batches * args.batch
    return draw_batches(args) * args.batch * args.images


def ratios(times: dict, label: str, what: str, base: tuple, args) -> list[float]:
    """Per round, (row, what)'s time per draw over ``base``'s in the same round."""
    a, b = rows_per_job(what, args), rows_per_job(base[1], args)
    return [(t / a) / (u / b) for t, u in zip(times[label, what], times[base])]


def ratio(times: dict, label: str, what: str, base: tuple, args) -> float:
    """The median over rounds of :func:`ratios`."""
    return statistics.median(ratios(times, label, what, base, args))


def per_round(times: dict, args) -> list[str]:
    """Each round's ratios: certify and draws × Gaussian, authors ÷ ours."""
    def cells(what, base_of):
        out = []
        for label in [GAUSSIAN, *args.transforms]:
            if (label, what) not in times or (label == GAUSSIAN and what != "authors"):
                continue
            values = ratios(times, label, what, base_of(label), args)
            out.append(f"{label} " + "/".join(f"{v:.2f}" for v in values))
        return ", ".join(out)

    lines = [f"per round, {what} × Gaussian: " + cells(what, lambda _, w=what: (GAUSSIAN, w))
             for what in ("certify", "draws")]
    authors = cells("authors", lambda label: (label, "draws"))
    if authors:
        lines.append("per round, authors ÷ ours (time per draw): " + authors)
    return lines


def table(times: dict, missing: dict, args) -> list[str]:
    rows = ["| smoothing | certify s/image | × Gaussian | draws/s (perturb_) | × Gaussian "
            "(time) | authors' draws/s (process, host) | authors ÷ ours (time) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label in [GAUSSIAN, *args.transforms]:
        cert = statistics.median(times[label, "certify"]) / args.images
        rate = rows_per_job("draws", args) / statistics.median(times[label, "draws"])
        if (label, "authors") in times:
            theirs = rows_per_job("authors", args) / statistics.median(times[label, "authors"])
            authors = (f"{theirs:,.0f} | "
                       f"{ratio(times, label, 'authors', (label, 'draws'), args):.2f}")
        else:
            authors = f"– ({missing.get(label, 'no --authors')}) | –"
        name = f"{label} (σ = {args.sigma:g}, CERTIFY)" if label == GAUSSIAN else label
        certified = ratio(times, label, "certify", (GAUSSIAN, "certify"), args)
        drawn = ratio(times, label, "draws", (GAUSSIAN, "draws"), args)
        rows.append(f"| {name} | {cert:.3f} | {certified:.2f} | {rate:,.0f} | {drawn:.2f} | "
                    f"{authors} |")
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--transforms", nargs="+", default=list(TRANSFORMS),
                   help="transformations, NAME:KEY=VALUE,... (default: the paper's MNIST "
                        "settings, blur with both kernels); Gaussian CERTIFY is always the "
                        "first row")
    p.add_argument("--sigma", type=float, default=0.5, help="the Gaussian row's σ")
    p.add_argument("--images", type=int, default=2)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--authors", metavar="PATH",
                   help="a clone of AI-secure/semantic-randomized-smoothing: time their "
                        "transformers' process (default: their rows are skipped)")
    p.add_argument("--authors-batches", type=int, default=5,
                   help="batches of --batch rows their process is timed on, per round")
    p.add_argument("--cv2", metavar="DIR",
                   help="a folder to import OpenCV from (added at the end of sys.path), for "
                        "their blur")
    args = p.parse_args(argv)
    for text in args.transforms:  # a bad name fails here, before any timing
        if build_transformation(text).sampled:
            raise SmoothcertError(f"{text} is certified by sampling: "
                                  "benchmarks/tss_sampling.py times it")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    load = start_run(args.device, args.threads)
    authors, line, real_cv2 = load_authors(args.authors, args.cv2)
    print(line)
    print(f"\nworkload: CERTIFY (Gaussian) and TSS of {args.images} random 8-bit images of "
          f"1x28x28, lenet (random weights), n0 = {args.n0}, n = {args.n}, batch "
          f"{args.batch}; draws: {draw_batches(args)} batches of {args.batch} per image"
          + (f"; authors: {args.authors_batches} batches of {args.batch} on the host"
             if authors else "")
          + f"; median of {args.rounds} interleaved rounds\n", flush=True)
    times, missing = measure(args, authors, real_cv2)
    print("\n".join(table(times, missing, args)))
    print("\n" + "\n".join(per_round(times, args)))
    if load:
        print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
