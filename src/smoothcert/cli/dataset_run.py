"""What certify, predict and attack share: they run a checkpoint's smoothed classifier (behind a
denoiser with ``--denoiser``) over a dataset split into a record file, through one call of
:func:`smoothcert.runs.certify_dataset`."""

from __future__ import annotations

import argparse
import logging
import math
import os

from ..errors import SmoothcertError
from .catalog import names
from .common import (
    BATCH,
    DRAWS,
    add_common,
    example_args,
    image_size_arg,
    is_main_rank,
    progress_mode,
    resolve_device,
    workers_arg,
)

log = logging.getLogger(__name__)  # notes: said once the run is checked (runs/notes.py)

# --------------------------------------------------------------------------- flags
DENOISER_HELP = ("a trained denoiser checkpoint (train --method denoiser-mse|denoiser-stability, "
                 "import-checkpoint --format denoised-smoothing) or diffusers:FOLDER (a local "
                 "diffusers DDPM pipeline or UNet+scheduler folder), put in front of the "
                 "classifier: the smoothed function is classifier(denoiser(x + noise))")


def model_args(p) -> None:
    """The classifier checkpoint and the denoiser in front of it."""
    p.add_argument("checkpoint", nargs="+",
                   help="a smoothcert classifier checkpoint (checkpoint.pt or its run folder); "
                        "several of one dataset form one ensemble base classifier")
    p.add_argument("--ensemble-mode", choices=("logits", "softmax"),
                   help="how several checkpoints combine: the mean of their logits (default) or "
                        "of their softmaxes")
    p.add_argument("--consensus", type=consensus_arg, metavar="K|exact",
                   help="K-consensus (Horváth et al. 2022): on each noisy input the first K "
                        "members run first and, where they agree, their class is the vote (the "
                        "certificates are this consensus classifier's: K < all members is "
                        "cheaper and another classifier, K = all members the ensemble itself); "
                        "'exact' (with --ensemble-mode softmax): each noisy input stops once the "
                        "members still to run cannot change its vote, so the certificates are "
                        "the ensemble's and only the cost falls")
    p.add_argument("--denoiser", metavar="SPEC", help=DENOISER_HELP)


def noise_args(p) -> None:
    p.add_argument("--noise", type=noise_arg, metavar="NAME[:KEY=VALUE]",
                   help="smoothing noise; σ is its per-coordinate standard deviation (default: "
                        "the checkpoint's); a family's parameters after a colon, e.g. "
                        "general-gaussian:k=380")
    p.add_argument("--sigma", type=sigma_arg,
                   help="noise level (default: the checkpoint's; required for a classifier "
                        "trained without noise, e.g. train --method standard); a "
                        "comma-separated list, largest first, for --certifier cascade")


def noise_arg(text: str) -> str:
    """--noise: a known noise's name, with its family's parameters after a colon (checked by
    the library, which knows what each family takes)."""
    known = sorted(names("noises"))
    if text.partition(":")[0] not in known:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                         f"{', '.join(known)})")
    return text


