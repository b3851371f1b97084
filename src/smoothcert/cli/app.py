"""The ``smoothcert`` command line: the parser of every registered command, and ``main``, which
runs one and turns any user error into one line on stderr and exit code 2.

Each command lives in its own module and registers itself in
:data:`~smoothcert.cli.common.COMMANDS` when imported; the imports below, in the order that
``smoothcert --help`` lists the commands, are what registers them.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import SmoothcertError
from .common import COMMANDS, Parser, add_subcommands

# Each module registers its commands on import, so the order of these imports is the order in
# which --help lists the commands: the workflow's, not the alphabet's.
# isort: off
from . import train, certify, attack, analyze, report  # noqa: F401
from . import merge, import_checkpoint, demo  # noqa: F401
# isort: on


def build_parser() -> argparse.ArgumentParser:
    """The ``smoothcert`` parser: ``--version`` and one subparser per registered command."""
    from ..version import __version__

    parser = Parser(prog="smoothcert",
                    description="Randomized smoothing: train, certify, attack, report.")
    parser.add_argument("--version", action="version", version=f"smoothcert {__version__}")
    add_subcommands(parser, dest="command", metavar="COMMAND", registry=COMMANDS)
    return parser


def main(argv=None) -> int:
    """Run the command of ``argv`` (default: ``sys.argv[1:]``); its exit code: 0 done, 2 a
    usage or user error (one line on stderr), 130 interrupted (with what to do next)."""
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
        print(f"smoothcert {args.command}: error: {_os_error(args, e)}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        from ..io import disk_full_error  # numpy: not imported to parse

        if disk_full_error(e) is not None:  # a library's own error for a full disk
            print(f"smoothcert {args.command}: error: {_os_error(args, e)}", file=sys.stderr)
            return 2
        if not _out_of_memory(e):
            raise
        print(f"smoothcert {args.command}: error: {_memory_advice(args, e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = COMMANDS[args.command].resume_hint
        print(f"smoothcert {args.command}: interrupted; {hint}", file=sys.stderr)
        return 130
    return 0


def _os_error(args, e: BaseException) -> str:
    """One line for a file that could not be read or written: the cause and the file (the
    writers of :mod:`smoothcert.io` name the file of every failed write); for a full disk or
    quota, what to do next (the command's resume hint)."""
    from ..io import disk_full_error

    full = disk_full_error(e)
    error = full if full is not None else e
    cause = getattr(error, "strerror", None) or str(error) or type(error).__name__
    files = [f for f in (getattr(error, "filename", None), getattr(error, "filename2", None))
             if f is not None]
    where = f": {' -> '.join(map(str, files))}" if files else ""
    if full is None:
        return f"{cause}{where}"
    hint = COMMANDS[args.command].resume_hint
    return f"{cause}{where}; free some space, then {hint}"


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
        batch = f"--batch {args.batch}" if args.batch is not None else \
            "the default batch (1000, or on CUDA the one a note named)"  # certify and co.
        return (f"out of memory with {batch} ({detail}); rerun with a smaller --batch{kept}")
    if args.command == "train":
        return (f"out of memory ({detail}); rerun with a smaller --batch, or on a device "
                "with more memory; the last completed epoch's checkpoint is kept (--resume)")
    return f"out of memory ({detail})"
