"""The ``smoothcert`` command line: subcommands only parse, build and call the library.

Any user error becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial

from .errors import SmoothcertError

COMMANDS: dict[str, tuple[str, Callable, Callable]] = {}


def command(name: str, help: str, add_arguments: Callable):
    """Register subcommand ``name``: ``add_arguments(parser)`` declares it; the decorated runs."""

    def deco(run: Callable) -> Callable:
        COMMANDS[name] = (help, add_arguments, run)
        return run

    return deco


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would also print the usage)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="smoothcert",
                     description="Randomized smoothing: train, certify, attack, report.")
    parser.add_argument("--version", action="version", version=f"smoothcert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a one-line usage error (exit 2)
        return int(e.code or 0)
    try:
        COMMANDS[args.command][2](args)
    except SmoothcertError as e:
        print(f"smoothcert {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"smoothcert {args.command}: error: {e.strerror or e}: {e.filename or ''}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("smoothcert: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


# --------------------------------------------------------------------------- shared arguments
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


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the model runs and noise is drawn (default: auto)",
    )
    p.add_argument("--data-root", default=None, help="folder holding the datasets' files")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def shard_from_env(env=os.environ) -> tuple[int, int]:
    """(shard index, number of shards) from torchrun's RANK/WORLD_SIZE or a SLURM array."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        first = int(env.get("SLURM_ARRAY_TASK_MIN", 0))
        return int(env["SLURM_ARRAY_TASK_ID"]) - first, int(env["SLURM_ARRAY_TASK_COUNT"])
    return 0, 1


def _shard(args) -> tuple[int, int]:
    index, count = shard_from_env()
    count = args.num_shards if args.num_shards is not None else count
    index = args.shard_index if args.shard_index is not None else index
    if count < 1 or not 0 <= index < count:
        raise SmoothcertError(f"--shard-index must lie in 0..{count - 1}, got {index}")
    return index, count


# --------------------------------------------------------------------------- train
def _train_args(p):
    p.add_argument("--config", help="YAML file of TrainConfig fields; flags override it")
    p.add_argument("--dataset"), p.add_argument("--arch"), p.add_argument("--method")
    p.add_argument("--sigma", type=float)
    p.add_argument("--epochs", type=int), p.add_argument("--batch", type=int, dest="batch_size")
    p.add_argument("--lr", type=float), p.add_argument("--momentum", type=float)
    p.add_argument("--nesterov", action="store_true", default=None)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--lr-schedule", choices=("step", "multistep", "constant"))
    p.add_argument("--lr-step-size", type=int), p.add_argument("--lr-gamma", type=float)
    p.add_argument("--lr-milestones", type=lambda s: tuple(int(v) for v in s.split(",")))
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--init-from",
        dest="init_checkpoint",
        metavar="PATH",
        help="start from the weights of this checkpoint (same arch and dataset), e.g. to "
        "fine-tune with --method heat",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="method hyperparameter, e.g. --param num_noise=4 (repeatable)",
    )
    p.add_argument("--sigma-mode", choices=("fixed", "data_dependent"),
                   help="data_dependent: each example keeps its own σ, updated by OptimizeSigma "
                        "(Alfarra et al., Alg. 2)")
    p.add_argument("--dd-steps", type=int, help="OptimizeSigma steps per example and epoch")
    p.add_argument("--dd-step-size", type=float, help="OptimizeSigma step size")
    p.add_argument("--dd-num-samples", type=int, help="noise draws per OptimizeSigma step")
    p.add_argument("--dd-start-epoch", type=int, help="first epoch that optimizes σ")
    p.add_argument("--train-size", type=int, metavar="N",
                   help="train on a fixed class-balanced subset of N training examples")
    p.add_argument("--arch-param", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument of a torchvision:/timm: model's constructor, e.g. "
                        "--arch-param dropout=0.1 (repeatable; stored in the checkpoint)")
    _image_size_arg(p, "side S of the square inputs of an image folder: Resize(S·8/7) + "
                       "CenterCrop(S) for evaluation, RandomResizedCrop(S) + flip for training "
                       "(default 224)")
    p.add_argument("--out", required=True, help="run folder: checkpoint.pt, log.tsv, config.yaml")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic cuDNN kernels: on a GPU, a resumed run then ends with the "
                        "same weights as an uninterrupted one (slower)")
    _workers_arg(p)
    _add_common(p)


