"""``smoothcert certify`` and ``smoothcert predict``: Cohen et al.'s CERTIFY (or another
certifier) and PREDICT over a dataset split, into a record file."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import SmoothcertError
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

        p.add_argument("--certifier",
                       choices=sorted(names("certifiers")) + sorted(OLD_CERTIFIER_NAMES),
                       help="the certification algorithm (default: Cohen et al.'s CERTIFY; "
                            "tss with --transform); uniform and data-dependent-uniform are "
                            "deprecated spellings of certify and data-dependent with --noise "
                            "uniform")
        p.add_argument("--transform", type=transform_arg, metavar="NAME[:KEY=VALUE,...]",
                       help="certify against a semantic transformation (Li et al.'s TSS), its "
                            "smoothing parameters after a colon, e.g. brightness:sigma_b=0.2: "
                            "the same as --certifier tss --opt transform=...; no --sigma or "
                            "--noise (listed below under --transform NAME)")
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
    lines += ["", "--transform NAME"] + [f"{name}\t{text}" for name, text in
                                         names("transformations").items()]
    return "\n".join(lines)


def transform_arg(text: str) -> str:
    """--transform: a known transformation's name, with its parameters after a colon (checked
    by the library, which knows what each family takes)."""
    known = sorted(names("transformations"))
    if text.partition(":")[0].strip() not in known:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                         f"{', '.join(known)})")
    return text


def _certifier_choice(args, options: dict) -> tuple[str, dict]:
    """(certifier, its options): ``--transform T`` is ``--certifier tss --opt transform=T``;
    without it, ``--certifier`` (default certify). Either naming of the transformation alone."""
    if args.transform is None:
        return args.certifier or "certify", options
    if args.certifier not in (None, "tss"):
        raise SmoothcertError(f"--transform certifies with --certifier tss, not "
                              f"{args.certifier}; drop --certifier")
    if "transform" in options:
        raise SmoothcertError("--transform and --opt transform=... both name the "
                              "transformation: pass one of them")
    return "tss", {**options, "transform": args.transform}


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
    args.certifier, options = _certifier_choice(args, _certifier_options(args))
    run_certifier("certify", args, options)


@command(
    "predict",
    "PREDICT every example of a split (Cohen et al.): records, abstentions",
    partial(_run_args, with_n0=False),
)
def cmd_predict(args):
    run_certifier("predict", args, _certifier_options(args))
