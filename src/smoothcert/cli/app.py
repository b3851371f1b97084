"""The ``smoothcert`` command line: subcommands only parse, build and call the library.

Any user error becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from ..errors import MAX_BATCH, MAX_DRAWS, MAX_INDEX, SmoothcertError
from ..registry import Registry


@dataclass(frozen=True)
class Command:
    """A subcommand (or an ``analyze`` analysis): its one-line ``help``, ``add_arguments(parser)``
    declaring its flags, and ``run(args)``."""

    help: str
    add_arguments: Callable
    run: Callable


COMMANDS: Registry = Registry("command")
"""Subcommand name -> :class:`Command`, in the order ``smoothcert --help`` lists them."""


def command(name: str, help: str, add_arguments: Callable):
    """Register subcommand ``name``: ``add_arguments(parser)`` declares it; the decorated runs."""

    def deco(run: Callable) -> Callable:
        COMMANDS.register(name)(Command(help, add_arguments, run))
        return run

    return deco


class _HelpFormatter(argparse.HelpFormatter):
    """Every flag's default shown once, ArgumentDefaultsHelpFormatter-style (a help text that
    mentions its default already keeps its own wording), and the lines ``NAME\tDESCRIPTION`` of
    a listing laid out as a table whose descriptions wrap under themselves."""

    def _get_help_string(self, action) -> str:
        default = _default_text(action.default) if action.option_strings else None
        return _with_default(action.help, default and default.replace("%", "%%"))

    def _split_lines(self, text: str, width: int) -> list[str]:
        return [line for part in text.splitlines() for line in _layout(part, width)]

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = (line for part in text.splitlines() for line in _layout(part, width - len(indent)))
        return "\n".join(indent + line if line else "" for line in lines)


_COLUMN = 20  # where the descriptions of a listing start


def _layout(line: str, width: int) -> list[str]:
    """One line of help text wrapped to ``width``; ``NAME\tDESCRIPTION`` becomes a table row."""
    name, tab, description = line.partition("\t")
    if not tab:
        return textwrap.wrap(" ".join(line.split()), width) or [""]
    lead = f"  {name}".ljust(_COLUMN - 1) + " "
    return textwrap.wrap(description, width, initial_indent=lead,
                         subsequent_indent=" " * _COLUMN) or [lead.rstrip()]


def _default_text(value) -> str | None:
    """How a default reads in help; None where nothing is set (None, an unset switch, [])."""
    if value is None or value is False or value is argparse.SUPPRESS or value in ([], {}):
        return None
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _with_default(help_text: str | None, default: str | None) -> str | None:
    """``help_text (default: DEFAULT)``, unless there is no default or the text names it."""
    if default is None or help_text is None or re.search(r"\bdefault\b", help_text, re.I):
        return help_text
    return f"{help_text} (default: {default})"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2 (argparse would also print the usage)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from ..version import __version__

    parser = _Parser(prog="smoothcert",
                     description="Randomized smoothing: train, certify, attack, report.")
    parser.add_argument("--version", action="version", version=f"smoothcert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, cmd in COMMANDS.items():
        cmd.add_arguments(sub.add_parser(name, help=cmd.help, description=cmd.help))
    return parser


# What an interrupted command's user does next. ``train`` refuses an existing run folder unless
# told to continue it, so its hint names --resume; certify, predict, attack and demo resume by
# rerunning the same command (their record files are resumable); the others just start again.
RESUME_HINTS = {"train": "rerun the same command with --resume to continue",
                **dict.fromkeys(("report", "merge", "import-checkpoint"),
                                "rerun the same command")}


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a one-line usage error (exit 2)
        return int(e.code or 0)
    try:
        COMMANDS[args.command].run(args)
    except SmoothcertError as e:
        print(f"smoothcert {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"smoothcert {args.command}: error: {e.strerror or e}: {e.filename or ''}",
            file=sys.stderr,
        )
        return 2
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        print(f"smoothcert {args.command}: error: {_memory_advice(args, e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = RESUME_HINTS.get(args.command, "rerun the same command to resume")
        print(f"smoothcert {args.command}: interrupted; {hint}", file=sys.stderr)
        return 130
    return 0


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device (or the host) could not hold an allocation:
    ``torch.cuda.OutOfMemoryError``, CPU allocator failures, ``MemoryError``."""
    if isinstance(e, MemoryError):
        return True
    text = str(e).lower()
    return type(e).__name__ == "OutOfMemoryError" or any(
        words in text for words in ("out of memory", "can't allocate memory",
                                    "not enough memory", "cannot allocate memory"))


