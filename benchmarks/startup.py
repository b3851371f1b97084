"""Start-up time of the command line: ``smoothcert --version``, ``--help``, ``certify --help``,
``train --help`` and a mistyped flag (argparse's one-line error, exit 2), each a fresh process
of the console script, against ``python -c pass`` of the same interpreter. Goal: at most 0.5 s
over ``python -c pass`` for each (on an idle machine). Interleaved over ``--runs`` rounds, so
drift of a shared machine hits every command alike; min and median per command, and the load
average before and after (a busy machine reads slower).

    python benchmarks/startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_name, git_commit, package_versions

GOAL = 0.5  # seconds over `python -c pass` (the goal)
COMMANDS = {
    "--version": ["--version"],
    "--help": ["--help"],
    "certify --help": ["certify", "--help"],
    "train --help": ["train", "--help"],
    "mistyped flag": ["certify", "ckpt.pt", "--out", "r.tsv", "--sigmaa", "0.25"],
}


def smoothcert_script() -> str:
    """The console script beside this interpreter (a venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "smoothcert"
    return str(beside) if beside.exists() else shutil.which("smoothcert") or "smoothcert"


def seconds(argv: list[str], expect: int) -> float:
    """Wall-clock seconds of one process ``argv``, which must exit ``expect``."""
    tic = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - tic
    if done.returncode != expect:
        sys.exit(f"{' '.join(argv)}: exit {done.returncode}, expected {expect}: "
                 f"{done.stderr.strip()[-300:]}")
    return took


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} logical cores)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10, help="rounds (each runs every command once)")
    p.add_argument("--smoothcert", default=smoothcert_script(), help="the console script")
    args = p.parse_args()
    cases = {"python -c pass": ([sys.executable, "-c", "pass"], 0)}
    for name, words in COMMANDS.items():
        cases[name] = ([args.smoothcert, *words], 2 if name == "mistyped flag" else 0)
    before = load()
    times = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (argv, expect) in cases.items():
            times[name].append(seconds(argv, expect))
    print(f"device: CPU: {cpu_name()} ({os.cpu_count()} logical cores)")
    sha = git_commit(short=True)
    print(f"python: {platform.python_version()}; smoothcert "
          f"{importlib.metadata.version('smoothcert')} ({sha or 'no git'}); "
          + "; ".join(f"{k}: {v}" for k, v in package_versions("torch", "numpy").items()))
    print(f"before: {before}\nafter: {load()}\n{args.runs} runs each, seconds")
    base = min(times["python -c pass"])
    print("\n| command | min s | median s | min − python -c pass | goal ≤ 0.5 s |\n"
          "| --- | ---: | ---: | ---: | --- |")
    for name, values in times.items():
        over = min(values) - base
        verdict = "" if name == "python -c pass" else ("met" if over <= GOAL else "missed")
        print(f"| `{name}` | {min(values):.3f} | {statistics.median(values):.3f} | "
              f"{over:+.3f} | {verdict} |")


if __name__ == "__main__":
    main()
