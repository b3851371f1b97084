"""Wall-clock time of every runnable README command at its written size, as a user runs it.

`tests/test_readme.py` runs the README's bash blocks shrunk to seconds; this runs the same
commands (the blocks not marked ``# needs:``, top to bottom, parsed by that test's own
functions) unshrunk, each as a ``smoothcert`` process in one empty folder (with a link
``configs/`` to the recipes, as the test), and prints one row per command: seconds and the
command. `make` lines are skipped (time `make demo` on a fresh clone yourself). Stops at the
first command that fails. The README's stated times come from this table.

    python benchmarks/readme_times.py --workdir /tmp/readme-run
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import print_environment

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[tuple[str, list[str]]]:
    """The runnable commands, as tests/test_readme.py finds them."""
    spec = importlib.util.spec_from_file_location("test_readme", ROOT / "tests/test_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.runnable_commands()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", required=True, help="an empty (or new) folder to run in")
    p.add_argument("--smoothcert", default=shutil.which("smoothcert") or "smoothcert",
                   help="the smoothcert executable (default: the one on PATH)")
    args = p.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        sys.exit(f"{work} is not empty: the README's commands expect a fresh folder")
    (work / "configs").symlink_to(ROOT / "configs")
    print_environment(torch.device("cpu"))
    print(f"OMP_NUM_THREADS: {os.environ.get('OMP_NUM_THREADS', 'unset')}\n")
    print("| seconds | command |\n| ---: | --- |")
    total = 0.0
    for line, words in readme_commands():
        if words[0] in ("make", ".", "source"):  # the venv's activation: --smoothcert says which
            continue
        if words[0] == "smoothcert":  # through the shell, as a reader runs it (globs too)
            line = shlex.quote(args.smoothcert) + line[len("smoothcert"):]
        tic = time.perf_counter()
        done = subprocess.run(["bash", "-c", line], cwd=work, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - tic
        total += seconds
        print(f"| {seconds:,.1f} | `{shlex.join(words)}` |", flush=True)
        if done.returncode != 0:
            sys.exit(f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    print(f"\ntotal {total / 60:.1f} min")


if __name__ == "__main__":
    main()