def _memory_advice(args, e: BaseException) -> str:
    """One line for an allocation that failed: which batch flag to lower, and what was kept."""
    detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    if hasattr(args, "batch"):  # certify, predict, attack, analyze
        kept = ("; the rows already written are kept and a rerun resumes after them"
                if getattr(args, "out", None) else "")
        return (f"out of memory with --batch {args.batch} ({detail}); rerun with a smaller "
                f"--batch{kept}")
    if args.command == "train":
        return (f"out of memory ({detail}); rerun with a smaller --batch, or on a device "
                "with more memory; the last completed epoch's checkpoint is kept (--resume)")
    return f"out of memory ({detail})"


# --------------------------------------------------------------------------- shared arguments


def _int_at_most(limit: int, why: str) -> Callable[[str], int]:
    """An argparse type: an int no larger than ``limit`` (``why`` says where the limit is from)."""

    def parse(text: str) -> int:
        value = int(text)  # argparse turns a ValueError into "invalid int value"
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit} ({why}), got {text}")
        return value

    parse.__name__ = "int"
    return parse


_DRAWS = _int_at_most(MAX_DRAWS, "2**53: vote counts are exact float64 integers")
_BATCH = _int_at_most(MAX_BATCH, "2**31-1: rows of one forward batch")
_INDEX = _int_at_most(MAX_INDEX, "2**63-1: int64 example indices")


def resolve_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SmoothcertError("--device cuda was asked for but CUDA is not available")
    return torch.device(name)


def _image_size_arg(p, help_text: str) -> None:
    p.add_argument("--image-size", type=int, metavar="S", help=help_text)


def _workers_arg(p) -> None:
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes decoding images ahead of the model (default: none for "
                        "in-memory datasets; for image folders one per core but one, at most 8)")


def _add_common(p: argparse.ArgumentParser, data_root: bool = True) -> None:
    """--device, --data-root (unless the command has its own) and --progress."""
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the model runs and noise is drawn (default: auto)",
    )
    if data_root:
        p.add_argument("--data-root", default=None, help="folder holding the datasets' files")
    p.add_argument("--progress", choices=PROGRESS, default="auto",
                   help="progress bars on stderr: auto draws them only when stderr is a "
                        "terminal (a log file or a SLURM output would fill with carriage "
                        "returns)")
    p.add_argument("--no-progress", dest="progress", action="store_const", const="never",
                   help="the same as --progress never")


PROGRESS = ("auto", "always", "never")


def _progress(args) -> bool:
    """Whether to draw progress bars: ``--progress`` resolved against stderr, where they go."""
    if args.progress == "auto":
        return sys.stderr.isatty()
    return args.progress == "always"


def shard_from_env(env=os.environ) -> tuple[int, int]:
    """(shard index, number of shards) from torchrun's RANK/WORLD_SIZE or a SLURM array; a
    malformed variable is one SmoothcertError naming it."""
    from ..training.distributed import launcher_rank, slurm_array_task

    return launcher_rank(env) or slurm_array_task(env) or (0, 1)


def _shard(args) -> tuple[int, int]:
    given = args.num_shards is not None and args.shard_index is not None
    index, count = (0, 1) if given else shard_from_env()  # flags override the launcher's
    count = args.num_shards if args.num_shards is not None else count
    index = args.shard_index if args.shard_index is not None else index
    if count < 1 or not 0 <= index < count:
        raise SmoothcertError(f"--shard-index must lie in 0..{count - 1}, got {index}")
    return index, count


# --------------------------------------------------------------------------- train
def _train_args(p):
    """One flag per TrainConfig field, generated from the field (its metadata holds the help
    text, the flag where it is not --field-name, and the registry of its names, listed in the
    epilog), the old --dd-* spellings of --sigma-param, and the run's own flags."""
    from ..training.config import TrainConfig

    p.add_argument("--config", metavar="YAML",
                   help="recipe: a YAML file of TrainConfig fields (configs/); flags override it")
    for f in dataclasses.fields(TrainConfig):
        _field_flag(p, f, _flag_type(typing.get_type_hints(TrainConfig)[f.name]))
    _legacy_sigma_flags(p)
    p.add_argument("--out", required=True, help="run folder: checkpoint.pt, log.tsv, config.yaml")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic cuDNN kernels: on a GPU, a resumed run then ends with the "
                        "same weights as an uninterrupted one (slower)")
    _workers_arg(p)
    _add_common(p, data_root=False)  # --data-root is a field
    p.epilog = _choices_epilog(TrainConfig)


