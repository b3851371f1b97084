"""Report tables and their text formats: :class:`Table` and the :data:`FORMATS` registry.

A :class:`Table` holds raw values with a key, a header and a display style per column; a format
(``md``, ``latex``, ``csv``, ``json``, ``html``; :func:`get_format`) turns it into text. ``md`` and
``latex`` show each value in its column's style (accuracies in percent) and escape the text;
``csv`` and ``json`` keep full float precision. Which tables exist is :mod:`.report`'s and
:mod:`.train_report`'s business.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
import math
from collections.abc import Callable

import numpy as np

from ..registry import Registry


@dataclasses.dataclass(frozen=True)
class Table:
    """A report table: raw values per row, and per column a key (csv/json), a header (md/latex)
    and a style saying how md/latex show the value (``text``, ``int``, ``percent``, ``float4``,
    ``float3``, ``float2``). Missing values are None."""

    keys: tuple
    headers: tuple
    styles: tuple
    rows: tuple


Formatter = Callable[[Table], str]
FORMATS: Registry = Registry("report format")  # Table -> text
register_format = FORMATS.register


def get_format(name: str) -> Formatter:
    return FORMATS[name]


_STYLES = {
    "text": str,
    "int": lambda v: str(int(v)),
    "percent": lambda v: f"{100 * v:.1f}%",
    "float3": lambda v: f"{v:.3f}",
    "signed3": lambda v: f"{v:+.3f}",
    "float4": lambda v: f"{v:.4f}",
    "float2": lambda v: f"{v:.2f}",
}


def _display(table: Table, missing: str) -> list[list[str]]:
    """Cells as md/latex show them (the percent sign is added back by LaTeX's escaping)."""
    return [[missing if v is None else _STYLES[style](v) for v, style in zip(row, table.styles)]
            for row in table.rows]


# --------------------------------------------------------------------------- formats
@register_format("md")
def format_markdown(table: Table) -> str:
    """A GitHub markdown table; accuracies in percent."""
    rows = [[_md_escape(row[0]), *row[1:]] for row in _display(table, "–")]
    align = ["---" if style == "text" else "---:" for style in table.styles]
    lines = ["| " + " | ".join(cells) + " |" for cells in [list(table.headers), align, *rows]]
    return "\n".join(lines) + "\n"


@register_format("latex")
def format_latex(table: Table) -> str:
    """A ``tabular`` with booktabs rules (``\\usepackage{booktabs}``); accuracies in percent."""
    header = [_latex_header(h) for h in table.headers]
    rows = [[_latex_escape(cell) if cell != "--" else cell for cell in row]
            for row in _display(table, "--")]
    lines = [
        r"\begin{tabular}{" + "".join("l" if s == "text" else "r" for s in table.styles) + "}",
        r"\toprule",
        " & ".join(header) + r" \\",
        r"\midrule",
        *(" & ".join(cells) + r" \\" for cells in rows),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    return "\n".join(lines) + "\n"


def _latex_header(header: str) -> str:
    if header.startswith("r=") or header == "n":
        return f"${header}$"
    if header.startswith("σ_x "):
        return f"$\\sigma_x$ {header[4:]}"
    if header.startswith("d≤"):
        return f"$d \\le {header[2:]}$"
    return _latex_escape(header)


@register_format("csv")
def format_csv(table: Table) -> str:
    """Comma-separated, header line first; fractions at full precision, empty when missing."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.keys)
    for row in table.rows:
        writer.writerow(["" if v is None else _csv_cell(v) for v in row])
    return out.getvalue()


def _csv_cell(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@register_format("json")
def format_json(table: Table) -> str:
    """A list of objects, one per row; fractions as floats, null when missing."""
    rows = [dict(zip(table.keys, (_json_value(v) for v in row))) for row in table.rows]
    return json.dumps(rows, indent=2) + "\n"


def _json_value(value):
    """Plain JSON: numpy scalars as Python numbers; an infinite value (a median distance when
    most attacks failed) as null, since JSON has no infinity."""
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and not math.isfinite(value) else value


@register_format("html")
def format_html(table: Table) -> str:
    """An HTML ``<table>`` (no page around it: ``report --format html`` builds the page,
    :mod:`.html`); cells as ``md`` shows them (accuracies in percent), escaped; numeric columns
    right-aligned."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.headers)
    body = ["<tr>" + "".join(
        f'<td class="{"text" if style == "text" else "num"}">{html.escape(cell)}</td>'
        for cell, style in zip(cells, table.styles)) + "</tr>" for cells in _display(table, "–")]
    return (f'<table class="report"><thead><tr>{head}</tr></thead><tbody>'
            + "".join(body) + "</tbody></table>\n")


# --------------------------------------------------------------------------- escaping
def _md_escape(text: str) -> str:
    return text.replace("|", r"\|")


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}


_LATEX_NORMS = {"ℓ1": r"$\ell_1$", "ℓ2": r"$\ell_2$", "ℓ∞": r"$\ell_\infty$"}
"""The norms a ``radius in`` cell names, in math mode (pdfLaTeX has no ℓ or ∞ glyph)."""


def _latex_escape(text: str) -> str:
    text = "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)
    for norm, latex in _LATEX_NORMS.items():
        text = text.replace(norm, latex)
    return text