def sigma_arg(text: str):
    """--sigma: one σ, or several (``1.0,0.5,0.25``: a cascade's levels) as a tuple; each a
    finite number > 0 (the order is the certifier's to check)."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected a number > 0 or a comma-separated list of "
                                         f"them, got {text!r}")
    return values[0] if len(values) == 1 else values


def sigma_levels(args, certifier: str, options: dict) -> tuple[float | None, dict]:
    """(σ of the run, the certifier's options): a --sigma list goes to the option the certifier
    names for it (``Certifier.sigma_list_option``: a cascade's ``sigmas``), σ being its first;
    a certifier without one refuses a list in one line. Several checkpoints of a certifier that
    takes one per level (``checkpoint_roles``) become its other models by role."""
    cls, sigma = _certifier_class(certifier), args.sigma
    if isinstance(sigma, tuple):
        if cls.sigma_list_option is None:
            raise SmoothcertError(f"--sigma takes one value with --certifier {certifier}; a "
                                  "list is for a certifier over several levels (cascade)")
        if options.get(cls.sigma_list_option):
            raise SmoothcertError(f"--sigma {','.join(f'{v:g}' for v in sigma)} and --opt "
                                  f"{cls.sigma_list_option}={options[cls.sigma_list_option]} "
                                  "both give the levels' sigmas: pass one of them")
        options = {**options, cls.sigma_list_option: ",".join(map(repr, sigma))}
        sigma = sigma[0]
    return sigma, options


def monte_carlo_args(p, n_help: str = "draws, at most 2**53 (default 100000)") -> None:
    p.add_argument("--n", type=DRAWS, default=100_000, help=n_help)
    p.add_argument("--alpha", type=float, default=0.001, help="failure probability")
    p.add_argument("--batch", type=BATCH,
                   help="noisy inputs per forward pass, at most 2**31-1; lower it when the "
                        "device runs out of memory (default: on CUDA the fastest of a few "
                        "batches, measured on the model before the first row, for a run long "
                        f"enough to pay for it and not for an ensemble; else {DEFAULT_BATCH}; the "
                        "rows are the same at any batch)")


def dataset_run_args(p) -> None:
    """Which examples, the seed, the record file and the shard: every runner command's flags."""
    example_args(p, "test", "the split whose examples are run",
                 "run seed; example idx uses (seed, idx)")
    p.add_argument("--out", required=True, help="record file (TSV); a manifest goes beside it")
    p.add_argument("--num-shards", type=int, help="default: WORLD_SIZE or SLURM array size")
    p.add_argument("--shard-index", type=int, help="default: RANK or SLURM array task id")
    image_size_arg(p, "image folders: side S of the square inputs (default: the "
                      "checkpoint's input size)")
    workers_arg(p)
    _engine_args(p)
    add_common(p)


def _engine_args(p) -> None:
    """The engine's optional accelerations. Each is recorded in the run's identity, as the
    function it computes may differ (bf16), or may round differently (channels-last, compile
    and its mode); the defaults of the last three depend on the device, and a record file
    keeps its own (:func:`engine_settings`)."""
    p.add_argument("--precision", default="fp32", choices=tuple(names("precisions")),
                   help="run the model under bf16/fp16 autocast (noise stays float32; the "
                        "certificate is then for the reduced-precision classifier)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction,
                   help="channels-last memory format for the model and its inputs (default: "
                        "on with CUDA, off on the CPU; a record file being resumed keeps its "
                        "own)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="torch.compile the model (default: on with CUDA for a run of one "
                        f"classifier of at least {LONG_RUN_DRAWS:,} draws, examples × "
                        "(n0 + n), where the compilation pays; off on the CPU, for ensembles "
                        "and denoisers; a record file being resumed keeps its own)")
    p.add_argument("--compile-mode", choices=COMPILE_MODES,
                   help="torch.compile's mode, with --compile: reduce-overhead and "
                        "max-autotune record CUDA graphs, one launch per batch (default: "
                        f"{GRAPHS_MODE} on CUDA, default on the CPU; a record file being "
                        "resumed keeps its own)")


# --------------------------------------------------------------------------- engine defaults
LONG_RUN_DRAWS = 2 * 10**7
"""From this many draws (examples × (n0 + n), every shard together) a run is long: on CUDA it is
compiled by default, and told about ``--precision bf16``. Why 2·10⁷ (docs/BENCHMARKS.md, GPU
suite, H100): torch.compile costs tens of seconds once per process (the suite's compiled call,
four compilations and their timed runs, took 91 s), and saves 5 µs a draw or more (ResNet-110
bf16+channels-last 1.421 → 0.912 s per 100,100 draws; fp32 2.653 → 1.357 s, 13 µs; ResNet-50
30 µs and more). At 30 s of compilation it pays from 6·10⁶ draws; 2·10⁷ (200 images at
n = 100,000; Cohen et al.'s 500-image runs are 5·10⁷) leaves a factor 3 of margin."""
SETTINGS = ("precision", "channels_last", "compile", "compile_mode")
OFF = {"precision": "fp32", "channels_last": False, "compile": False,
       "compile_mode": "default"}  # the engine's defaults
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # engine.COMPILE_MODES, torch-free
GRAPHS_MODE = "reduce-overhead"
"""torch.compile's mode on CUDA where it compiles: CUDA graphs, one launch per batch instead of
one per kernel, the kernels those of the default mode (so the same function, to the same
rounding); the engine forwards every batch whole, so a graph is recorded once. On an H200
(ResNet-50, torch 2.11, n0 = 100, n = 100,000) bf16 + channels-last + compile took 4.5 s per
image, 4.30 s with CUDA graphs. max-autotune (graphs and kernels tuned for minutes) is a
choice, not a default."""
DEFAULT_BATCH = 1000  # noisy inputs per forward where none is given or measured


def compiler_available() -> bool:
    """Whether torch.compile can build kernels for CUDA here (Triton and a GPU it supports)."""
    try:
        from torch.utils._triton import has_triton
    except ImportError:  # pragma: no cover - an old torch
        return False
    return has_triton()


def device_defaults(device_type: str, draws: int, one_classifier: bool,
                    compiled: bool | None = None) -> dict:
    """The engine's settings where no flag and no record file says otherwise: channels-last on
    CUDA (faster for convolutions; the same function up to float rounding), torch.compile on
    CUDA for a long run (:data:`LONG_RUN_DRAWS`) of one classifier (ensembles branch per input
    and denoisers were not measured compiled), in :data:`GRAPHS_MODE` on CUDA where it compiles
    (``compiled``: as a flag says, when one does); float32 always, as bf16 certifies another
    function. The CPU runs as the library does by default."""
    cuda = device_type == "cuda"
    if compiled is None:
        compiled = cuda and draws >= LONG_RUN_DRAWS and one_classifier and compiler_available()
    return {"precision": "fp32", "channels_last": cuda, "compile": compiled,
            "compile_mode": GRAPHS_MODE if cuda and compiled else "default"}


def made_with(out, shard: tuple[int, int]) -> tuple[object, dict] | None:
    """(file, its engine settings) of the run's record file on disk, else of a sibling shard's
    (so that shards merge), or None; a file without a readable manifest is left to the runner,
    which refuses it."""
    from ..runs.records import read_manifest, shard_path

    index, count = shard
    for k in [index] + [k for k in range(count) if k != index]:
        path = shard_path(out, k, count)
        try:
            identity = (read_manifest(path) or {}).get("identity") if path.exists() else None
        except SmoothcertError:
            identity = None
        if isinstance(identity, dict) and isinstance(identity.get("engine"), dict):
            return path, {**OFF, **identity["engine"]}
    return None


def engine_settings(args, device_type: str, draws: int, shard: tuple[int, int]) -> dict:
    """The engine's settings: each flag given; for each left out, those of the run's record
    file (or a sibling shard's) when there is one, so that it resumes as it was made, else
    :func:`device_defaults` (a ``--compile-mode`` other than default compiles). A flag that
    contradicts the file is one SmoothcertError line naming the flags that resume it. Logs a
    note on what the CUDA defaults chose, said once the run is checked (runs/notes.py)."""
    from ..runs.records import shard_path

    given = {key: getattr(args, key) for key in SETTINGS}
    found = made_with(args.out, shard)
    if found is not None:
        _check_made_with(*found, given, own=found[0] == shard_path(args.out, *shard))
        return {key: found[1][key] if value is None else value for key, value in given.items()}
    compiled = given["compile"]
    if compiled is None and given["compile_mode"] not in (None, "default"):
        compiled = True  # a mode that compiles asks for compile
    one = _one_model(args) and args.denoiser is None
    defaults = device_defaults(device_type, draws, one, compiled)
    engine = {key: defaults[key] if value is None else value for key, value in given.items()}
    if device_type == "cuda" and is_main_rank():
        _cuda_notes(engine, given, draws)
    return engine


def _one_model(args) -> bool:
    """One checkpoint, not an ensemble (of one, when --ensemble-mode or --consensus asks)."""
    return len(args.checkpoint) == 1 and args.ensemble_mode is None and args.consensus is None


def _check_made_with(path, made: dict, given: dict, own: bool) -> None:
    """Refuse flags that contradict the settings ``made`` of the run's file ``path`` (``own``:
    this shard's, else a sibling shard's, which this one must match to merge with it)."""
    if all(value is None or value == made[key] for key, value in given.items()):
        return
    said = ", ".join(f"{key.replace('_', '-')} {_on(made[key])}" for key in SETTINGS)
    flags = " ".join(_flag(key, made[key]) for key in SETTINGS)
    goal = "resume it" if own else "run a shard that merges with it"
    raise SmoothcertError(f"{path} was made with {said}; rerun with {flags} to {goal}, or "
                          "choose another --out")


def _on(value) -> str:
    return value if isinstance(value, str) else "on" if value else "off"


def _flag(key: str, value) -> str:
    """The flag that sets engine setting ``key`` to ``value``."""
    name = key.replace("_", "-")
    return f"--{name} {value}" if isinstance(value, str) else \
        f"--{'' if value else 'no-'}{name}"


def _cuda_notes(engine: dict, given: dict, draws: int) -> None:
    """One line on what the CUDA defaults chose, and the flags that choose otherwise (the
    compile mode where it compiles). The hint on ``--precision bf16`` is measured on the model
    (:func:`tuning`)."""
    chosen = [key for key in SETTINGS[1:] if given[key] is None
              and (key != "compile_mode" or engine["compile"])]
    if chosen:
        said = ", ".join(f"{key.replace('_', '-')} {_on(engine[key])}" for key in chosen)
        other = {"compile_mode": "default"}  # the other choice of each, to change it
        flags = ", ".join(_flag(key, other.get(key, not engine[key])) for key in chosen)
        log.warning("note: CUDA defaults for a run of %s draws: %s (%s to change)",
                    f"{draws:,}", said, flags)


def tuning(args, device_type: str, engine: dict, draws: int):
    """What a CUDA run measures on its model before its first row (runs/tuning.py): the batch,
    where --batch is not given, and bf16's time beside a long float32 run's. None on the CPU
    (which keeps its batch) and for an ensemble, whose member evaluations would count the
    measurement's forwards."""
    from ..smoothing.probe import BATCHES, Tuning

    if device_type != "cuda" or not _one_model(args):
        return None
    batches = BATCHES if args.batch is None else ()
    compare = ("bf16",) if engine["precision"] == "fp32" and draws >= LONG_RUN_DRAWS else ()
    return Tuning(batches, compare) if batches or compare else None


def run_draws(args, dataset_size: int) -> int:
    """Draws of the whole run, every shard together: examples × (n0 + n)."""
    examples = -(-dataset_size // args.skip)  # every skip-th index
    if args.max_count is not None:
        examples = min(examples, args.max_count)
    return examples * (args.n + (getattr(args, "n0", None) or 0))


# --------------------------------------------------------------------------- the shard
def shard_from_env(env=os.environ) -> tuple[int, int]:
    """(shard index, number of shards) from torchrun's RANK/WORLD_SIZE or a SLURM array; a
    malformed variable is one SmoothcertError naming it."""
    from ..training.distributed import launcher_rank, slurm_array_task

    return launcher_rank(env) or slurm_array_task(env) or (0, 1)


def _shard(args) -> tuple[int, int]:
    """--shard-index/--num-shards over the launcher's rank (given both, the launcher is not
    asked)."""
    given = args.num_shards is not None and args.shard_index is not None
    index, count = (0, 1) if given else shard_from_env()  # flags override the launcher's
    count = args.num_shards if args.num_shards is not None else count
    index = args.shard_index if args.shard_index is not None else index
    if count < 1 or not 0 <= index < count:
        raise SmoothcertError(f"--shard-index must lie in 0..{count - 1}, got {index}")
    return index, count


# --------------------------------------------------------------------------- the run
def run_certifier(certifier: str, args, options: dict) -> None:
    """Load the checkpoint's dataset split and hand everything to ``certify_dataset``; the
    certifier is ``--certifier`` where the command has one, else ``certifier``. Every note is
    held until the run is checked (``runs/notes.py``): a refused run prints its error alone."""
    from ..runs.notes import holding_notes
    from ..runs.records import shard_path

    with holding_notes():
        model, shard = _certify(getattr(args, "certifier", certifier), args, options)
    print(f"records: {shard_path(args.out, *shard)}")
    per_input = getattr(model, "evaluations_per_input", lambda: None)()
    if per_input is not None:  # what a consensus saved, in this invocation
        print(f"member evaluations per noisy input: {per_input:.3f} of {len(model.members)} "
              f"({model.evaluations} in all)")


def _certify(certifier: str, args, options: dict) -> tuple[object, tuple[int, int]]:
    """The run of :func:`run_certifier`: its model (a checkpoint path or an ensemble) and
    shard, once ``certify_dataset`` has written its rows."""
    from ..models.checkpoint import load_checkpoint
    from ..runs import certify_dataset
    from ..runs.inputs import check_classifier
    from ..training.distributed import rank_device

    sigma, options = sigma_levels(args, certifier, options)
    models = _role_models(args, certifier, options)  # before any checkpoint is read
    metas = [load_checkpoint(c).meta for c in args.checkpoint]
    for checkpoint, meta in zip(args.checkpoint, metas):
        check_classifier(checkpoint, meta)  # before the dataset is loaded
    device = rank_device(resolve_device(args.device))  # one GPU per torchrun rank
    model = _model(args, device)  # an ensemble's members checked before the dataset loads
    dataset, shard = _run_dataset(args, metas[0]), _shard(args)
    draws = run_draws(args, len(dataset))
    engine = engine_settings(args, device.type, draws, shard)
    certify_dataset(
        model, dataset, sigma=sigma, noise=args.noise,
        n0=getattr(args, "n0", 100),  # predict and attack have no selection draws
        n=args.n, alpha=args.alpha,
        batch=args.batch if args.batch is not None else DEFAULT_BATCH,
        seed=args.seed, skip=args.skip, max_count=args.max_count, certifier=certifier,
        options=options, out=args.out, shard=shard, device=device, workers=args.workers,
        engine=engine, progress=progress_mode(args) if is_main_rank() else False,
        denoiser=args.denoiser, models=models,
        tune=tuning(args, device.type, engine, draws),  # after every check, before a row
    )
    return model, shard


def consensus_arg(text: str):
    """--consensus: 'exact' or a positive integer K (the upper bound, the number of members, is
    checked when the ensemble is built)."""
    if text == "exact":
        return text
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"expected 'exact' or a positive integer K, got {text!r}")
    return k


def _certifier_class(name: str):
    """The class of certifier ``name``, an old spelling (``uniform``) read silently: the run
    says its deprecation line once, when it upgrades the name."""
    from ..runs import certifier_class
    from ..upgrade import OLD_CERTIFIER_NAMES

    return certifier_class(OLD_CERTIFIER_NAMES.get(name, (name,))[0])


def _role_models(args, certifier: str, options: dict) -> dict:
    """The certifier's other models by role: each ``--model ROLE=CKPT``, and the checkpoints
    after the first where the certifier takes one per level (a cascade's); ``args.checkpoint``
    then keeps the first alone, the run's model."""
    from ..certifiers import build_certifier

    models = {}
    for item in getattr(args, "model", None) or []:  # paths as typed: no YAML reading
        role, sep, path = item.partition("=")
        if not sep or not role or not path:
            raise SmoothcertError(f"--model takes ROLE=CKPT, got {item!r}")
        if role in models:
            raise SmoothcertError(f"--model {role} is given twice")
        models[role] = path
    roles = build_certifier(_certifier_class(certifier), options).checkpoint_roles(
        len(args.checkpoint))
    if roles is not None:
        for role, path in zip(roles, args.checkpoint[1:]):
            if role in models:
                raise SmoothcertError(f"the {role} model is given twice: as a checkpoint and "
                                      "as --model")
            models[role] = path
        args.checkpoint = args.checkpoint[:1]
    return models


def _model(args, device):
    """The one checkpoint, or the :class:`~smoothcert.models.ensemble.Ensemble` of several (or
    of one, when --ensemble-mode or --consensus asks for it)."""
    from ..models.ensemble import Ensemble

    if _one_model(args):
        return args.checkpoint[0]
    return Ensemble.from_checkpoints(args.checkpoint, args.ensemble_mode or "logits",
                                     args.consensus, device=device)


def _run_dataset(args, meta: dict):
    """The split to run on; an image folder at the checkpoint's input size unless
    ``--image-size`` says otherwise."""
    from ..data.datasets import load_dataset
    from ..data.registry import dataset_spec

    name = args.dataset or meta["dataset"]
    image_size = args.image_size
    if image_size is None and dataset_spec(name).streamed:
        image_size = int(meta["input_shape"][-1])
    return load_dataset(name, args.split, data_root=args.data_root, image_size=image_size)