def _field_flag(p, f: dataclasses.Field, kind: type) -> None:
    """The flag of TrainConfig field ``f``, whose values are of type ``kind``. An unset flag
    leaves no attribute (argparse.SUPPRESS), so that a recipe's value stands; its help states
    the field's default itself."""
    options = {"dest": f.name, "default": argparse.SUPPRESS, "help": _field_help(f),
               "metavar": f.metadata["metavar"]}
    if kind is bool:
        options["action"] = argparse.BooleanOptionalAction
    elif kind is dict:  # KEY=VALUE, repeatable: one key of the mapping each
        options["action"] = "append"
    else:
        options["type"] = _int_tuple if kind is tuple else kind
    p.add_argument(_flag(f), **options)


def _flag(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _flag_type(hint) -> type:
    """``int`` for ``int | None``, ``tuple`` for ``tuple[int, ...]``, the type itself else."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return typing.get_origin(hint) or hint


def _field_help(f: dataclasses.Field) -> str:
    text = f.metadata["help"]
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return f"{text}; required (flag or --config)"
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    shown = ("on" if default else "off") if isinstance(default, bool) else _default_text(default)
    return _with_default(text, shown)


def _int_tuple(text: str) -> tuple[int, ...]:
    """``30,60`` -> (30, 60)."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 30,60, got {text!r}") from None


