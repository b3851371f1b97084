"""The HTML report's gallery: one card per shown example of a record file, as HTML.

A card shows the input image (read from the dataset split the file's manifest names), and:

* classification files (``label``, ``predict``, ``radius`` columns): label, prediction and
  certified radius; an abstention (``predict`` = -1) is marked;
* segmentation files (certifier ``segment``: ``pixel_accuracy``, ``abstain_rate``, the artifact
  ``map``): the certified map beside the input, abstained pixels hatched, the labels' map where
  the dataset has it (its unlabelled pixels dark grey), and the image's certified pixel accuracy
  and abstention rate; the dataset's background class is drawn in a muted grey;
* median files (certifier ``median``: ``target``, ``median``, ``eps``, ``lower``, ``upper``): the
  input with the target box, the median box and the certified envelope at one ε, drawn in SVG
  over a margin, so a side on the image's edge shows its interval (the envelope: a translucent
  band from the inner box, the narrowest the certified intervals allow, to the outer, the
  widest). Boxes are (x_min, y_min, x_max, y_max) in pixels, the order of the regression
  datasets' labels (:mod:`smoothcert.data.dense`).

Classes are named by the dataset's ``class_names`` where it has them (else numbered). Every card
carries ``data-radius`` (abstentions: -1), ``data-idx`` and ``data-score`` for the page's sort and
filter. Images are PNGs inlined as ``data:`` URIs, so the page needs no network. A dataset that
cannot be loaded leaves the cards without images and one line saying why.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..certifiers.segment import ABSTAIN
from ..errors import SmoothcertError
from ..runs.records import Records

ABSTAINED = ABSTAIN  # the certified map's value of an abstained pixel (the artifact "map")
IMAGE_PX = 132  # CSS width of a card's image
BOX_PX = 176  # CSS width of a box card's drawing: a 28-pixel image at 6 CSS px per pixel
BOX_MARGIN = 0.1  # the drawing's margin around the image, a fraction of its longer side
BOX_ORDER = "x_min, y_min, x_max, y_max"  # a box's outputs (data/dense.py), in pixels
BOX_SHORT = "x0, y0, x1, y1"  # BOX_ORDER as a card says it (the legend says both)
# Class colours of the maps (RGB), cycled past 12 classes; abstained pixels are transparent
# over the page's hatched background, pixels without a label dark grey, the background class
# a light grey, so the objects stand out.
PALETTE = np.array([
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (188, 189, 34), (23, 190, 207), (255, 221, 87),
    (120, 200, 120), (90, 90, 220)], dtype=np.uint8)
UNLABELLED_RGB = (60, 60, 60)
BACKGROUND_RGB = (205, 205, 198)


@dataclass(frozen=True)
class Gallery:
    """The cards of one file (HTML ``<figure>`` elements) and a line saying what is missing
    (the dataset could not be loaded, say); ``kind`` is ``classification``, ``segmentation``
    or ``boxes``."""

    name: str
    kind: str
    cards: tuple  # of Card
    note: str | None = None
    classes: tuple = ()  # segmentation: the maps' classes, named as the cards name them
    background: int | None = None  # segmentation: the background class (muted in the maps)
    ignore: int | None = None  # segmentation: the label of unlabelled pixels


@dataclass(frozen=True)
class Source:
    """Where a file's cards get their images and class names: ``load``, idx → (x, label)
    ((None, None) for an example that cannot be read; None: no images, ``note`` says why); the
    dataset's ``class_names`` (None: classes are numbered), its background class and the
    label of its unlabelled pixels (None: it has none)."""

    load: Callable | None = None
    note: str | None = None
    names: tuple | None = None
    background: int | None = None
    ignore: int | None = None

    def example(self, idx: int) -> tuple:
        return self.load(idx) if self.load is not None else (None, None)

    def name(self, c: int) -> str:
        """Class ``c`` as a card says it: ``Trouser (1)``, or ``1`` without names (or where the
        name is the number, as digits')."""
        if self.names is not None and 0 <= c < len(self.names) and self.names[c] != str(c):
            return f"{self.names[c]} ({c})"
        return str(c)


@dataclass(frozen=True)
class Card:
    """One example's ``<figure>`` and the radius it sorts by (-1: abstained or none)."""

    html: str
    radius: float


# --------------------------------------------------------------------------- images
def png_bytes(pixels: np.ndarray) -> bytes:
    """A PNG of ``pixels``: uint8 (H, W) grey, (H, W, 3) RGB or (H, W, 4) RGBA."""
    from PIL import Image

    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    if not (pixels.ndim == 2 or (pixels.ndim == 3 and pixels.shape[-1] in (3, 4))):
        raise SmoothcertError(f"cannot encode an image of shape {pixels.shape} as PNG")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def image_pixels(x) -> np.ndarray:
    """Pixels (C, H, W) in [0, 1] (a tensor or array) as uint8 (H, W) or (H, W, 3)."""
    x = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=np.float64)
    x = np.clip(np.nan_to_num(x, nan=0.0), 0.0, 1.0)
    x = np.rint(x * 255).astype(np.uint8)
    return x[0] if x.shape[0] == 1 else np.moveaxis(x[:3], 0, -1)