_TRAIN_FIELDS = (
    "dataset",
    "arch",
    "method",
    "sigma",
    "epochs",
    "batch_size",
    "lr",
    "momentum",
    "nesterov",
    "weight_decay",
    "lr_schedule",
    "lr_step_size",
    "lr_gamma",
    "lr_milestones",
    "seed",
    "init_checkpoint",
    "sigma_mode",
    "dd_steps",
    "dd_step_size",
    "dd_num_samples",
    "dd_start_epoch",
    "train_size",
    "image_size",
)


@command("train", "train a base classifier with a smoothing-aware method", _train_args)
def cmd_train(args):
    from .recipes import load_recipe
    from .training import TrainConfig, train

    fields = load_recipe(args.config) if args.config else {}
    fields.update({k: getattr(args, k) for k in _TRAIN_FIELDS if getattr(args, k) is not None})
    params = dict(fields.pop("method_params", None) or {}, **_parse_params(args.param))
    arch_kwargs = dict(fields.pop("arch_kwargs", None) or {},
                       **_parse_params(args.arch_param, "--arch-param"))
    fields["data_root"] = args.data_root or fields.get("data_root")
    config = TrainConfig.from_dict({**fields, "method_params": params, "arch_kwargs": arch_kwargs})
    if args.deterministic:
        import torch

        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    path = train(
        config,
        args.out,
        device=resolve_device(args.device),
        resume=args.resume,
        progress=not args.no_progress,
        workers=args.workers,
    )
    if os.environ.get("RANK", "0") == "0":  # once under torchrun
        print(f"checkpoint: {path}")


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
NOT_CERTIFIERS = ("attack",)  # runner tasks with a command of their own


def _run_args(p, *, with_n0: bool):
    p.add_argument("checkpoint", help="a smoothcert checkpoint (checkpoint.pt)")
    if with_n0:
        from .certifiers import TASKS

        p.add_argument("--certifier", default="certify",
                       choices=sorted(set(TASKS) - set(NOT_CERTIFIERS)),
                       help="the certification algorithm (default: Cohen et al.'s CERTIFY)")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the certifier (repeatable)")
    p.add_argument("--sigma", type=float, help="noise level (default: the checkpoint's)")
    if with_n0:
        p.add_argument("--n0", type=int, default=100, help="selection draws (default 100)")
        p.add_argument("--radii", help="grid of radii of --certifier sequential, e.g. "
                                       "0,0.25,0.5 (default: 0.25 steps up to the largest "
                                       "radius --n draws can certify); --n is its n_max")
    _monte_carlo_args(p)
    _dataset_run_args(p)


def _monte_carlo_args(p, n_help: str = "draws (default 100000)") -> None:
    p.add_argument("--n", type=int, default=100_000, help=n_help)
    p.add_argument("--alpha", type=float, default=0.001, help="failure probability")
    p.add_argument("--batch", type=int, default=1000, help="noisy inputs per forward pass")