def _legacy_sigma_flags(p) -> None:
    """--dd-steps, --dd-step-size, --dd-num-samples, --dd-start-epoch: the old spellings of
    ``--sigma-param KEY=VALUE`` for the data-dependent σ mode (named in that flag's help)."""
    from ..training.config import LEGACY_SIGMA_MODE, LEGACY_SIGMA_PARAMS
    from ..training.sigma_modes import build_sigma_mode

    defaults = build_sigma_mode(LEGACY_SIGMA_MODE).params()
    for old, new in LEGACY_SIGMA_PARAMS.items():
        p.add_argument("--" + old.replace("_", "-"), dest=old, type=type(defaults[new]),
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _choices_epilog(config_cls) -> str:
    """The names of every field that takes one from a registry, one line each."""
    lines = ["names (a method's hyperparameters and a σ mode's parameters, set with --param and "
             "--sigma-param, in brackets with their defaults):"]
    for f in dataclasses.fields(config_cls):
        if f.metadata["choices"] is not None:
            lines += ["", f"{_flag(f)} {f.metadata['metavar']}"]
            lines += [f"{name}\t{text}" for name, text in f.metadata["choices"]().items()]
    return "\n".join(lines)


@command("train", "train a base classifier with a smoothing-aware method", _train_args)
def cmd_train(args):
    from ..training import TrainConfig, train
    from ..training.recipes import load_recipe

    recipe = load_recipe(args.config) if args.config else {}
    config = TrainConfig.from_dict(_train_fields(recipe, args))
    if config.init_checkpoint is not None:
        from ..io import check_not_input
        from ..training.loop import CHECKPOINT

        check_not_input(os.path.join(args.out, CHECKPOINT), [config.init_checkpoint],
                        what="the --init-from checkpoint")
    if args.deterministic:
        import torch

        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    path = train(
        config,
        args.out,
        device=resolve_device(args.device),
        resume=args.resume,
        progress=_progress(args),
        workers=args.workers,
        epoch_lines=True,  # without bars too: a log (SLURM, `make demo > log`) shows each epoch
    )
    if os.environ.get("RANK", "0") == "0":  # once under torchrun
        print(f"checkpoint: {path}")


def _train_fields(recipe: dict, args) -> dict:
    """The recipe's fields with the flags' over them. A KEY=VALUE flag sets one key of its
    mapping; a σ-mode parameter set by a flag under either spelling (--sigma-param num_steps=K
    or --dd-steps K) replaces the recipe's under both."""
    from ..training.config import LEGACY_SIGMA_PARAMS, TrainConfig

    fields = dict(recipe)
    for f in dataclasses.fields(TrainConfig):
        if f.default_factory is dict:
            fields[f.name] = _merged(f.name, fields.get(f.name),
                                     _parse_params(getattr(args, f.name, []), _flag(f)))
        elif hasattr(args, f.name):
            fields[f.name] = getattr(args, f.name)
    flagged = set(_parse_params(getattr(args, "sigma_mode_params", [])))
    for old, new in LEGACY_SIGMA_PARAMS.items():
        if hasattr(args, old):
            fields[old] = getattr(args, old)
            fields["sigma_mode_params"].pop(new, None)
        elif new in flagged:
            fields.pop(old, None)
    return fields


def _merged(name: str, base, flags: dict) -> dict:
    """The recipe's mapping ``base`` (None: empty) with the flags' keys over it."""
    if base is not None and not isinstance(base, Mapping):
        raise SmoothcertError(f"{name} must be a mapping, got {type(base).__name__}")
    return {**(base or {}), **flags}


def _parse_params(items, flag: str = "--param") -> dict:
    import yaml

    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SmoothcertError(f"{flag} takes KEY=VALUE, got {item!r}")
        params[key] = _number_or_yaml(yaml.safe_load(value))
    return params


def _number_or_yaml(value):
    """YAML 1.1 reads ``1e-4`` as a string; take any text that Python reads as a float as one."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


# --------------------------------------------------------------------------- certify / predict
def _run_args(p, *, with_n0: bool):
    p.add_argument("checkpoint", help="a smoothcert checkpoint (checkpoint.pt)")
    if with_n0:
        from ..certifiers import CERTIFIERS, LEGACY_NAMES

        p.add_argument("--certifier", default="certify",
                       choices=sorted(CERTIFIERS) + sorted(LEGACY_NAMES),
                       help="the certification algorithm (default: Cohen et al.'s CERTIFY); "
                            "uniform and data-dependent-uniform are the former names of "
                            "certify and data-dependent with --noise uniform")
        p.epilog = _certifiers_epilog()
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the certifier (repeatable)")
    _noise_args(p)
    if with_n0:
        p.add_argument("--n0", type=_DRAWS, default=100,
                       help="selection draws, at most 2**53 (default 100)")
        p.add_argument("--radii", help="grid of radii of --certifier sequential, e.g. "
                                       "0,0.25,0.5 (default: 0.25 steps up to the largest "
                                       "radius --n draws can certify); --n is its n_max")
    _monte_carlo_args(p)
    _dataset_run_args(p)


def _certifiers_epilog() -> str:
    """Every certifier (its options, set with --opt, in brackets with their defaults) and noise."""
    from ..certifiers import CERTIFIERS
    from ..noise.base import NOISES
    from ..training.config import described, keyword_choices

    lines = ["names (a certifier's options, set with --opt, in brackets with their defaults):",
             "", "--certifier NAME"]
    lines += [f"{name}\t{text}" for name, text in keyword_choices(CERTIFIERS).items()]
    lines += ["", "--noise NAME"] + [f"{name}\t{text}" for name, text in described(NOISES).items()]
    return "\n".join(lines)


def _noise_args(p) -> None:
    from ..noise.base import NOISES

    p.add_argument("--noise", choices=sorted(NOISES),
                   help="smoothing noise; σ is its per-coordinate standard deviation (default: "
                        "the checkpoint's)")
    p.add_argument("--sigma", type=float, help="noise level (default: the checkpoint's)")


def _monte_carlo_args(p, n_help: str = "draws, at most 2**53 (default 100000)") -> None:
    p.add_argument("--n", type=_DRAWS, default=100_000, help=n_help)
    p.add_argument("--alpha", type=float, default=0.001, help="failure probability")
    p.add_argument("--batch", type=_BATCH, default=1000,
                   help="noisy inputs per forward pass, at most 2**31-1; lower it when the "
                        "device runs out of memory")


def _example_args(p, split: str, split_help: str, seed_help: str) -> None:
    """Which examples of which dataset, and the seed of their noise."""
    p.add_argument("--dataset", help="dataset (default: the checkpoint's)")
    p.add_argument("--split", default=split, choices=("train", "test"), help=split_help)
    p.add_argument("--skip", type=_INDEX, default=1, help="take every skip-th example")
    p.add_argument("--max", type=_INDEX, dest="max_count",
                   help="at most this many examples (at most 2**63-1)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)


def _dataset_run_args(p) -> None:
    """Which examples, the seed, the record file and the shard: every runner command's flags."""
    _example_args(p, "test", "the split whose examples are run",
                  "run seed; example idx uses (seed, idx)")
    p.add_argument("--out", required=True, help="record file (TSV); a manifest goes beside it")
    p.add_argument("--num-shards", type=int, help="default: WORLD_SIZE or SLURM array size")
    p.add_argument("--shard-index", type=int, help="default: RANK or SLURM array task id")
    _image_size_arg(p, "image folders: side S of the square inputs (default: the "
                       "checkpoint's input size)")
    _workers_arg(p)
    _engine_args(p)
    _add_common(p)


def _engine_args(p) -> None:
    """The engine's optional accelerations; each changes the computed function, so each is
    recorded in the run's identity."""
    from ..smoothing.engine import PRECISIONS

    p.add_argument("--precision", default="fp32", choices=tuple(PRECISIONS),
                   help="run the model under bf16/fp16 autocast (noise stays float32; the "
                        "certificate is then for the reduced-precision classifier)")
    p.add_argument("--channels-last", action="store_true",
                   help="channels-last memory format for the model and its inputs")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")


def _certifier_options(args) -> dict:
    options = _parse_params(args.opt, "--opt")
    if getattr(args, "radii", None) is not None:
        options["radii"] = args.radii
    return options


def _run_task(task: str, args, options: dict | None = None) -> None:
    """Load the checkpoint's dataset split and hand everything to ``certify_dataset``."""
    from ..models.checkpoint import load_checkpoint
    from ..runs import certify_dataset
    from ..runs.records import shard_path
    from ..training.distributed import rank_device

    meta = load_checkpoint(args.checkpoint).meta
    device = rank_device(resolve_device(args.device))  # one GPU per torchrun rank
    dataset, shard = _run_dataset(args, meta), _shard(args)
    certify_dataset(
        args.checkpoint,
        dataset,
        sigma=args.sigma,
        noise=args.noise,
        n0=getattr(args, "n0", 100),  # predict and attack have no selection draws
        n=args.n,
        alpha=args.alpha,
        batch=args.batch,
        seed=args.seed,
        skip=args.skip,
        max_count=args.max_count,
        certifier=getattr(args, "certifier", task),
        options=options if options is not None else _certifier_options(args),
        out=args.out,
        shard=shard,
        device=device,
        workers=args.workers,
        engine={"precision": args.precision, "channels_last": args.channels_last,
                "compile": args.compile},
        progress=_progress(args) and _is_main_rank(),
    )
    print(f"records: {shard_path(args.out, *shard)}")


def _run_dataset(args, meta: dict):
    """The split to run on; an image folder at the checkpoint's input size unless
    ``--image-size`` says otherwise."""
    from ..data.datasets import dataset_spec, load_dataset

    name = args.dataset or meta["dataset"]
    image_size = args.image_size
    if image_size is None and dataset_spec(name).streamed:
        image_size = int(meta["input_shape"][-1])
    return load_dataset(name, args.split, data_root=args.data_root, image_size=image_size)


def _is_main_rank() -> bool:
    """Rank 0 under torchrun (one progress bar for K processes), or a process alone."""
    return os.environ.get("RANK", "0") == "0"


@command(
    "certify",
    "CERTIFY every example of a split (Cohen et al.): records with radii",
    partial(_run_args, with_n0=True),
)
def cmd_certify(args):
    _run_task("certify", args)


@command(
    "predict",
    "PREDICT every example of a split (Cohen et al.): records, abstentions",
    partial(_run_args, with_n0=False),
)
def cmd_predict(args):
    _run_task("predict", args)


# --------------------------------------------------------------------------- attack
def _attack_args(p):
    from ..runs.attack import AttackSettings
    from ..smoothing.attacks import ATTACKS

    d = AttackSettings()
    p.add_argument("checkpoint", help="a smoothcert checkpoint (checkpoint.pt)")
    p.add_argument("--attack", default=d.attack, choices=sorted(ATTACKS),
                   help="PGD-L2 or DDN on the soft smoothed classifier (default: pgd)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--epsilon", type=float, help="L2 budget of the attack (pixel units)")
    budget.add_argument("--min-distance", action="store_true",
                        help="raise ε by --epsilon-step up to --max-epsilon until PREDICT flips")
    p.add_argument("--max-epsilon", type=float, default=d.max_epsilon,
                   help=f"cap of --min-distance (default {d.max_epsilon})")
    p.add_argument("--epsilon-step", type=float, default=d.epsilon_step,
                   help=f"ε grid step of --min-distance (default {d.epsilon_step})")
    p.add_argument("--steps", type=int, default=d.steps,
                   help=f"gradient steps per attack (default {d.steps})")
    p.add_argument("--noise-draws", type=int, default=d.noise_draws,
                   help=f"noises m in the soft objective (default {d.noise_draws})")
    p.add_argument("--fresh-noise", action="store_true",
                   help="redraw the m noises at every step (default: drawn once per input, "
                        "as Salman et al. and Campbell et al.)")
    p.add_argument("--ddn-gamma", type=float, default=d.ddn_gamma,
                   help=f"DDN's norm change per step (default {d.ddn_gamma})")
    p.add_argument("--ddn-init-norm", type=float, default=d.ddn_init_norm,
                   help=f"DDN's first norm (default {d.ddn_init_norm})")
    _noise_args(p)
    _monte_carlo_args(p, "PREDICT's draws at the clean and attacked inputs, at most 2**53 "
                         "(default 100000)")
    _dataset_run_args(p)


@command(
    "attack",
    "attack the smoothed classifier (PGD/DDN), judge with PREDICT: records with distances",
    _attack_args,
)
def cmd_attack(args):
    import dataclasses

    from ..runs.attack import AttackSettings

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(AttackSettings)}
    if given["epsilon"] is None:  # --min-distance: the budget grid, not ε
        given["epsilon"] = AttackSettings.epsilon
    settings = AttackSettings(**given)  # validated here, before any file is written
    _run_task("attack", args, options=dataclasses.asdict(settings))


