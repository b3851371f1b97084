"""The package version and source commit (a base module, so that every layer may read them)."""

import subprocess
from pathlib import Path

__version__ = "0.1.0"


def git_sha() -> str | None:
    """The commit of the smoothcert source tree, when it is a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