def _dataset_run_args(p) -> None:
    """Which examples, the seed, the record file and the shard: every runner command's flags."""
    p.add_argument("--dataset", help="dataset (default: the checkpoint's)")
    p.add_argument("--split", default="test", choices=("train", "test"))
    p.add_argument("--skip", type=int, default=1, help="take every skip-th example")
    p.add_argument("--max", type=int, dest="max_count", help="at most this many examples")
    p.add_argument("--seed", type=int, default=0, help="run seed; example idx uses (seed, idx)")
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
    from .sampling import PRECISIONS

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
    from .certifiers import certify_dataset
    from .distributed import rank_device
    from .models.checkpoint import load_checkpoint
    from .runs.records import shard_path

    meta = load_checkpoint(args.checkpoint).meta
    device = rank_device(resolve_device(args.device))  # one GPU per torchrun rank
    dataset, shard = _run_dataset(args, meta), _shard(args)
    certify_dataset(
        args.checkpoint,
        dataset,
        sigma=args.sigma,
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
        progress=not args.no_progress and _is_main_rank(),
    )
    print(f"records: {shard_path(args.out, *shard)}")


def _run_dataset(args, meta: dict):
    """The split to run on; an image folder at the checkpoint's input size unless
    ``--image-size`` says otherwise."""
    from .data import dataset_spec, load_dataset

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
    from .attacks import ATTACKS
    from .runs.attack import AttackSettings

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
    p.add_argument("--sigma", type=float, help="noise level (default: the checkpoint's)")
    _monte_carlo_args(p, "PREDICT's draws at the clean and attacked inputs (default 100000)")
    _dataset_run_args(p)


@command(
    "attack",
    "attack the smoothed classifier (PGD/DDN), judge with PREDICT: records with distances",
    _attack_args,
)
def cmd_attack(args):
    import dataclasses

    from .runs.attack import AttackSettings

    settings = AttackSettings(
        attack=args.attack,
        epsilon=args.epsilon if args.epsilon is not None else AttackSettings.epsilon,
        min_distance=args.min_distance,
        max_epsilon=args.max_epsilon,
        epsilon_step=args.epsilon_step,
        steps=args.steps,
        noise_draws=args.noise_draws,
        fresh_noise=args.fresh_noise,
        ddn_gamma=args.ddn_gamma,
        ddn_init_norm=args.ddn_init_norm,
    )  # validated here, before any file is written
    _run_task("attack", args, options=dataclasses.asdict(settings))


# --------------------------------------------------------------------------- analyze
ANALYSES: dict[str, tuple[str, Callable, Callable]] = {}


def _analyze_args(p):
    sub = p.add_subparsers(dest="analysis", metavar="ANALYSIS", parser_class=_Parser)
    sub.required = True
    for name, (help_text, add_arguments, _) in ANALYSES.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))