# --------------------------------------------------------------------------- analyze
ANALYSES: Registry = Registry("analysis")
"""``analyze`` analysis name -> :class:`Command`."""


def _analyze_args(p):
    sub = p.add_subparsers(dest="analysis", metavar="ANALYSIS", parser_class=_Parser)
    sub.required = True
    for name, analysis in ANALYSES.items():
        analysis.add_arguments(sub.add_parser(name, help=analysis.help, description=analysis.help))


def _grad_norms_args(p):
    from ..evaluation.report import FORMATS

    p.add_argument("checkpoint", help="a smoothcert checkpoint (checkpoint.pt)")
    p.add_argument("--method", help="training method whose loss is measured (default: the "
                                    "checkpoint's, with its hyperparameters)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="method hyperparameter (repeatable)")
    p.add_argument("--sigma", type=float, help="noise level (default: the checkpoint's)")
    p.add_argument("--n", type=_DRAWS, default=100,
                   help="noisy draws per example for p̂_A, at most 2**53 (default 100, Sun "
                        "et al.'s)")
    p.add_argument("--batch", type=_BATCH, default=1000,
                   help="noisy inputs per forward pass, at most 2**31-1")
    _example_args(p, "train", "examples to measure (default: train, the data the loss weighs)",
                  "example idx draws from (seed, idx)")
    p.add_argument("--out", metavar="FILE.tsv",
                   help="also write the per-example rows (idx label p_hat grad_norm) and a "
                        "manifest FILE.tsv.manifest.json; a rerun with the same settings reads "
                        "FILE.tsv instead of computing it, other settings are refused")
    p.add_argument("--format", default="md", choices=sorted(FORMATS), help="table format")
    _add_common(p)


ANALYSES.register("grad-norms")(Command(
    "mean ‖∇θ loss‖ of easy (p̂_A > ½) vs hard (p̂_A < ½) examples (Sun et al. 2024, Table 1)",
    _grad_norms_args,
    lambda args: _grad_norms(args),
))


def _easy_hard_args(p):
    from ..evaluation.report import FORMATS

    p.add_argument("files", nargs="+", metavar="FILE.tsv",
                   help="grad-norm files (analyze grad-norms --out), one row each")
    p.add_argument("--acr", nargs="+", metavar="CERTIFY.tsv",
                   help="add an ACR column: one certify record file per grad-norm file, in the "
                        "same order")
    p.add_argument("--format", default="md", choices=sorted(FORMATS), help="table format")


ANALYSES.register("easy-hard")(Command(
    "Sun et al. 2024's Table 1 from grad-norm files: one row per file, easy and hard counts "
    "and mean ‖∇θ loss‖, easy/hard, with --acr the ACR",
    _easy_hard_args,
    lambda args: _easy_hard(args),
))


@command("analyze", "analyses of a checkpoint or of grad-norm files: grad-norms, easy-hard",
         _analyze_args)
def cmd_analyze(args):
    ANALYSES[args.analysis].run(args)


def _grad_norms(args) -> None:
    from ..evaluation.analysis import (
        checkpoint_grad_norms,
        easy_hard,
        easy_hard_table,
        grad_norm_file,
    )
    from ..evaluation.report import get_format

    formatter = get_format(args.format)
    compute = (checkpoint_grad_norms if args.out is None
               else partial(grad_norm_file, args.out))  # reads FILE.tsv when it is done
    result = compute(
        args.checkpoint, args.method, _parse_params(args.param), sigma=args.sigma, n=args.n,
        batch_size=args.batch, dataset=args.dataset, split=args.split, skip=args.skip,
        max_count=args.max_count, seed=args.seed, device=resolve_device(args.device),
        data_root=args.data_root, progress=_progress(args))
    print(formatter(easy_hard_table(easy_hard(result))), end="")


def _easy_hard(args) -> None:
    from ..evaluation.analysis import easy_hard_comparison
    from ..evaluation.report import get_format

    formatter = get_format(args.format)
    print(formatter(easy_hard_comparison(args.files, args.acr)), end="")


# --------------------------------------------------------------------------- report / merge
REPORT_RADII = "0:1:0.25"  # report's radii (attack files: distances) when --radii is not given


def _report_args(p):
    from ..evaluation.report import FORMATS

    p.add_argument("files", nargs="+",
                   help="record files (smoothcert's or Cohen et al.'s; CERTIFY, PREDICT or "
                        "attack records); run folders with --train")
    p.add_argument("--radii", help="start:stop:step or a comma list; attack files: distances "
                                   f"(default: {REPORT_RADII})")
    p.add_argument("--format", default="md", choices=sorted(FORMATS), help="table format")
    p.add_argument("--plot", help="write certified accuracy vs radius (attack files: the "
                                  "attack curves) to this image file")
    p.add_argument("--envelope", action="store_true",
                   help="add the σ-envelope of the files (best certified accuracy per radius) "
                        "to the table and the plot")
    p.add_argument("--ecdf", metavar="IMAGE",
                   help="write the empirical CDF of p̂_A per file (Sun et al. 2024, Fig. 3)")
    p.add_argument("--sigma-hist", metavar="IMAGE",
                   help="write the histogram of each file's per-example σ (its sigma column: "
                        "σ_x for data-dependent files)")
    p.add_argument("--common", action="store_true",
                   help="compare the files on the examples (idx) they all hold, e.g. a file of "
                        "the first 200 images against one of 500 (with --agreement: each pair "
                        "on the examples both hold)")
    p.add_argument("--train", action="store_true",
                   help="compare training runs: method, #HP, s/epoch, peak memory, ACR")
    p.add_argument("--agreement", action="store_true",
                   help="compare the files in pairs (1st with 2nd, ...), example by example: "
                        "per radius, a/b = examples only the first / only the second certifies")
    p.add_argument("--into", metavar="DOC",
                   help="also write the table into DOC, between the lines "
                        "<!-- report:BLOCK --> and <!-- /report:BLOCK --> (needs --block)")
    p.add_argument("--block", help="the block of --into DOC that receives the table")
    p.epilog = REPORT_COLUMNS


# Every column of report's tables (README.md, "Reading the tables", says the same).
REPORT_COLUMNS = """\
columns (md and latex show fractions in %, csv and json as fractions in [0, 1]; every fraction \
is over all n examples of the file, abstentions included):

CERTIFY and PREDICT files, one row per file
name\tthe file (its name, made distinct where two files share one)
n\texamples in the file
clean acc\taccuracy of the smoothed classifier: correct predictions / n, abstentions count as \
wrong; for CERTIFY files this is the certified accuracy at r = 0
abstain\tabstentions (predict = -1) / n
ACR\taverage certified radius: the mean over all n of radius if correct, else 0 (Zhai et al. 2020)
r=R\tcertified accuracy at radius R: examples predicted correctly with radius >= R, / n \
(empty for PREDICT files)
adjusted\tdata-dependent files: certificates the memory-based certifier changed
σ_x min, σ_x mean, σ_x max\tthe smallest, mean and largest σ of the file's rows, shown when some \
file's σ varies (data-dependent σ_x); a fixed-σ file shows its σ, a file without σ none
envelope\tthe row of --envelope: the best file at each radius (the σ-envelope); clean acc is \
the best file's, n, abstain and ACR are empty

attack files, one row per file
attack\tthe attack (pgd or ddn)
clean acc\tPREDICT correct at the clean input / n; only these examples are attacked
attacked\tfraction of the attacked examples whose smoothed prediction was flipped
median dist\tmedian distance to a flip over the attacked examples, a failed attack counting as \
infinite
mean dist\tmean distance over the flipped examples
d<=D\tfraction of the attacked examples flipped within distance D

--train: one row per run folder
method\tthe training method
#HP\tits number of hyperparameters
epochs\tcompleted epochs (log.tsv)
s/epoch\tmean seconds per epoch
peak MB\tlargest peak memory of an epoch, in MB
ACR\tof the first CERTIFY record file in the folder

--agreement: one row per pair of files
first, second\tthe two files
agree\tfraction of (example, radius) pairs that both files certify or both do not
ΔACR, ± SE\tACR(second) − ACR(first) and its paired standard error over the examples
r=R\ta/b: examples only the first file / only the second certifies at R"""


@command(
    "report", "certified accuracy at radii, ACR and abstention, one row per file", _report_args
)
def cmd_report(args):
    from ..evaluation.metrics import parse_radii
    from ..evaluation.report import (
        agreement_report,
        check_block,
        report,
        splice_block,
        train_report,
    )

    if (args.into is None) != (args.block is None):
        raise SmoothcertError("--into DOC and --block NAME go together")
    _check_report_mode(args)
    if args.into is not None:
        _check_into(args.into, args.files, args.train)
        check_block(args.into, args.block)
    radii = args.radii if args.radii is not None else REPORT_RADII
    if args.train:
        table = train_report(args.files, fmt=args.format)
    elif args.agreement:
        table = agreement_report(args.files, radii, fmt=args.format, common=args.common)
    else:
        table = report(args.files, parse_radii(radii), fmt=args.format, plot=args.plot,
                       envelope=args.envelope, ecdf=args.ecdf, sigma_hist=args.sigma_hist,
                       common=args.common)
    if args.into is not None:
        splice_block(args.into, args.block, table)
    print(table, end="")


def _check_report_mode(args) -> None:
    """Refuse a flag that the chosen table would silently ignore."""
    if args.train and args.agreement:
        raise SmoothcertError("--train and --agreement are different tables; pick one")
    mode = "--train" if args.train else "--agreement" if args.agreement else None
    if mode is None:
        return
    given = {"--plot": args.plot is not None, "--envelope": args.envelope,
             "--ecdf": args.ecdf is not None, "--sigma-hist": args.sigma_hist is not None,
             "--common": args.train and args.common,
             "--radii": args.train and args.radii is not None}
    ignored = [flag for flag, is_given in given.items() if is_given]
    if ignored:
        raise SmoothcertError(f"{' and '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} "
                              f"not apply to {mode}; drop {'it' if len(ignored) == 1 else 'them'}"
                              " or run report without " + mode)


def _check_into(doc, files, train: bool) -> None:
    """``--into DOC`` must not be a file the report reads: a record file or its manifest, or
    (``--train``) a run folder's files."""
    from ..io import check_not_input
    from ..runs.records import manifest_path

    if train:
        from pathlib import Path

        read = [f for folder in files for f in Path(folder).glob("*") if f.is_file()]
    else:
        read = [*files, *map(manifest_path, files)]
    check_not_input(doc, read, "--into")


def _merge_args(p):
    p.add_argument("files", nargs="+", help="the shard record files of one run")
    p.add_argument("--out", required=True, help="merged record file")


@command("merge", "validate shard record files and write their union", _merge_args)
def cmd_merge(args):
    from ..io import check_not_input
    from ..runs.records import manifest_path, merge_records

    inputs = [*args.files, *map(manifest_path, args.files)]
    for out in (args.out, manifest_path(args.out)):  # the file and the manifest it writes
        check_not_input(out, inputs)
    print(f"merged: {merge_records(args.files, args.out)}")


# --------------------------------------------------------------------------- import-checkpoint
def _import_args(p):
    from ..models.importers import FORMATS, NORMALIZATIONS

    p.add_argument("file", help="a reference implementation's checkpoint (.pth.tar, .pth)")
    p.add_argument("--format", required=True, choices=sorted(FORMATS),
                   help="whose layout: " + ", ".join(
                       f"{name} ({fmt.source.split()[0]})"
                       for name, fmt in sorted(FORMATS.items())))
    p.add_argument("--arch", required=True,
                   help="our architecture, e.g. cifar_resnet110, or resnet50 for ImageNet")
    p.add_argument("--dataset", required=True, help="the dataset the model was trained on")
    p.add_argument("--sigma", type=float, required=True,
                   help="training noise level σ in pixel units (the files do not store it)")
    p.add_argument("--normalization", default="reference", choices=NORMALIZATIONS,
                   help="the input normalization the file was trained with (default: the "
                        "reference code's for the dataset; salman: center, i.e. x − mean)")
    p.add_argument("--out", required=True, help="smoothcert checkpoint to write")
    p.add_argument("--force", action="store_true", help="replace an existing --out")


@command(
    "import-checkpoint",
    "convert a reference implementation's released checkpoint into a smoothcert checkpoint",
    _import_args,
)
def cmd_import_checkpoint(args):
    from ..models.importers import import_checkpoint

    path = import_checkpoint(args.file, args.format, arch=args.arch, dataset=args.dataset,
                             sigma=args.sigma, out=args.out, normalization=args.normalization,
                             overwrite=args.force)
    if os.environ.get("RANK", "0") == "0":  # once under torchrun
        print(f"checkpoint: {path}")


# --------------------------------------------------------------------------- demo
def _demo_args(p):
    p.add_argument("--out", default="runs/demo", help="folder for the demo's files")
    _add_common(p)


@command(
    "demo", "train a digits CNN with Gaussian noise, certify its test split, report", _demo_args
)
def cmd_demo(args):
    from .demo import run_demo

    run_demo(args.out, device=resolve_device(args.device), progress=_progress(args))