def class_rgb(c: int, background: int | None = None) -> tuple:
    """Class ``c``'s colour in the maps and their legend: the background class light grey,
    the others their palette colour."""
    return BACKGROUND_RGB if c == background else tuple(int(v) for v in PALETTE[c % len(PALETTE)])


def map_pixels(classes, hidden: int | None = None, grey: int | None = None,
               background: int | None = None) -> np.ndarray:
    """A class map (H, W) as RGBA: each class its colour (:func:`class_rgb`); ``hidden`` (an
    abstained pixel) transparent, so the page's hatching behind it shows; ``grey`` (an
    unlabelled pixel) dark grey."""
    classes = np.asarray(classes.cpu() if hasattr(classes, "cpu") else classes, dtype=np.int64)
    rgba = np.zeros((*classes.shape, 4), dtype=np.uint8)
    rgba[..., :3] = PALETTE[np.mod(classes, len(PALETTE))]
    rgba[..., 3] = 255
    if background is not None:
        rgba[classes == background, :3] = BACKGROUND_RGB
    if grey is not None:
        rgba[classes == grey, :3] = UNLABELLED_RGB
    if hidden is not None:
        rgba[classes == hidden, 3] = 0
    return rgba


def img_tag(pixels: np.ndarray, alt: str, css: str = "") -> str:
    cls = f' class="{css}"' if css else ""
    return (f'<img{cls} src="{data_uri(png_bytes(pixels))}" alt="{html.escape(alt)}" '
            f'width="{IMAGE_PX}">')


# --------------------------------------------------------------------------- examples
UNREADABLE = (SmoothcertError, OSError, RuntimeError, ValueError)
"""What loading a dataset or decoding one of its images may raise: the gallery goes on
without the image(s)."""


def example_loader(records: Records, data_root=None, cache: dict | None = None) -> Source:
    """The :class:`Source` of ``records``' cards: the dataset split its manifest names (its
    examples and class names), or the line that says why the images are missing. ``cache``
    keeps the splits loaded for the next file of the same one."""
    from ..data.datasets import load_dataset

    identity = (records.manifest or {}).get("identity") or {}
    name, split = identity.get("dataset"), identity.get("split")
    ignore = _ignore_index(records)
    if name is None or split is None:
        return Source(note=f"{records.name}: no images (the file has no manifest naming its "
                           "dataset split)")
    cache = {} if cache is None else cache
    try:
        if (name, split) not in cache:
            cache[name, split] = load_dataset(name, split, data_root=data_root, download=False)
        dataset = cache[name, split]
        size = len(dataset)
    except UNREADABLE as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        return Source(note=f"{records.name}: no images ({name} {split} could not be loaded: "
                           f"{reason}; give its folder with --data-root)", ignore=ignore)

    def load(idx: int):
        try:
            return dataset.example(int(idx)) if 0 <= idx < size else (None, None)
        except UNREADABLE:  # one damaged image costs its picture, not the report
            return None, None

    names = getattr(dataset, "class_names", None)
    names = tuple(str(n) for n in names) if names else None
    return Source(load, None, names, _background(dataset, names), ignore)


def _background(dataset, names: tuple | None) -> int | None:
    """The dataset's background class: its ``background_index``, else a class named
    ``background``, else none."""
    index = getattr(dataset, "background_index", None)
    if isinstance(index, int):
        return index
    return names.index("background") if names and "background" in names else None