def _grad_norms_args(p):
    from .report import FORMATS

    p.add_argument("checkpoint", help="a smoothcert checkpoint (checkpoint.pt)")
    p.add_argument("--method", help="training method whose loss is measured (default: the "
                                    "checkpoint's, with its hyperparameters)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="method hyperparameter (repeatable)")
    p.add_argument("--sigma", type=float, help="noise level (default: the checkpoint's)")
    p.add_argument("--n", type=int, default=100,
                   help="noisy draws per example for p̂_A (default 100, Sun et al.'s)")
    p.add_argument("--batch", type=int, default=1000, help="noisy inputs per forward pass")
    p.add_argument("--dataset", help="dataset (default: the checkpoint's)")
    p.add_argument("--split", default="train", choices=("train", "test"),
                   help="examples to measure (default: train, the data the loss weighs)")
    p.add_argument("--skip", type=int, default=1, help="take every skip-th example")
    p.add_argument("--max", type=int, dest="max_count", help="at most this many examples")
    p.add_argument("--seed", type=int, default=0, help="example idx draws from (seed, idx)")
    p.add_argument("--format", default="md", choices=sorted(FORMATS), help="table format")
    _add_common(p)


ANALYSES["grad-norms"] = (
    "mean ‖∇θ loss‖ of easy (p̂_A > ½) vs hard (p̂_A < ½) examples (Sun et al. 2024, Table 1)",
    _grad_norms_args,
    lambda args: _grad_norms(args),
)


@command("analyze", "analyses of a checkpoint: grad-norms", _analyze_args)
def cmd_analyze(args):
    ANALYSES[args.analysis][2](args)


def _grad_norms(args) -> None:
    from .analysis import checkpoint_grad_norms, easy_hard, easy_hard_table
    from .report import get_format

    formatter = get_format(args.format)
    result = checkpoint_grad_norms(
        args.checkpoint,
        args.method,
        _parse_params(args.param),
        sigma=args.sigma,
        n=args.n,
        batch_size=args.batch,
        dataset=args.dataset,
        split=args.split,
        skip=args.skip,
        max_count=args.max_count,
        seed=args.seed,
        device=resolve_device(args.device),
        data_root=args.data_root,
        progress=not args.no_progress,
    )
    print(formatter(easy_hard_table(easy_hard(result))), end="")


# --------------------------------------------------------------------------- report / merge
def _report_args(p):
    from .report import FORMATS

    p.add_argument("files", nargs="+",
                   help="record files (smoothcert's or Cohen et al.'s; CERTIFY, PREDICT or "
                        "attack records); run folders with --train")
    p.add_argument("--radii", default="0:1:0.25",
                   help="start:stop:step or a comma list (attack files: distances)")
    p.add_argument("--format", default="md", choices=sorted(FORMATS), help="table format")
    p.add_argument("--plot", help="write certified accuracy vs radius (attack files: the "
                                  "attack curves) to this image file")
    p.add_argument("--envelope", action="store_true",
                   help="add the σ-envelope of the files (best certified accuracy per radius) "
                        "to the table and the plot")
    p.add_argument("--ecdf", metavar="IMAGE",
                   help="write the empirical CDF of p̂_A per file (Sun et al. 2024, Fig. 3)")
    p.add_argument("--train", action="store_true",
                   help="compare training runs: method, #HP, s/epoch, peak memory, ACR")
    p.add_argument("--agreement", action="store_true",
                   help="compare the files in pairs (1st with 2nd, ...), example by example: "
                        "per radius, a/b = examples only the first / only the second certifies")
    p.add_argument("--into", metavar="DOC",
                   help="also write the table into DOC, between the lines "
                        "<!-- report:BLOCK --> and <!-- /report:BLOCK --> (needs --block)")
    p.add_argument("--block", help="the block of --into DOC that receives the table")


@command(
    "report", "certified accuracy at radii, ACR and abstention, one row per file", _report_args
)
def cmd_report(args):
    from .metrics import parse_radii
    from .report import agreement_report, check_block, report, splice_block, train_report

    if (args.into is None) != (args.block is None):
        raise SmoothcertError("--into DOC and --block NAME go together")
    if args.into is not None:
        check_block(args.into, args.block)
    if args.train and args.agreement:
        raise SmoothcertError("--train and --agreement are different tables; pick one")
    if args.train:
        table = train_report(args.files, fmt=args.format)
    elif args.agreement:
        table = agreement_report(args.files, args.radii, fmt=args.format)
    else:
        table = report(args.files, parse_radii(args.radii), fmt=args.format, plot=args.plot,
                       envelope=args.envelope, ecdf=args.ecdf)
    if args.into is not None:
        splice_block(args.into, args.block, table)
    print(table, end="")


def _merge_args(p):
    p.add_argument("files", nargs="+", help="the shard record files of one run")
    p.add_argument("--out", required=True, help="merged record file")


@command("merge", "validate shard record files and write their union", _merge_args)
def cmd_merge(args):
    from .runs.records import merge_records

    print(f"merged: {merge_records(args.files, args.out)}")


# --------------------------------------------------------------------------- import-checkpoint
def _import_args(p):
    from .models.importers import FORMATS, NORMALIZATIONS

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
    from .models.importers import import_checkpoint

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

    run_demo(args.out, device=resolve_device(args.device), progress=not args.no_progress)


if __name__ == "__main__":
    sys.exit(main())
