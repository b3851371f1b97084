"""What every benchmark prints with its numbers: the hardware and the software it ran on."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch

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