def chosen_rows(records: Records, count: int) -> np.ndarray:
    """Row positions of ``count`` examples spread evenly over the file in idx order (all of
    them when it holds no more)."""
    order = np.argsort(records["idx"], kind="stable")
    if count >= len(order):
        return order
    return order[np.unique(np.linspace(0, len(order) - 1, count).round().astype(np.int64))]


def file_kind(records: Records) -> str:
    """``segmentation``, ``boxes`` (median smoothing) or ``classification``, by the file's
    columns, as :mod:`.dense` tells them."""
    from .dense import is_median_records, is_segment_records

    if is_segment_records(records):
        return "segmentation"
    return "boxes" if is_median_records(records) else "classification"


def vector(value) -> np.ndarray:
    """A vector column's cell (text ``1,2;3,4``, :func:`~smoothcert.certifiers.columns.
    format_vector`; or an array) as float64: 1-D or 2-D."""
    from ..certifiers.columns import parse_vector

    if isinstance(value, str):
        return parse_vector(value)
    return np.asarray(value, dtype=np.float64)


# --------------------------------------------------------------------------- cards
def card(records: Records, row: int, radius: float | None, abstain: bool, score: float,
         body: str, facts: list, extra: str = "") -> Card:
    """A ``<figure>`` with the sort/filter attributes, ``body`` and a caption of facts
    ((name, text) pairs); ``extra``: more CSS classes (``wrong``)."""
    idx = int(records["idx"][row])
    shown = -1.0 if abstain or radius is None else float(radius)
    cls = " ".join(["card", *(["abstain"] if abstain else []), *([extra] if extra else [])])
    badge = '<span class="badge">abstained</span>' if abstain else ""
    caption = "".join(f"<span><b>{html.escape(k)}</b> {html.escape(v)}</span>" for k, v in facts)
    return Card(f'<figure class="{cls}" data-idx="{idx}" data-radius="{shown:.6g}" '
                f'data-score="{score:.6g}">{badge}<div class="pics">{body}</div>'
                f"<figcaption><span><b>idx</b> {idx}</span>{caption}</figcaption></figure>",
                shown)


def classification_card(records: Records, row: int, example, eps: float | None = None,
                        source: Source | None = None) -> Card:
    """The input with label, prediction (named by ``source``) and radius; an abstention or a
    wrong one marked."""
    x, _ = example
    source = source or Source()
    label = int(records["label"][row]) if "label" in records else None
    predict = int(records["predict"][row]) if "predict" in records else None
    radius = float(records["radius"][row]) if "radius" in records else None
    abstain = predict == -1
    body = img_tag(image_pixels(x), "input") if x is not None else '<div class="noimg"></div>'
    facts = [("label", "–" if label is None else source.name(label)),
             ("predict", "abstain" if abstain else "–" if predict is None else
              source.name(predict)),
             ("radius", "–" if radius is None or abstain else f"{radius:.3f}")]
    wrong = label is not None and predict is not None and not abstain and predict != label
    if label is not None and predict is not None and not abstain:
        facts.append(("", "wrong" if wrong else "correct"))
    score = -1.0 if radius is None or abstain else radius
    return card(records, row, radius, abstain, score, body, facts, "wrong" if wrong else "")


def segmentation_card(records: Records, row: int, example, eps: float | None = None,
                      source: Source | None = None) -> Card:
    """The input, its certified map (abstained pixels see-through onto hatching) and, where the
    dataset has it, its label map; the image's certified pixel accuracy and abstention rate.
    ``source``: the dataset's background class and unlabelled pixels' label (default: the
    latter from the manifest's dataset)."""
    x, label = example
    source = source or Source(ignore=_ignore_index(records))
    pics = [("input", img_tag(image_pixels(x), "input"))] if x is not None else []
    certified, why = _certified_map(records, row)
    if certified is not None:
        pics.append(("certified", img_tag(map_pixels(certified, hidden=ABSTAINED,
                                                     background=source.background),
                                          "certified map", "map")))
    if label is not None and np.ndim(label) == 2:
        pics.append(("label", img_tag(map_pixels(label, grey=source.ignore,
                                                 background=source.background), "labels")))
    body = "".join(f'<div class="pic">{tag}<small>{name}</small></div>' for name, tag in pics) \
        or '<div class="noimg"></div>'
    accuracy, rate = float(records["pixel_accuracy"][row]), float(records["abstain_rate"][row])
    abstain = rate >= 1.0
    radius = float(records["radius"][row]) if "radius" in records else None
    facts = [("pixel acc", f"{100 * accuracy:.1f}%"), ("abstain", f"{100 * rate:.1f}%"),
             ("radius", "–" if radius is None else f"{radius:.3f}")]
    if why is not None:
        facts.append(("map", why))
    return card(records, row, radius, abstain, accuracy, body, facts)


