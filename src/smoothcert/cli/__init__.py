"""The command line: one module per command (parse, call one library function, print)."""

from .app import main

__all__ = ["main"]
