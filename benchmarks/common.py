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


def environment(device: torch.device) -> dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent).stdout.strip()
    return {
        "device": gpu or f"CPU: {cpu_name()} ({os.cpu_count()} logical cores, "
                         f"{torch.get_num_threads()} torch threads)",
        "python": platform.python_version(), "torch": torch.__version__,
        "smoothcert": f"{smoothcert.__version__} ({sha or 'no git'})",
    }


def print_environment(device: torch.device) -> None:
    for key, value in environment(device).items():
        print(f"{key}: {value}")
