"""What every benchmark prints with its numbers: the hardware and the software it ran on, and
the FLOPs of the forward pass it timed."""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import subprocess
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import smoothcert


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(short: bool = False) -> str:
    """``git rev-parse HEAD`` of this checkout; empty where there is no git (a copied tree)."""
    try:
        return subprocess.run(["git", "rev-parse"] + ["--short"] * short + ["HEAD"],
                              capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return ""


def environment(device: torch.device) -> dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    sha = git_commit(short=True)
    return {
        "device": gpu or f"CPU: {cpu_name()} ({os.cpu_count()} logical cores, "
                         f"{torch.get_num_threads()} torch threads)",
        "python": platform.python_version(), "torch": torch.__version__,
        "smoothcert": f"{smoothcert.__version__} ({sha or 'no git'})",
    }


def print_environment(device: torch.device) -> None:
    for key, value in environment(device).items():
        print(f"{key}: {value}")


def start_run(device: str, threads: int | None) -> tuple | None:
    """A timing run's start: torch's ``threads`` (None: torch's own), the environment, and the
    load average (the machine may be shared: only ratios within one run then count), which it
    returns (None where the system does not say)."""
    if threads:
        torch.set_num_threads(threads)
    print_environment(torch.device(device))
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"load average at start: {load[0]:.2f}" if load else "load average: unknown")
    return load


def package_versions(*names: str) -> dict:
    """Installed versions of ``names`` ("not installed" for a missing one), for the printout."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def flops_per_image(model, shape, device) -> int:
    """FLOPs of one forward pass of one input of ``shape`` (multiply-adds count two; counted by
    ``FlopCounterMode``: convolutions, matrix products and attention, not norms or activations)."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:  # not inference_mode: torch 2.5's counter counts 0 under it
        model(torch.zeros((1,) + tuple(shape), device=device))
    return counter.get_total_flops()


def goal(value: float, target: float, lower: bool) -> dict:
    """Whether ``value`` meets ``target`` (at most, or at least) and by what factor: value/target
    for an upper bound, target/value for a lower one (≤ 1: met; > 1: missed by that factor)."""
    factor = value / target if lower else target / value
    return {"target": target, "met": factor <= 1, "factor": factor}


def verdict(g: dict | None) -> str:
    if g is None:
        return "no goal"
    if g["met"]:  # rounded towards the goal's edge: a near miss never reads "1.00"
        return f"met ({math.floor(g['factor'] * 100) / 100:.2f}×)"
    return f"missed by {math.ceil(g['factor'] * 100) / 100:.2f}×"


def num(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}" if abs(v) < 10 else f"{v:,.1f}"
