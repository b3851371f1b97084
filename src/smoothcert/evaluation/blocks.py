"""Generated blocks of hand-written Markdown documents: tables only ``smoothcert report`` writes.

A block ``name`` is the lines between ``<!-- report:name -->`` and ``<!-- /report:name -->``;
:func:`splice_block` replaces them atomically and leaves the prose around them alone.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import SmoothcertError
from ..io import write_text_atomic


def block_markers(name: str) -> tuple[str, str]:
    """The comment lines that open and close the generated block ``name`` of a Markdown file."""
    return f"<!-- report:{name} -->", f"<!-- /report:{name} -->"


def splice_block(doc, name: str, text: str) -> None:
    """Replace the lines between the markers of block ``name`` in ``doc`` by ``text``.

    Lets a hand-written document (a study's README.md) hold tables that are only ever written by
    ``smoothcert report``: regenerating them rewrites the blocks and leaves the prose alone. The
    document is rewritten atomically, so a failure leaves it as it was.
    """
    doc = Path(doc)
    lines, start, end = _block_span(doc, name)
    body = text if text.endswith("\n") else text + "\n"
    write_text_atomic(doc, "".join(lines[:start + 1]) + body + "".join(lines[end:]))


def check_block(doc, name: str) -> None:
    """Raise unless ``doc`` holds the block ``name`` exactly once (so a report fails before it
    computes anything)."""
    _block_span(Path(doc), name)


def _block_span(doc: Path, name: str) -> tuple[list[str], int, int]:
    if not re.fullmatch(r"[A-Za-z0-9_.]+", name):
        raise SmoothcertError(f"block name {name!r}: use letters, digits, '_' or '.'")
    if not doc.is_file():
        raise SmoothcertError(f"document {doc} does not exist")
    lines = doc.read_text(encoding="utf-8").splitlines(keepends=True)
    opening, closing = block_markers(name)
    starts = [i for i, line in enumerate(lines) if line.strip() == opening]
    ends = [i for i, line in enumerate(lines) if line.strip() == closing]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SmoothcertError(
            f"{doc} must hold the block {name!r} once: a line {opening} followed by a line "
            f"{closing} (found {len(starts)} opening and {len(ends)} closing lines)")
    return lines, starts[0], ends[0]
