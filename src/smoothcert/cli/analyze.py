"""``smoothcert analyze ANALYSIS``: analyses of a checkpoint or of analysis files, each an entry
of :data:`ANALYSES` with its own flags."""

from __future__ import annotations

from functools import partial

from ..registry import Registry
from .catalog import names
from .common import (
    BATCH,
    DRAWS,
    Command,
    add_common,
    add_subcommands,
    command,
    example_args,
    parse_params,
    progress_bars,
    resolve_device,
)

ANALYSES: Registry = Registry("analysis")
"""``analyze`` analysis name -> :class:`~smoothcert.cli.common.Command`."""


def _format_arg(p) -> None:
    p.add_argument("--format", default="md", choices=names("formats"), help="table format")


# --------------------------------------------------------------------------- grad-norms
def _grad_norms_args(p):
    p.add_argument("checkpoint", help="a smoothcert checkpoint (checkpoint.pt)")
    p.add_argument("--method", help="training method whose loss is measured (default: the "
                                    "checkpoint's, with its hyperparameters)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="method hyperparameter (repeatable)")
    p.add_argument("--sigma", type=float, help="noise level (default: the checkpoint's)")
    p.add_argument("--n", type=DRAWS, default=100,
                   help="noisy draws per example for p̂_A, at most 2**53 (default 100, Sun "
                        "et al.'s)")
    p.add_argument("--batch", type=BATCH, default=1000,
                   help="noisy inputs per forward pass, at most 2**31-1")
    example_args(p, "train", "examples to measure (default: train, the data the loss weighs)",
                 "example idx draws from (seed, idx)")
    p.add_argument("--out", metavar="FILE.tsv",
                   help="also write the per-example rows (idx label p_hat grad_norm) and a "
                        "manifest FILE.tsv.manifest.json; a rerun with the same settings reads "
                        "FILE.tsv instead of computing it, other settings are refused")
    _format_arg(p)
    add_common(p)


def _grad_norms(args) -> None:
    from ..evaluation.analysis import (
        checkpoint_grad_norms,
        easy_hard,
        easy_hard_table,
        grad_norm_file,
    )
    from ..evaluation.tables import get_format

    formatter = get_format(args.format)
    compute = (checkpoint_grad_norms if args.out is None
               else partial(grad_norm_file, args.out))  # reads FILE.tsv when it is done
    result = compute(
        args.checkpoint, args.method, parse_params(args.param), sigma=args.sigma, n=args.n,
        batch_size=args.batch, dataset=args.dataset, split=args.split, skip=args.skip,
        max_count=args.max_count, seed=args.seed, device=resolve_device(args.device),
        data_root=args.data_root, progress=progress_bars(args))
    print(formatter(easy_hard_table(easy_hard(result))), end="")


ANALYSES.register("grad-norms")(Command(
    "mean ‖∇θ loss‖ of easy (p̂_A > ½) vs hard (p̂_A < ½) examples (Sun et al. 2024, Table 1)",
    _grad_norms_args,
    _grad_norms,
))


# --------------------------------------------------------------------------- easy-hard
def _easy_hard_args(p):
    p.add_argument("files", nargs="+", metavar="FILE.tsv",
                   help="grad-norm files (analyze grad-norms --out), one row each")
    p.add_argument("--acr", nargs="+", metavar="CERTIFY.tsv",
                   help="add an ACR column: one certify record file per grad-norm file, in the "
                        "same order")
    _format_arg(p)


def _easy_hard(args) -> None:
    from ..evaluation.analysis import easy_hard_comparison
    from ..evaluation.tables import get_format

    formatter = get_format(args.format)
    print(formatter(easy_hard_comparison(args.files, args.acr)), end="")


ANALYSES.register("easy-hard")(Command(
    "Sun et al. 2024's Table 1 from grad-norm files: one row per file, easy and hard counts "
    "and mean ‖∇θ loss‖, easy/hard, with --acr the ACR",
    _easy_hard_args,
    _easy_hard,
))


# --------------------------------------------------------------------------- the command
@command("analyze", "analyses of a checkpoint or of grad-norm files: grad-norms, easy-hard",
         partial(add_subcommands, dest="analysis", metavar="ANALYSIS", registry=ANALYSES))
def cmd_analyze(args):
    ANALYSES[args.analysis].run(args)
