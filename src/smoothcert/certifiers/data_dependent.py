"""The data-dependent certifier (Alfarra et al., "Data Dependent Randomized Smoothing") and the
memory of its Algorithm 3.

``data-dependent``: per input, σ_x = OptimizeSigma(x) started at the run's σ (the training σ;
Algorithm 1, :mod:`smoothcert.smoothing.sigma_optimization`), then CERTIFY with N(0, σ_x²I); with
``memory`` (default) the certificate is passed through the memory of Algorithm 3
(:class:`Memory`), which makes it a sound certificate of the data-dependent classifier. With
``--noise uniform`` (formerly the certifier ``data-dependent-uniform``) the same with uniform
noise and L1 balls. It runs with every noise that has a soft radius for OptimizeSigma
(:attr:`smoothcert.noise.Noise.soft_radius`) and refuses the others before anything is written.

Guarantee. σ_x is computed from draws of the example's generator that precede, and are
independent of, CERTIFY's selection and estimation draws; so, per example, with probability
≥ 1−α the classifier smoothed at σ_x predicts ``predict_mc`` on the ball of ``radius_mc``
around x (L2, or L1 for uniform noise). The memory then fits each ball around the balls
certified before it, so the memory classifier predicts ``predict`` on the ball of ``radius``
under the same per-example events; an abstention stays ``predict`` = −1 unless x lies in a
stored ball.

Records: CERTIFY's columns, with ``sigma`` = σ_x and ``predict``/``radius``/``correct`` the
memory classifier's answer, then ``predict_mc`` and ``radius_mc`` (the Monte Carlo certificate
at σ_x before the memory) and ``adjusted`` (1 when the memory changed it). ``radius_l1``,
``radius_l2``, ``radius_linf`` are the final answer's: with the memory, the conversions of its
ball (the memory keeps balls of the noise's norm apart, so a direct radius in another norm
would not be sound for the memory classifier); without it, the noise's radii at σ_x.

The memory persists in the record file itself: on resume it is rebuilt from the rows already
written, in file order (each row's idx gives x through the dataset, and its final ``predict``
and ``radius`` the stored ball), which is exactly the memory the interrupted run held. Results
depend on the order of certification: the order in which the engine finishes the inputs, which
is the order of the record file (deterministic for a given seed, batch and index range; inputs
are started in index order and packed into shared forward batches). One memory must see every
input, so the memory certifiers refuse sharding; run them with one
shard, or pass ``--opt memory=false`` to shard the plain per-input certificates (which are not
sound for the data-dependent classifier as a whole, see :class:`Memory`).

Behind a denoiser: a trained denoiser is a fixed function, so the certificate is the
composition's; a diffusion denoiser, whose one-shot timestep is fixed by the run's σ, does not
fit a σ_x per input and is refused (``varies_sigma``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import SmoothcertError, check_bool, check_count, unknown_name
from ..noise.base import NOISES, NoisesWith
from ..registry import option
from ..smoothing import sigma_optimization as dd
from .certifier import (
    CERTIFY_COLUMNS,
    Certifier,
    certificate_row,
    converted_radii,
    radius_columns,
    register_certifier,
)
from .columns import abstention_has_radius_zero, distance, flag, prediction


@dataclass(frozen=True)
class MemoryCertificate:
    """The memory classifier's answer at x: what Algorithm 3 made of a Monte Carlo certificate.

    ``case`` names the paper's Figure 2: "kept" (left: no ball of another class is met),
    "inside" (middle: x lies in a stored ball of another class, whose class it takes),
    "shrunk" (right: the ball is reduced until it meets no ball of another class). ``adjusted``
    is True when ``prediction`` or ``radius`` differ from the Monte Carlo certificate's.
    ``prediction`` is None for an abstention (which stays one unless x lies in a stored ball).
    """

    prediction: int | None
    radius: float
    adjusted: bool
    case: str


class Memory:
    """Memory-based certification (Alfarra et al., Section 3.5, Appendix C, Algorithm 3).

    The memory holds (x_i, c_i, R_i) for every input certified so far, and keeps the invariant

        ‖x_i − x_j‖ ≥ R_i + R_j   whenever c_i ≠ c_j,

    i.e. the open balls B(x_i, R_i) of different classes are disjoint (``norm`` is "l2", or "l1"
    for uniform noise). A new Monte Carlo certificate (c, R) at x is handled by
    :meth:`certify`:

    1. LargestInSubset: if x lies in a stored ball of another class c_j (‖x − x_j‖ < R_j), the
       memory classifier already predicts c_j there. x takes c_j with the largest ball inside
       both its own ball and B(x_j, R_j): R̃ = min(R, R_j − ‖x − x_j‖) (the max over such j;
       all of them have the same class by the invariant).
    2. LargestOutSubset: otherwise R̃ = min(R, min_j (‖x − x_j‖ − R_j)) over the stored
       entries j of other classes: the largest ball around x meeting none of them.
    3. (x, c̃, R̃) is added to the memory.

    Each certificate then holds for the memory classifier with the probability of its Monte
    Carlo certificate, and every stored ball stays valid forever, since later entries are
    fitted around it. Radii never grow.

    Rules not spelled out by the paper, and how we chose:

    * An abstention (c = None, R = 0) makes no claim, so it is not stored; but if x lies in a
      stored ball it takes that ball's class with radius min(0, …) = 0 (the memory classifier
      does predict c_j at x). The authors' ``post_processing_memory_based.py`` stores −1 as a
      class, so later balls are shrunk away from abstained points; we do not, as nothing was
      certified there.
    * The paper takes min(R, R_j − ‖x − x_j‖) in case 1; the authors' post-processing script
      takes R_j − ‖x − x_j‖ alone, which can exceed R. We follow the paper.
    * A radius shrunk to 0 keeps its class: it still claims the prediction at x itself, and
      is stored, so no later ball of another class may contain x.

    **Order dependence.** The outcome depends on the order of insertion (the paper's
    limitations section says so too): a point certified first keeps its ball, and later
    points are fitted around it. The memory is one global object, so certification must be
    sequential over one ordered index list.
    """

    def __init__(self, norm: str = "l2"):
        if norm not in ("l1", "l2"):
            raise SmoothcertError(f"memory norm must be 'l1' or 'l2', got {norm!r}")
        self.norm = norm
        self._centers = torch.empty((0, 0), dtype=torch.float64)
        self._classes = np.empty(0, dtype=np.int64)
        self._radii = np.empty(0, dtype=np.float64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def classes(self) -> np.ndarray:
        return self._classes[: self._size].copy()

    @property
    def radii(self) -> np.ndarray:
        return self._radii[: self._size].copy()

    @property
    def centers(self) -> torch.Tensor:
        """The stored inputs, flattened: shape (M, D), in float64."""
        return self._centers[: self._size].double()

    def certify(self, x: torch.Tensor, prediction: int | None, radius: float) -> MemoryCertificate:
        """Algorithm 3 for one Monte Carlo certificate, then store the result.

        ``x`` is one input of any shape (it is flattened; all inputs must have the same size);
        ``prediction`` the certified class, or None for an abstention; ``radius`` ≥ 0 its radius
        in ``norm``. Returns the memory classifier's answer; distances are computed in float64.
        """
        radius = float(radius) if prediction is not None else 0.0
        if radius < 0 or not math.isfinite(radius):
            raise SmoothcertError(f"a certified radius must be finite and >= 0, got {radius!r}")
        dist = self.distances(x)
        other = self._classes[: self._size] != (-1 if prediction is None else prediction)
        stored = self._radii[: self._size]
        inside = other & (dist < stored)
        if inside.any():  # Figure 2, middle: x already belongs to a ball of another class
            j = np.flatnonzero(inside)[np.argmax(stored[inside] - dist[inside])]
            new_class = int(self._classes[j])
            new_radius = min(radius, float(stored[j] - dist[j]))
            result = MemoryCertificate(new_class, new_radius, True, "inside")
        elif other.any() and prediction is not None:
            gap = float(np.min(dist[other] - stored[other]))  # Figure 2, right, if gap < R
            new_radius = min(radius, gap)
            case = "shrunk" if new_radius < radius else "kept"
            result = MemoryCertificate(prediction, new_radius, case == "shrunk", case)
        else:  # Figure 2, left: nothing of another class is met
            result = MemoryCertificate(prediction, radius, False, "kept")
        if result.prediction is not None:
            self.add(x, result.prediction, result.radius)
        return result

    def add(self, x: torch.Tensor, prediction: int, radius: float) -> None:
        """Store an entry as is (rebuilding a memory from records that already passed
        :meth:`certify`, in their original order)."""
        point = x.detach().reshape(-1).cpu()
        if self._size and point.numel() != self._centers.shape[1]:
            raise SmoothcertError(
                f"input has {point.numel()} values; the memory holds {self._centers.shape[1]}"
            )
        if self._size == self._centers.shape[0]:
            self._grow(point)
        self._centers[self._size] = point
        self._classes[self._size] = int(prediction)
        self._radii[self._size] = float(radius)
        self._size += 1

    def distances(self, x: torch.Tensor) -> np.ndarray:
        """‖x − x_j‖ (in ``norm``) to every stored x_j, computed in float64, shape (M,)."""
        if self._size == 0:
            return np.empty(0, dtype=np.float64)
        point = _flat(x)
        order = 1 if self.norm == "l1" else 2
        chunks = [
            torch.linalg.vector_norm(rows.double() - point, ord=order, dim=1)
            for rows in self._centers[: self._size].split(_CHUNK)
        ]
        return torch.cat(chunks).numpy()

    def _grow(self, point: torch.Tensor) -> None:
        """Double the capacity. Centers keep the inputs' own dtype (float32 images are stored
        exactly in half the memory of float64); distances are float64 all the same."""
        capacity = max(16, 2 * self._centers.shape[0])
        dtype = self._centers.dtype if self._size else point.dtype
        centers = torch.empty((capacity, point.numel()), dtype=dtype)
        if self._size:
            centers[: self._size] = self._centers[: self._size]
        self._centers = centers
        self._classes = np.resize(self._classes, capacity)
        self._radii = np.resize(self._radii, capacity)


_CHUNK = 4096  # rows per float64 distance batch: bounds the temporary memory


def _flat(x: torch.Tensor) -> torch.Tensor:
    """x as a flat float64 CPU vector (the memory's distances are computed in float64)."""
    return x.detach().reshape(-1).to(device="cpu", dtype=torch.float64)


DD_COLUMNS = CERTIFY_COLUMNS[:-1] + ("predict_mc", "radius_mc", "adjusted", "seed")


@register_certifier("data-dependent")
class DataDependent(Certifier):
    """Alfarra et al.: CERTIFY at a σ_x per input, through the memory that keeps it sound;
    OptimizeSigma's budget is ``preset``'s (paper or package), options given override it.

    See this module's doc: σ_x from
    OptimizeSigma (Algorithm 1: ``num_steps`` steps of ``step_size`` with ``num_samples`` draws
    each, ψ clamped to ``clamp``, from the run's σ), CERTIFY at σ_x with the run's noise, then,
    with ``memory``, the memory classifier of Algorithm 3.

    ``preset`` names a :data:`~smoothcert.smoothing.sigma_optimization.BUDGETS` entry: ``paper`` (K
    = 100,
    α_σ = 1e-4, 1 draw, ψ in [0.02, 0.98]: the code behind the paper's numbers) or ``package``
    (K = 900, α_σ = 0.04, 100 draws, ψ in [0.001, 0.999]: the defaults of the authors' later
    ``ddsmoothing`` package, ``ddsmoothing/scripts/run_optimization_dataset.py`` lines 46-61 and
    ``ddsmoothing/ddsmoothing/certificate.py`` lines 64-66). An option given explicitly
    overrides the preset's value. ``clamp`` is ``"low,high"`` or a pair, 0 < low < high < 1.
    The resolved values are the run's identity (:meth:`options`)."""

    columns = DD_COLUMNS
    column_rules = {"predict_mc": prediction("predict_mc"), "radius_mc": distance("radius_mc"),
                    "adjusted": flag("adjusted")}
    relations = (abstention_has_radius_zero("radius_mc", "predict_mc"),)
    needs_n0 = True
    noises = NoisesWith("soft_radius")  # OptimizeSigma ascends the noise's soft radius
    varies_sigma = True  # σ_x per input (a diffusion denoiser's t* is fixed by one σ)

    @dataclass(frozen=True)
    class Options:
        num_steps: int | None = option(None, "K: OptimizeSigma's ascent steps (null: preset's)")
        step_size: float | None = option(None, "α_σ: its step size, >= 0 (null: preset's)")
        num_samples: int | None = option(None, "noise draws per step (null: preset's)")
        memory: bool = option(True, "certify through the memory of Algorithm 3 (sound; the "
                                    "paper's)")
        clamp: tuple[float, float] | None = option(
            None, "ψ's clamp low,high with 0 < low < high < 1 (null: preset's)",
            convert=dd.check_clamp)
        preset: str = option("paper", "the budget the others default to: paper or package")

        def __post_init__(self):
            if self.preset not in dd.BUDGETS:  # the registry's names, checked first
                raise unknown_name("preset", self.preset, dd.BUDGETS)
            check_bool("memory", self.memory)
            if self.num_steps is not None:
                check_count("num_steps", self.num_steps, minimum=0)
            if self.step_size is not None:
                _step_size(self.step_size)
            if self.num_samples is not None:
                check_count("num_samples", self.num_samples)
            if self.clamp is not None:
                dd.check_clamp(self.clamp)

    def setup(self):
        """The attributes hold the resolved budget: the preset's values, the options given
        over them."""
        budget = dd.BUDGETS[self.preset]
        given = self.settings
        self.num_steps = budget.num_steps if given.num_steps is None else given.num_steps
        self.step_size = _step_size(budget.step_size if given.step_size is None
                                    else given.step_size)
        self.num_samples = budget.num_samples if given.num_samples is None \
            else given.num_samples
        self.clamp = dd.check_clamp(budget.clamp if given.clamp is None else given.clamp)

    def options(self) -> dict:
        """The resolved budget (the preset's values, explicit options over them). ``clamp`` and
        ``preset`` are left out at the paper's values, so that the runs from before they were
        options keep their identity and resume; any other value enters it."""
        options = {"num_steps": self.num_steps, "step_size": self.step_size,
                   "num_samples": self.num_samples, "memory": self.memory,
                   "clamp": list(self.clamp), "preset": self.preset}  # as JSON reads it back
        if self.preset == "paper" and self.clamp == dd.CLAMP:
            del options["clamp"], options["preset"]
        return options

    def shardable(self) -> bool:
        """The memory needs one global order over all inputs: only memory-free runs shard."""
        return not self.memory

    def start(self, run):
        norm = NOISES[run.config.noise].norm
        self._memory = _rebuilt_memory(run, norm) if self.memory else None

    def program(self, run, x, label, idx, generator):
        cfg, base = run.config, run.smoothed
        # Algorithm 1: σ_x from the run's σ, with this example's generator (it runs when the
        # engine starts this program, before any of its CERTIFY draws)
        sigma_x = dd.optimize_sigma(
            base.model, x.unsqueeze(0), cfg.sigma, num_steps=self.num_steps,
            step_size=self.step_size, num_samples=self.num_samples, generator=generator,
            noise=cfg.noise, clamp=self.clamp)
        # CERTIFY at σ_x, on fresh draws of the same generator, batched with other inputs'
        smoothed = base.with_noise(NOISES[cfg.noise](float(sigma_x[0])))
        c = yield from smoothed.certify_program(x, cfg.n0, cfg.n, cfg.alpha, generator)
        row = certificate_row(c, label)
        mc = {"predict_mc": row["predict"], "radius_mc": row["radius"], "adjusted": 0}
        if self._memory is None:
            return {**row, **mc}
        # Algorithm 3: the memory classifier's answer, in the order the certificates are
        # issued (= the order of the record file, which a resumed run replays)
        m = self._memory.certify(x, None if c.abstained else c.prediction, c.radius)
        predict = -1 if m.prediction is None else m.prediction
        # the memory keeps balls of the noise's norm apart: only their conversions hold in
        # the other norms (a direct radius of another norm holds for the Monte Carlo answer)
        radii = converted_radii(m.radius, base.noise.norm, x.numel())
        return {**row, **mc, "predict": predict, "radius": m.radius,
                "correct": int(predict == label), "adjusted": int(m.adjusted),
                **radius_columns(radii)}


def _step_size(value) -> float:
    """α_σ: a finite number >= 0 (0 leaves σ_x = σ)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise SmoothcertError(f"step_size must be a finite number >= 0, got {value!r}")
    return float(value)


def _rebuilt_memory(run, norm: str) -> Memory:
    """The memory of the rows already written, inserted in file order (see the module doc)."""
    done = run.done
    memory = Memory(norm)
    for idx, predict, radius in zip(done["idx"], done["predict"], done["radius"], strict=True):
        if predict >= 0:
            memory.add(run.dataset.example(int(idx))[0], int(predict), float(radius))
    return memory
