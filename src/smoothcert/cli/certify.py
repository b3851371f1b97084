"""``smoothcert certify`` and ``smoothcert predict``: Cohen et al.'s CERTIFY (or another
certifier) and PREDICT over a dataset split, into a record file."""

from __future__ import annotations

from functools import partial

from .catalog import names
from .common import DRAWS, command, parse_params
from .dataset_run import (
    dataset_run_args,
    model_args,
    monte_carlo_args,
    noise_args,
    run_certifier,
)


def _run_args(p, *, with_n0: bool):
    model_args(p)
    if with_n0:
        from ..upgrade import OLD_CERTIFIER_NAMES

        p.add_argument("--certifier", default="certify",
                       choices=sorted(names("certifiers")) + sorted(OLD_CERTIFIER_NAMES),
                       help="the certification algorithm (default: Cohen et al.'s CERTIFY); "
                            "uniform and data-dependent-uniform are deprecated spellings of "
                            "certify and data-dependent with --noise uniform")
        p.epilog = _certifiers_epilog()
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the certifier (repeatable)")
    if with_n0:
        p.add_argument("--model", action="append", default=[], metavar="ROLE=CKPT",
                       help="another model the certifier composes with the checkpoint, by role "
                            "(repeatable), e.g. --certifier aces --model selection=SEL.pt "
                            "--model core=CORE.pt")
    noise_args(p)
    if with_n0:
        p.add_argument("--n0", type=DRAWS, default=100,
                       help="selection draws, at most 2**53 (default 100)")
        p.add_argument("--radii", help="grid of radii of --certifier sequential, e.g. "
                                       "0,0.25,0.5 (default: 0.25 steps up to the largest "
                                       "radius --n draws can certify); --n is its n_max")
    monte_carlo_args(p)
    dataset_run_args(p)


def _certifiers_epilog() -> str:
    """Every certifier ``--certifier`` offers (its options, set with --opt, listed under it)
    and noise."""
    lines = ["names (under a certifier its options, set with --opt KEY=VALUE):",
             "", "--certifier NAME"]
    lines += [f"{name}\t{text}" for name, text in names("certifiers").items()]
    lines += ["", "--noise NAME"] + [f"{name}\t{text}" for name, text in names("noises").items()]
    return "\n".join(lines)


def _certifier_options(args) -> dict:
    """The certifier's options: each ``--opt KEY=VALUE``, and certify's ``--radii``."""
    options = parse_params(args.opt, "--opt")
    if getattr(args, "radii", None) is not None:
        options["radii"] = args.radii
    return options


@command(
    "certify",
    "CERTIFY every example of a split (Cohen et al.): records with radii",
    partial(_run_args, with_n0=True),
)
def cmd_certify(args):
    run_certifier("certify", args, _certifier_options(args))


@command(
    "predict",
    "PREDICT every example of a split (Cohen et al.): records, abstentions",
    partial(_run_args, with_n0=False),
)
def cmd_predict(args):
    run_certifier("predict", args, _certifier_options(args))