def _ignore_index(records: Records) -> int | None:
    """The label of unlabelled pixels in the dataset the file's manifest names."""
    from ..data.registry import dataset_spec

    name = ((records.manifest or {}).get("identity") or {}).get("dataset")
    try:
        return dataset_spec(name).ignore_index if name is not None else None
    except SmoothcertError:
        return None


def _certified_map(records: Records, row: int):
    """The row's certified map (uint8 (H, W), 255 = abstained) and None, or None and why not."""
    from ..runs import artifacts

    if "map_sha256" not in records:
        return None, "none recorded"
    idx, sha = int(records["idx"][row]), str(records["map_sha256"][row])
    try:
        return np.asarray(artifacts.read_artifact(records.path, "map", idx, sha)), None
    except SmoothcertError as e:
        return None, str(e).splitlines()[0]


def box_card(records: Records, row: int, example, eps: float | None,
             source: Source | None = None) -> Card:
    """The input with the target box, the median box and, at the chosen ε, the certified
    envelope (boxes: :data:`BOX_ORDER`). The card's radius is the largest ε of the grid at
    which every output's interval is finite (abstention: none is); its score, the IoU of the
    median box with the target."""
    x, _ = example
    grid = vector(records["eps"][row]).reshape(-1)
    lower = vector(records["lower"][row]).reshape(len(grid), -1)
    upper = vector(records["upper"][row]).reshape(len(grid), -1)
    finite = np.isfinite(lower).all(axis=1) & np.isfinite(upper).all(axis=1)
    radius = float(grid[finite].max()) if finite.any() else None
    k = eps_index(grid, finite, eps)
    target, median = vector(records["target"][row]), vector(records["median"][row])
    is_box = len(median) == 4 and len(target) == 4
    facts = [*([("box", f"({BOX_SHORT})")] if is_box else []),
             ("target", _numbers(target, is_box)), ("median", _numbers(median, is_box)),
             ("ε", f"{grid[k]:g}"), ("certified to ε", "–" if radius is None else f"{radius:g}"),
             ("widest interval", f"{np.max(upper[k] - lower[k]):.3g}")]
    if not is_box:
        body = img_tag(image_pixels(x), "input") if x is not None else ""
        facts.append(("outputs", f"{len(median)} (not a box: no drawing)"))
        return card(records, row, radius, radius is None, -1.0 if radius is None else radius,
                    body, facts)
    inner = (upper[k, 0], upper[k, 1], lower[k, 2], lower[k, 3])
    body = box_svg(x, {"outer": (lower[k, 0], lower[k, 1], upper[k, 2], upper[k, 3]),
                       "inner": inner, "target": tuple(target), "median": tuple(median)})
    if not (inner[0] < inner[2] and inner[1] < inner[3]):
        facts.append(("inner box", "empty"))
    return card(records, row, radius, radius is None, box_iou(median, target), body, facts)


def _numbers(values: np.ndarray, pixels: bool = False) -> str:
    """Outputs as a card says them: a box's in pixels to one decimal, others to 3 digits."""
    # + 0.0 turns −0.0 (a value rounded up to 0 from below) into 0.0
    return ", ".join(f"{round(v, 1) + 0.0:.1f}" if pixels else f"{v:.3g}"
                     for v in np.ravel(values))


