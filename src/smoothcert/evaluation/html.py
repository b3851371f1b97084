"""The HTML report (``report FILES --format html --out report.html``): one self-contained page.

The page holds the tables ``report`` prints (in the ``html`` table format of :mod:`.tables`), the
certified-accuracy curves as an inlined PNG, and the gallery (:mod:`.gallery`) with a sort
select, a minimum-radius slider (the radius controls only where the cards' radii differ) and a
switch that hides abstentions; the address can set them (``#sort=radius:asc&min=0.25&hide=1``,
values the controls do not offer ignored). It loads nothing: no
script, style, font or image comes from the network (every image is a ``data:`` URI), so it can
be mailed or archived as one file. Classification, segmentation and median files may share a
page: each kind gets its own table (:mod:`.dense` for the dense tasks).
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import SmoothcertError
from ..io import write_text_atomic
from ..runs.records import Records
from .gallery import Gallery, data_uri, file_gallery, file_kind

GALLERY = 24  # examples per file in the gallery when not told
TITLES = {"classification": "Certified accuracy", "segmentation": "Certified segmentation",
          "boxes": "Certified intervals (median smoothing)"}
"""The page's title of each kind of file's table (:func:`~.gallery.file_kind`)."""


def html_report(paths: Sequence, radii, out, *, gallery: int = GALLERY, data_root=None,
                eps: float | None = None, plot=None, envelope: bool = False, ecdf=None,
                sigma_hist=None, common: bool = False, cost: bool = False, plot_cost=None,
                cost_radius: float = 0.5, norm: str | None = None) -> Path:
    """Write the HTML report of the record files ``paths`` to ``out`` (atomically) and return
    its path.

    Each kind of file (classification, segmentation, median: :func:`~.gallery.file_kind`)
    gets :func:`~.report.report`'s table; the classification files' with the same arguments
    (``plot`` and the other figure paths are written as there). The page adds their curves and
    a gallery of ``gallery`` examples per file (0: none), with images from the dataset split
    each manifest names (``data_root``: where its files are; a split that cannot be loaded is
    said in one line, the page is still written). ``eps`` is the ε at which median files' boxes
    are drawn (default: per example, the largest ε of the grid at which every interval is
    finite). ``common`` applies to every kind; the other flags are the classification files'
    (each radius in ``norm``, said in their table and curves). Refused in one line: an ``out``
    that is an input or another output, a ``gallery`` < 0 (before anything is written), an
    ``eps`` outside a median file's grid, classification flags without a classification file,
    classification files whose radii are in different norms without ``norm`` (before the page
    is written).
    """
    from .report import check_outputs

    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not isinstance(gallery, int) or gallery < 0:
        raise SmoothcertError(f"--gallery must be an integer >= 0, got {gallery!r}")
    check_outputs(paths, {"--out": out, "--plot": plot, "--ecdf": ecdf,
                          "--sigma-hist": sigma_hist, "--plot-cost": plot_cost})
    records = _named(paths, norm)
    kinds = [file_kind(r) for r in records]
    if eps is not None and "boxes" not in kinds:
        raise SmoothcertError("--gallery-eps is the ε of median files' boxes, and no file is "
                              "one; drop it")
    tables = _tables(paths, kinds, radii, common, dict(
        plot=plot, envelope=envelope, ecdf=ecdf, sigma_hist=sigma_hist, cost=cost,
        plot_cost=plot_cost, cost_radius=cost_radius, norm=norm))
    curves = _curves([r for r in records if file_kind(r) == "classification"], envelope, norm,
                     common)
    cache: dict = {}  # each dataset split loaded once
    galleries = [file_gallery(r, gallery, data_root, eps, cache) for r in records] \
        if gallery else []
    page = _page([r.path for r in records], tables, curves, galleries)
    write_text_atomic(out, page)
    return Path(out)


def _tables(paths: Sequence, kinds: Sequence[str], radii, common: bool,
            options: dict) -> list[tuple[str, str]]:
    """(title, :func:`~.report.report`'s html table) of each kind of file: ``common`` for
    every kind, ``options`` (report's keyword arguments) the classification files'; refused
    in one line where one is given (not None or False) and no file is one."""
    from .report import refuse, report

    if "classification" not in kinds:
        refuse({f"--{k.replace('_', '-')}": v for k, v in options.items()
                if k != "cost_radius"}, "segmentation or median")
    tables = []
    for kind, title in TITLES.items():
        group = [p for p, k in zip(paths, kinds) if k == kind]
        own = options if kind == "classification" else {}
        if group:
            tables.append((title, report(group, radii, fmt="html", common=common, **own)))
    return tables


def _named(paths: Sequence, norm: str | None) -> list[Records]:
    """The files read, named as the table names them, their radii in ``norm`` where they are
    classification files."""
    import dataclasses

    from ..runs.records import distinct_labels, read_records
    from .norms import in_norm

    named = [dataclasses.replace(read_records(p), label=label)
             for p, label in zip(paths, distinct_labels(list(paths)))]
    return [in_norm(r, norm) if file_kind(r) == "classification" and "radius" in r else r
            for r in named]


# --------------------------------------------------------------------------- curves
def _curves(records: Sequence[Records], envelope: bool, norm: str | None,
            common: bool) -> str | None:
    """The certified-accuracy figure of the files with a radius (``common``: on the examples
    all of them hold, as the table), as a PNG data URI; None when no file has a radius."""
    from .plots import certified_accuracy_figure
    from .report import common_examples

    certified = [r for r in records if "radius" in r and "label" in r and "predict" in r]
    if not certified:
        return None
    if common and len(certified) > 1:
        certified = common_examples(certified)
    fig = certified_accuracy_figure(certified, envelope=envelope and len(certified) > 1,
                                    norm=norm)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return data_uri(buffer.getvalue())


# --------------------------------------------------------------------------- the page
STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px;margin:16px 0 6px}
table.report{border-collapse:collapse;margin:8px 0}
table.report th,table.report td{border-bottom:1px solid #ddd;padding:3px 8px}
table.report th{background:#f3f3f3;text-align:left}td.num{text-align:right}
.files{color:#555;font-size:12px}.note{color:#a33}
.controls{position:sticky;top:0;background:#fff;padding:8px 0;border-bottom:1px solid #ddd;
 z-index:2}.controls label,.controls .fixed{margin-right:18px}.fixed{color:#555}
.cards{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}
.card{position:relative;margin:0;padding:6px;border:1px solid #ccc;border-radius:4px;
 background:#fafafa}
.card.abstain{border:2px dashed #c00;background:#fff4f4}.card.wrong{border-color:#e69500;
 background:#fff8ec}
.badge{position:absolute;top:8px;left:8px;background:#c00;color:#fff;font-size:11px;
 padding:1px 5px;border-radius:3px;z-index:1}
.pics{display:flex;gap:4px}
.pics img,.pics svg{image-rendering:pixelated;display:block;background:#000}
.pics img.map,.swatch.hatched{background:repeating-linear-gradient(45deg,#666 0 2px,
 #f4f4f4 2px 5px)}
.pic small{display:block;text-align:center;font-size:11px;color:#555}
figcaption{font-size:12px;margin-top:4px;display:flex;flex-direction:column;width:0;
 min-width:100%;overflow-wrap:anywhere}
.noimg{width:132px;height:132px;background:#eee}
.pics svg.boxes{background:#777}
svg.boxes rect{fill:none;vector-effect:non-scaling-stroke;stroke-width:2}
svg.boxes image{image-rendering:pixelated}
rect.target{stroke:#2ca02c}rect.median{stroke:#1f77b4}
svg.boxes rect.outer,svg.boxes rect.inner{stroke:#ff7f0e;stroke-width:1}
path.envelope,.swatch.envelope{fill:rgba(255,140,20,.75);background:rgba(255,140,20,.75)}
.legend span{margin-right:12px;white-space:nowrap}.swatch{display:inline-block;width:12px;
 height:12px;vertical-align:middle;margin-right:4px;border:1px solid #888}
"""

SCRIPT = """
(function () {
  "use strict";
  var sort = document.getElementById("sort"), minr = document.getElementById("min-radius"),
      hide = document.getElementById("hide-abstain"), shown = document.getElementById("shown"),
      value = document.getElementById("min-radius-value");
  function key(card, name) { return parseFloat(card.getAttribute("data-" + name)); }
  function update() {
    var by = sort.value.split(":"), dir = by[1] === "desc" ? -1 : 1;
    var min = minr ? parseFloat(minr.value) : 0, count = 0;  // no slider: one radius or none
    if (value) { value.textContent = min.toFixed(3); }
    document.querySelectorAll(".cards").forEach(function (box) {
      var cards = Array.prototype.slice.call(box.children);
      cards.sort(function (a, b) {
        return dir * (key(a, by[0]) - key(b, by[0])) || key(a, "idx") - key(b, "idx");
      });
      cards.forEach(function (card) {
        var abstain = card.classList.contains("abstain");
        // an abstention, or a card without a radius (PREDICT files: -1), shows at min 0 only
        var visible = abstain ? !hide.checked && min <= 0 : key(card, "radius") >= min ||
            min <= 0;
        card.hidden = !visible;
        count += visible ? 1 : 0;
        box.appendChild(card);
      });
    });
    shown.setAttribute("data-shown", count);
    shown.textContent = count + " of " + document.querySelectorAll(".card").length + " shown";
  }
  // The controls can start from the address: page.html#sort=radius:asc&min=0.25&hide=1. The
  // address is anyone's text: a value counts only where it is one the control offers (a sort
  // of the select's options, a min in the slider's range, hide 0 or 1); it never reaches a
  // selector or the page, and a malformed escape (%) is skipped.
  var sorts = Array.prototype.map.call(sort.options, function (o) { return o.value; });
  function decoded(text) {
    try { return decodeURIComponent(text); } catch (e) { return null; }
  }
  function inRange(text) {
    var v = Number(text);
    return text.trim() !== "" && isFinite(v) && v >= Number(minr.min) && v <= Number(minr.max);
  }
  location.hash.slice(1).split("&").forEach(function (pair) {
    var at = pair.indexOf("="), name = pair.slice(0, at), v = decoded(pair.slice(at + 1));
    if (at < 0 || v === null) { return; }
    if (name === "sort" && sorts.indexOf(v) >= 0) { sort.value = v; }
    if (name === "min" && minr && inRange(v)) { minr.value = v; }
    if (name === "hide" && (v === "0" || v === "1")) { hide.checked = v === "1"; }
  });
  [sort, minr, hide].forEach(function (el) { if (el) { el.addEventListener("input", update); } });
  update();
  document.documentElement.setAttribute("data-ready", "1");
})();
"""

ERRORS = ("window.addEventListener('error',function(e){var h=document.documentElement;"
          "h.setAttribute('data-errors',(h.getAttribute('data-errors')||'')+(e.message||"
          "'resource failed')+';')},true);")
"""Records every script error, and every element that failed to load, in the page's
``data-errors`` attribute, so a headless browser's DOM dump shows them."""

SORTS = (("radius:desc", "radius, largest first"), ("radius:asc", "radius, smallest first"),
         ("score:desc", "score, best first"),
         ("idx:asc", "example (idx)"))

SCORE = ("score: a classification card's radius, a map's certified pixel accuracy, a box "
         "card's IoU of its median box with the target")


def _page(paths: Sequence[str], tables: list, curves: str | None,
          galleries: list[Gallery]) -> str:
    """The whole document."""
    from ..version import __version__

    files = ", ".join(html.escape(str(p)) for p in paths)
    parts = ['<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>smoothcert report</title><script>{ERRORS}</script>",
             f"<style>{STYLE}</style></head><body>", "<h1>smoothcert report</h1>",
             f'<p class="files">{files} — smoothcert {html.escape(__version__)}</p>']
    for title, table in tables:
        parts.append(f"<h2>{html.escape(title)}</h2>{table}")
    if curves is not None:
        parts.append('<h2>Certified accuracy vs radius</h2>'
                     f'<img class="curves" src="{curves}" alt="certified accuracy curves">')
    if galleries:
        parts.append(_gallery_html(galleries))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _gallery_html(galleries: list[Gallery]) -> str:
    """The gallery: its controls, then one section per file, then the script. The radius sorts
    and the minimum-radius slider are left out where the cards hold one radius (a segmentation
    run's) or none (abstentions, PREDICT files): they could not tell cards apart."""
    radii = sorted({c.radius for g in galleries for c in g.cards
                    if np.isfinite(c.radius) and c.radius >= 0})
    varies = len(radii) > 1
    options = "".join(f'<option value="{v}">{html.escape(t)}</option>' for v, t in SORTS
                      if varies or not v.startswith("radius:"))
    parts = ['<h2 id="gallery">Gallery</h2><div class="controls">',
             f'<label title="{SCORE}">sort <select id="sort">{options}</select></label>']
    if varies:
        parts.append(f'<label>min radius <input type="range" id="min-radius" min="0" '
                     f'max="{radii[-1]:.6g}" step="any" value="0"> '
                     '<output id="min-radius-value">0</output></label>')
    elif radii:
        parts.append(f'<span class="fixed">radius {radii[0]:.3f} on every card</span>')
    parts += ['<label><input type="checkbox" id="hide-abstain"> hide abstentions</label>',
              '<span id="shown"></span></div>']
    for g in galleries:
        note = f'<p class="note">{html.escape(g.note)}</p>' if g.note else ""
        parts.append(f'<section class="gallery" data-kind="{g.kind}">'
                     f"<h3>{html.escape(g.name)} ({len(g.cards)} examples)</h3>{note}"
                     f"{_legend(g)}<div class=\"cards\">{''.join(c.html for c in g.cards)}"
                     "</div></section>")
    parts.append(f"<script>{SCRIPT}</script>")
    return "\n".join(parts)


LEGENDS = {
    "classification": (("abstain", "abstained (dashed)"), ("wrong", "wrong prediction")),
    "segmentation": (("hatched", "abstained pixel (certified map)"),),
    "boxes": (("target", "target box"), ("median", "median box"),
              ("envelope", "certified envelope at ε: between the inner and the outer box")),
}
SWATCHES = {"abstain": "border:2px dashed #c00", "wrong": "border-color:#e69500",
            "target": "border:2px solid #2ca02c", "median": "border:2px solid #1f77b4",
            "envelope": "border-color:#ff7f0e"}


def _legend(gallery: Gallery) -> str:
    """What the borders, colours and hatching of a gallery mean (segmentation: each class's
    colour, the background's muted, and the unlabelled pixels' of the label maps; boxes: the
    order of their coordinates)."""
    from .gallery import BOX_ORDER, BOX_SHORT, UNLABELLED_RGB, class_rgb

    swatches = [(f'class="swatch {name}" style="{SWATCHES.get(name, "")}"', text)
                for name, text in LEGENDS[gallery.kind]]
    if gallery.ignore is not None:
        swatches.append((f'class="swatch unlabelled" style="background:rgb{UNLABELLED_RGB}"',
                         f"unlabelled pixel (label {gallery.ignore})"))
    for c, name in enumerate(gallery.classes):
        rgb = class_rgb(c, gallery.background)
        swatches.append((f'class="swatch" data-class="{c}" style="background:rgb{rgb}"', name))
    spans = [f"<span><i {attrs}></i>{html.escape(text)}</span>" for attrs, text in swatches]
    if gallery.kind == "boxes":
        spans.append(f'<span class="order">boxes: ({BOX_SHORT}) = ({BOX_ORDER}), in '
                     "pixels</span>")
    return f'<p class="legend">{"".join(spans)}</p>'
