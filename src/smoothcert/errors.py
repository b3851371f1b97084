"""User-facing errors.

Everything a user can get wrong (a bad σ, a foreign checkpoint, an unknown dataset name, ...)
raises :class:`SmoothcertError` at the boundary where it enters the library. The CLI turns it into
one line on stderr and exit code 2; Python users catch it as a ``ValueError``.

Text a user supplied (a path, a class name read from a file or a folder) goes into a message
through :func:`printable`, so that a terminal escape, a NUL or a line break in it cannot clear
the screen, retitle the terminal or split the one line; :func:`check_plain_name` refuses such
characters in a name that the library keeps (a class name).
"""

from __future__ import annotations

import math
import numbers
import unicodedata
from collections.abc import Iterable


class SmoothcertError(ValueError):
    """A problem with what the user asked for, stated with how to fix it."""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> SmoothcertError:
    """The error for a registry miss: names the known entries."""
    return SmoothcertError(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")


def printable(text) -> str:
    """``str(text)`` with every character that :func:`repr` escapes written as its escape
    (``\\x1b``, ``\\x00``, ``\\n``, ``\\u202e``, ``\\udcff``), without repr's quotes:
    the result holds only printable characters (``str.isprintable``), so it can go into a
    one-line message as it is; printable text, backslashes and non-ASCII letters included, is
    unchanged."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# The bidirectional embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069), which
# reorder the text that follows them on a terminal or a page ("Trojan Source", CVE-2021-42574).
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def unsafe_character(text: str) -> str | None:
    """The first character of ``text`` that no name should hold, else None: a C0 or C1 control
    or DEL (terminal escapes, NUL, line breaks; category Cc), a line or paragraph separator
    (Zl, Zp), a lone surrogate (Cs: bytes of a file name that are not UTF-8), or a bidi
    control (:data:`BIDI_CONTROLS`). Letters of any script, spaces, emoji (with their zero-width
    joiners) and the marks LRM/RLM pass."""
    for c in text:
        if unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs") or c in BIDI_CONTROLS:
            return c
    return None


def check_plain_name(name: str, where: str, how: str) -> str:
    """``name`` if it holds no :func:`unsafe_character`; else one SmoothcertError, "``where``
    '<name escaped by printable>' holds the control character U+XXXX; ...: ``how``" (``where``
    says where the name came from, ``how`` how to fix it)."""
    bad = unsafe_character(name)
    if bad is not None:
        raise SmoothcertError(f"{where} '{printable(name)}', which holds the control character "
                              f"U+{ord(bad):04X}; a class name is plain text (no terminal "
                              f"escapes, NUL, line breaks or bidi controls): {how}")
    return name


def _is_number(value) -> bool:
    """A real number that is not a bool (``True`` must not pass as 1): Python's int and float,
    and numpy's scalars (``np.float32(0.25)``, ``np.int64(10)``; not ``np.bool_``), which register
    as :class:`numbers.Real`."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_finite(name: str, value: float) -> float:
    """A finite number > 0 (a σ, a learning rate, a step size)."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise SmoothcertError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_nonnegative(name: str, value: float) -> float:
    """A finite number ≥ 0 (a weight such as λ or γ that may switch a term off)."""
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise SmoothcertError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_probability(name: str, value: float) -> float:
    """A level such as α: strictly inside (0, 1)."""
    if not _is_number(value) or not 0.0 < value < 1.0:
        raise SmoothcertError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return float(value)


def check_in_range(name: str, value: float, low: float, high: float,
                   include_high: bool = True) -> float:
    """A number in [low, high], or in [low, high) without ``include_high`` (NaN is refused)."""
    inside = _is_number(value) and low <= value and (value <= high if include_high else
                                                      value < high)
    if not inside:
        interval = f"[{low}, {high}{']' if include_high else ')'}"
        raise SmoothcertError(f"{name} must be a number in {interval}, got {value!r}")
    return float(value)


# Largest values of integer inputs: the engine counts votes in int64 and the statistics read
# them as float64, exact up to 2**53; one batch is a torch tensor whose row count must fit
# torch's int32 kernel indexing; example indices are int64.
MAX_DRAWS = 2**53
MAX_BATCH = 2**31 - 1
MAX_INDEX = 2**63 - 1


def check_count(name: str, value: int, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer (not a bool) ≥ ``minimum`` (and ≤ ``maximum`` when given), returned as a
    Python int: numpy's integers (:class:`numbers.Integral`) pass, so that none reaches a JSON
    manifest."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise SmoothcertError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise SmoothcertError(f"{name} must be at most {maximum}, got {value!r}")
    return int(value)


def check_bool(name: str, value: bool) -> bool:
    """True or False, nothing that merely converts to one (1, "yes")."""
    if not isinstance(value, bool):
        raise SmoothcertError(f"{name} must be true or false, got {value!r}")
    return value
