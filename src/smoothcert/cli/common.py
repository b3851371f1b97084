"""What the commands share: the command registry, the parser and its help layout, and the flags
and argparse types that several commands take.

This module imports no command module; each command module imports it and registers itself.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import MAX_BATCH, MAX_DRAWS, MAX_INDEX, SmoothcertError
from ..registry import Registry

RERUN_TO_RESUME = "rerun the same command to resume"


@dataclass(frozen=True)
class Command:
    """A subcommand (or an ``analyze`` analysis): its one-line ``help``, ``add_arguments(parser)``
    declaring its flags, ``run(args)``, and ``resume_hint``, what its user does next after
    Ctrl-C (a command whose record files are resumable resumes by being rerun)."""

    help: str
    add_arguments: Callable
    run: Callable
    resume_hint: str = RERUN_TO_RESUME


COMMANDS: Registry = Registry("command")
"""Subcommand name -> :class:`Command`, in the order ``smoothcert --help`` lists them."""


def command(name: str, help: str, add_arguments: Callable, resume_hint: str = RERUN_TO_RESUME):
    """Register subcommand ``name``: ``add_arguments(parser)`` declares it; the decorated runs."""

    def deco(run: Callable) -> Callable:
        COMMANDS.register(name)(Command(help, add_arguments, run, resume_hint))
        return run

    return deco


# --------------------------------------------------------------------------- parser and help
class HelpFormatter(argparse.HelpFormatter):
    """Every flag's default shown once, ArgumentDefaultsHelpFormatter-style (a help text that
    mentions its default already keeps its own wording), and the lines ``NAME\tDESCRIPTION`` of
    a listing laid out as a table whose descriptions wrap under themselves."""

    def _get_help_string(self, action) -> str:
        default = default_text(action.default) if action.option_strings else None
        return with_default(action.help, default and default.replace("%", "%%"))

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


def default_text(value) -> str | None:
    """How a default reads in help; None where nothing is set (None, an unset switch, [])."""
    if value is None or value is False or value is argparse.SUPPRESS or value in ([], {}):
        return None
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def with_default(help_text: str | None, default: str | None) -> str | None:
    """``help_text (default: DEFAULT)``, unless there is no default or the text names it."""
    if default is None or help_text is None or re.search(r"\bdefault\b", help_text, re.I):
        return help_text
    return f"{help_text} (default: {default})"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser with :class:`HelpFormatter` whose usage errors are one line, exit 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2 (argparse would also print the usage)
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_subcommands(parser: argparse.ArgumentParser, dest: str, metavar: str,
                    registry: Registry) -> None:
    """A required subcommand ``dest`` of ``parser``: one subparser per :class:`Command` of
    ``registry``, in its order."""
    sub = parser.add_subparsers(dest=dest, metavar=metavar, parser_class=Parser)
    sub.required = True
    for name, cmd in registry.items():
        cmd.add_arguments(sub.add_parser(name, help=cmd.help, description=cmd.help))


# --------------------------------------------------------------------------- argparse types
def int_at_most(limit: int, why: str) -> Callable[[str], int]:
    """An argparse type: an int no larger than ``limit`` (``why`` says where the limit is from)."""

    def parse(text: str) -> int:
        value = int(text)  # argparse turns a ValueError into "invalid int value"
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit} ({why}), got {text}")
        return value

    parse.__name__ = "int"  # argparse names the type in "invalid int value"
    return parse


DRAWS = int_at_most(MAX_DRAWS, "2**53: vote counts are exact float64 integers")
BATCH = int_at_most(MAX_BATCH, "2**31-1: rows of one forward batch")
INDEX = int_at_most(MAX_INDEX, "2**63-1: int64 example indices")


def parse_params(items, flag: str = "--param") -> dict:
    """``["KEY=VALUE", ...]`` -> ``{KEY: VALUE}``, each VALUE read as YAML (a number where Python
    reads one) with ``yaml.safe_load``, so a tag never builds an object or runs code. An item
    without ``=`` or without a key, or whose VALUE is not YAML, is one SmoothcertError line
    naming ``flag``, the item and the problem."""
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SmoothcertError(f"{flag} takes KEY=VALUE, got {_shown(item)}")
        params[key] = _number_or_yaml(_yaml_value(value, f"{flag} {_shown(item)}: the value "
                                                         f"of {key}"))
    return params


def _yaml_value(text: str, where: str):
    """The YAML value of ``text``, or one SmoothcertError line: ``where`` (the flag, the item),
    then the problem (YAML's first line, with the column within the value)."""
    import yaml

    from ..training.recipes import contains_itself, yaml_problem

    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as err:
        raise SmoothcertError(f"{where} is not valid YAML: {yaml_problem(err)}") from None
    if contains_itself(value):  # an alias inside its own anchor: `&a [*a]`
        raise SmoothcertError(f"{where} contains itself (a YAML alias inside its anchor)")
    return value


def _shown(item: str, width: int = 60) -> str:
    """``item`` quoted for an error line, cut to about ``width`` characters (a long value would
    push the problem off the line)."""
    return repr(item if len(item) <= width else item[: width - 1] + "…")


def _number_or_yaml(value):
    """YAML 1.1 reads ``1e-4`` as a string; take any text that Python reads as a float as one."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


# --------------------------------------------------------------------------- shared flags
PROGRESS = ("auto", "always", "never")


def add_common(p: argparse.ArgumentParser, data_root: bool = True) -> None:
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


def image_size_arg(p, help_text: str) -> None:
    p.add_argument("--image-size", type=int, metavar="S", help=help_text)


def workers_arg(p) -> None:
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes decoding images ahead of the model (default: none for "
                        "in-memory datasets; for image folders one per core but one, at most 8)")


def example_args(p, split: str, split_help: str, seed_help: str) -> None:
    """Which examples of which dataset, and the seed of their noise."""
    p.add_argument("--dataset", help="dataset (default: the checkpoint's)")
    p.add_argument("--split", default=split, choices=("train", "test"), help=split_help)
    p.add_argument("--skip", type=INDEX, default=1, help="take every skip-th example")
    p.add_argument("--max", type=INDEX, dest="max_count",
                   help="at most this many examples (at most 2**63-1)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)


# --------------------------------------------------------------------------- resolving flags
def resolve_device(name: str):
    """The torch device of ``--device``: auto is CUDA where available; an unavailable CUDA is a
    SmoothcertError. The only place that chooses a device (the library derives it)."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SmoothcertError("--device cuda was asked for but CUDA is not available")
    return torch.device(name)


def progress_bars(args) -> bool:
    """Whether to draw progress bars: ``--progress`` resolved against stderr, where they go."""
    if args.progress == "auto":
        return sys.stderr.isatty()
    return args.progress == "always"


def progress_mode(args):
    """How a dataset run shows progress: ``"bar"`` on a terminal (or ``--progress always``),
    ``"lines"`` off one under ``--progress auto`` (a plain line every 30 s, so that a log can
    tell a long run from a hang), ``False`` for ``never``."""
    if progress_bars(args):
        return "bar"
    return "lines" if args.progress == "auto" else False


def is_main_rank() -> bool:
    """Rank 0 under torchrun (one progress bar or printed line for K processes), or a process
    alone."""
    return os.environ.get("RANK", "0") == "0"
