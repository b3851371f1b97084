"""Certifiers for data-dependent smoothing (Alfarra et al.) and uniform noise (Yang et al. 2020).

* ``uniform``: Cohen et al.'s CERTIFY with U[−λ, λ]^d noise, λ = √3·σ (σ = ``--sigma``, the
  standard deviation); the radius is the L1 radius 2λ·(p_lower − ½).
* ``data-dependent``: per input, σ_x = OptimizeSigma(x) started at the run's σ (the training
  σ), then CERTIFY with N(0, σ_x²I); with ``memory`` (default) the certificate is passed through
  the memory of Algorithm 3, which makes it a sound certificate of the data-dependent
  classifier. ``data-dependent-uniform`` is the same with uniform noise and L1 balls.

Guarantee. σ_x is computed from draws of the example's generator that precede, and are
independent of, CERTIFY's selection and estimation draws; so, per example, with probability
≥ 1−α the classifier smoothed at σ_x predicts ``predict_mc`` on the ball of ``radius_mc``
around x (L2, or L1 for uniform noise). The memory then fits each ball around the balls
certified before it, so the memory classifier predicts ``predict`` on the ball of ``radius``
under the same per-example events; an abstention stays ``predict`` = −1 unless x lies in a
stored ball.

Records: CERTIFY's columns, with ``sigma`` = σ_x and ``predict``/``radius``/``correct`` the
memory classifier's answer, then ``predict_mc`` and ``radius_mc`` (the Monte Carlo certificate
at σ_x before the memory) and ``adjusted`` (1 when the memory changed it).

The memory persists in the record file itself: on resume it is rebuilt from the rows already
written, in file order (each row's idx gives x through the dataset, and its final ``predict``
and ``radius`` the stored ball), which is exactly the memory the interrupted run held. Results
depend on the order of certification: the order in which the engine finishes the inputs, which
is the order of the record file (deterministic for a given seed, batch and index range; inputs
are started in index order and packed into shared forward batches). One memory must see every
input, so the memory certifiers refuse sharding; run them with one
shard, or pass ``--opt memory=false`` to shard the plain per-input certificates (which are not
sound for the data-dependent classifier as a whole, see :class:`~smoothcert.data_dependent.Memory`).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import data_dependent as dd
from ..noise import NOISES, Uniform
from ..smoothing import Smoothed
from .runner import CERTIFY_COLUMNS, RunContext, Task, certificate_row, register_task

DD_COLUMNS = CERTIFY_COLUMNS[:-1] + ("predict_mc", "radius_mc", "adjusted", "seed")

DD_OPTIONS = {
    "num_steps": dd.NUM_STEPS,  # K; source in smoothcert.data_dependent.NUM_STEPS
    "step_size": dd.STEP_SIZE,  # α_σ; source in smoothcert.data_dependent.STEP_SIZE
    "num_samples": dd.NUM_SAMPLES,  # n per step; source in smoothcert.data_dependent.NUM_SAMPLES
    "memory": True,  # Algorithm 3: the paper certifies every DS result with it
}


def _uniform(run: RunContext) -> Callable:
    cfg, base = run.config, run.smoothed
    smoothed = Smoothed(base.model, Uniform(cfg.sigma), base.num_classes, base.engine)

    def program(x, label, idx, gen):
        c = yield from smoothed.certify_program(x, cfg.n0, cfg.n, cfg.alpha, gen)
        return certificate_row(c, label)

    return program


def _data_dependent(noise: str) -> Callable[[RunContext], Callable]:
    def make(run: RunContext) -> Callable:
        cfg, base, opts = run.config, run.smoothed, run.config.options
        memory = _rebuilt_memory(run, NOISES[noise].norm) if opts["memory"] else None

        def program(x, label, idx, gen):
            # Algorithm 1: σ_x from the run's σ, with this example's generator (it runs when the
            # engine starts this program, before any of its CERTIFY draws)
            sigma_x = dd.optimize_sigma(
                base.model, x.unsqueeze(0), cfg.sigma, num_steps=opts["num_steps"],
                step_size=opts["step_size"], num_samples=opts["num_samples"], generator=gen,
                noise=noise)
            # CERTIFY at σ_x, on fresh draws of the same generator, batched with other inputs'
            smoothed = Smoothed(base.model, NOISES[noise](float(sigma_x[0])), base.num_classes,
                                base.engine)
            c = yield from smoothed.certify_program(x, cfg.n0, cfg.n, cfg.alpha, gen)
            row = certificate_row(c, label)
            mc = {"predict_mc": row["predict"], "radius_mc": row["radius"], "adjusted": 0}
            if memory is None:
                return {**row, **mc}
            # Algorithm 3: the memory classifier's answer, in the order the certificates are
            # issued (= the order of the record file, which a resumed run replays)
            m = memory.certify(x, None if c.abstained else c.prediction, c.radius)
            predict = -1 if m.prediction is None else m.prediction
            return {**row, **mc, "predict": predict, "radius": m.radius,
                    "correct": int(predict == label), "adjusted": int(m.adjusted)}

        return program

    return make


def _rebuilt_memory(run: RunContext, norm: str) -> dd.Memory:
    """The memory of the rows already written, inserted in file order (see the module doc)."""
    done = run.done
    memory = dd.Memory(norm)
    for idx, predict, radius in zip(done["idx"], done["predict"], done["radius"], strict=True):
        if predict >= 0:
            memory.add(run.dataset.example(int(idx))[0], int(predict), float(radius))
    return memory


def _without_memory(options: dict) -> bool:
    """The memory needs one global order over all inputs: only memory-free runs shard."""
    return not options["memory"]


register_task("uniform", Task(CERTIFY_COLUMNS, _uniform, needs_n0=True, batched=True))
register_task("data-dependent", Task(
    DD_COLUMNS, _data_dependent("gaussian"), needs_n0=True, options=dict(DD_OPTIONS),
    shardable=_without_memory, batched=True))
register_task("data-dependent-uniform", Task(
    DD_COLUMNS, _data_dependent("uniform"), needs_n0=True, options=dict(DD_OPTIONS),
    shardable=_without_memory, batched=True))