def box_iou(a, b) -> float:
    """The intersection over union of two boxes (:data:`BOX_ORDER`); 0 for empty ones."""
    (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = (np.asarray(v, np.float64) for v in (a, b))
    inter = max(0.0, min(ax1, bx1) - max(ax0, bx0)) * max(0.0, min(ay1, by1) - max(ay0, by0))
    union = max(0.0, ax1 - ax0) * max(0.0, ay1 - ay0) + \
        max(0.0, bx1 - bx0) * max(0.0, by1 - by0) - inter
    return float(inter / union) if union > 0 and np.isfinite(union) else 0.0


def eps_index(grid: np.ndarray, finite: np.ndarray, eps: float | None) -> int:
    """The grid position of ``eps`` (refused when not in the grid), or by default the largest ε
    with every interval finite (the smallest ε when there is none)."""
    if eps is None:
        return int(np.flatnonzero(finite)[-1]) if finite.any() else int(np.argmin(grid))
    hit = np.flatnonzero(np.isclose(grid, eps, rtol=1e-9, atol=1e-12))
    if not len(hit):
        raise SmoothcertError(f"--gallery-eps {eps:g} is not in the file's ε grid "
                              f"({', '.join(f'{g:g}' for g in grid)}); pick one of those")
    return int(hit[0])


def box_svg(x, boxes: dict) -> str:
    """An SVG of the image (W × H user units, one per pixel) in a margin of
    :data:`BOX_MARGIN`, with ``boxes`` (class name → (x_min, y_min, x_max, y_max)) on top and,
    where they hold ``outer`` and ``inner``, the band between them filled (the certified
    envelope); sides clipped to the margin's edge (an infinite one reaches it), empty boxes
    left out."""
    if x is not None:
        h, w = int(x.shape[-2]), int(x.shape[-1])
    else:  # no image: a canvas that holds every finite corner
        corners = np.array([v for box in boxes.values() for v in box], dtype=np.float64)
        w = h = max(1, math.ceil(float(np.max(corners[np.isfinite(corners)], initial=1.0))))
    m = BOX_MARGIN * max(w, h)
    parts = [f'<svg class="boxes" viewBox="{-m:g} {-m:g} {w + 2 * m:g} {h + 2 * m:g}" '
             f'width="{BOX_PX}" height="{round(BOX_PX * (h + 2 * m) / (w + 2 * m))}">']
    if x is not None:
        parts.append(f'<image href="{data_uri(png_bytes(image_pixels(x)))}" x="0" y="0" '
                     f'width="{w}" height="{h}" preserveAspectRatio="none"/>')
    clipped = {name: tuple(float(np.clip(v, -m, side + m)) for v, side in zip(box, (w, h, w, h)))
               for name, box in boxes.items()}
    drawn = {name: box for name, box in clipped.items() if box[2] > box[0] and box[3] > box[1]}
    if "outer" in drawn:  # even-odd fill: the outer box less the inner one
        rings = [drawn[n] for n in ("outer", "inner") if n in drawn]
        path = " ".join(f"M{x0:.3f} {y0:.3f}H{x1:.3f}V{y1:.3f}H{x0:.3f}Z"
                        for x0, y0, x1, y1 in rings)
        parts.append(f'<path class="envelope" fill-rule="evenodd" d="{path}"/>')
    for name, (x0, y0, x1, y1) in drawn.items():
        parts.append(f'<rect class="{name}" x="{x0:.3f}" y="{y0:.3f}" '
                     f'width="{x1 - x0:.3f}" height="{y1 - y0:.3f}"/>')
    return "".join(parts) + "</svg>"


# --------------------------------------------------------------------------- files
def file_gallery(records: Records, count: int, data_root=None, eps: float | None = None,
                 cache: dict | None = None) -> Gallery:
    """The cards of ``count`` examples of ``records`` spread over the file (see
    :func:`chosen_rows`), with their images and class names where the dataset loads
    (``cache``: the splits loaded so far, :func:`example_loader`)."""
    kind = file_kind(records)
    rows = chosen_rows(records, count)
    source = example_loader(records, data_root, cache) if len(rows) else Source()
    cards = tuple(CARDS[kind](records, row, source.example(int(records["idx"][row])), eps,
                              source=source) for row in rows)
    if kind != "segmentation":
        return Gallery(records.name, kind, cards, source.note)
    classes = (records.manifest or {}).get("num_classes")
    names = source.names or tuple(f"class {c}" for c in range(
        classes if isinstance(classes, int) else 0))
    return Gallery(records.name, kind, cards, source.note, names, source.background,
                   source.ignore)


CARDS = {"classification": classification_card, "segmentation": segmentation_card,
         "boxes": box_card}
"""A file's kind (:func:`file_kind`) → the card of one of its rows."""
