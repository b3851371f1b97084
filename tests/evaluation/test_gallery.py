"""The HTML report's gallery read at a glance (issue 45): class names from the dataset (escaped:
they are user data) in cards and the maps' legend, the background class muted and unlabelled
pixels in the legend, the radius controls left out where they could not tell cards apart, box
cards with a filled certified envelope, their coordinate order and one width, and an address
(``#sort=...``) that cannot break the controls: the script's text, and the page in Debian's
headless chromium (skipped without)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch
from test_html import (
    CHROMIUM,
    CLS_COLUMNS,
    CLS_ROWS,
    MAPS,
    MEDIAN_COLUMNS,
    SEG_COLUMNS,
    SEG_RADIUS,
    Page,
    _median_row,
    chromium,
    page_of,
    png_of,
    write_records,
)

from smoothcert.evaluation.gallery import (
    BACKGROUND_RGB,
    BOX_ORDER,
    BOX_PX,
    PALETTE,
    UNLABELLED_RGB,
    box_iou,
)
from smoothcert.evaluation.html import SCRIPT, STYLE
from smoothcert.runs.artifacts import save_artifacts

NAMES = ("background", "<b>cat</b>", 'dog & "co"') + tuple(f"c{c}" for c in range(3, 10))


@dataclass
class Named:
    """A dataset split as the gallery reads one (``len``, ``example``) that names its classes,
    standing in for the file's dataset through the gallery's cache of loaded splits."""

    labels: torch.Tensor  # (N,) classes or (N, H, W) pixel classes
    class_names: tuple = NAMES
    background_index: int | None = None

    def __len__(self):
        return len(self.labels)

    def example(self, idx):
        label = self.labels[idx]
        return torch.full((1, 8, 8), 0.5), int(label) if label.dim() == 0 else label


@pytest.fixture
def serve(monkeypatch):
    """``serve(split)``: the gallery's dataset loader returns ``split`` (whatever the file's
    manifest names)."""
    def install(split: Named):
        monkeypatch.setattr("smoothcert.data.datasets.load_dataset",
                            lambda name, which, **kwargs: split)
    return install


# --------------------------------------------------------------------------- class names
def test_cards_name_the_classes_escaped(tmp_path, serve):
    path = write_records(tmp_path / "cls.tsv", CLS_COLUMNS, CLS_ROWS, "certify")
    labels = torch.tensor([row[1] for row in CLS_ROWS])
    serve(Named(labels))
    text = page_of(tmp_path, [path])[0]
    assert "<b>label</b> &lt;b&gt;cat&lt;/b&gt; (1)</span>" in text  # idx 1: label 1
    assert "<b>predict</b> dog &amp; &quot;co&quot; (2)</span>" in text  # idx 2
    assert "<b>cat</b>" not in text and '"co"' not in text  # never raw
    assert "<b>predict</b> background (0)</span>" in text  # idx 9, a wrong one
    # names that are the numbers (digits' "0".."9") say each once
    serve(Named(labels, tuple(str(c) for c in range(10))))
    text = page_of(tmp_path, [path])[0]
    assert "<b>label</b> 1</span>" in text and "<b>label</b> 1 (1)" not in text


# --------------------------------------------------------------------------- segmentation
@pytest.fixture
def seg_named(tmp_path):
    """A fashion-mnist-seg file (ignore index 255) of two 8×8 maps, and its split: labels with
    the background (0), class 2 and unlabelled pixels."""
    path = tmp_path / "seg.tsv"
    rows = []
    for idx in (0, 1):
        sha = save_artifacts(path, idx, {"map": MAPS[idx]})["map_sha256"]
        rows.append((idx, 64, 40, 32, 24, 0.5, 24 / 64, "0,27,5", "0,3,2", "0,22,10", 0.75,
                     SEG_RADIUS, 10, 100, 0.001, "holm", 0.25, sha, 0.1, 0))
    write_records(path, SEG_COLUMNS, rows, "segment", dataset="fashion-mnist-seg",
                  num_classes=3)
    labels = torch.zeros(2, 8, 8, dtype=torch.int64)
    labels[:, 2:6, 2:6], labels[:, 0] = 2, 255
    return path, Named(labels, NAMES[:3], background_index=0)


def _legend(text: str) -> str:
    return re.search(r'<p class="legend">(.*?)</p>', text)[1]


def test_segmentation_legend_names_classes_mutes_the_background_and_shows_unlabelled(
        tmp_path, seg_named, serve):
    path, split = seg_named
    serve(split)
    text, page = page_of(tmp_path, [path])
    legend = _legend(text)
    swatches = re.findall(r'<i class="swatch" data-class="(\d)" style="background:rgb\(([\d, ]+)'
                          r'\)"></i>([^<]*)</span>', legend)
    assert [(int(c), name) for c, _, name in swatches] == [
        (0, "background"), (1, "&lt;b&gt;cat&lt;/b&gt;"), (2, "dog &amp; &quot;co&quot;")]
    colours = [tuple(int(v) for v in rgb.split(",")) for _, rgb, _ in swatches]
    assert colours == [BACKGROUND_RGB, tuple(PALETTE[1]), tuple(PALETTE[2])]
    unlabelled = re.search(r'<i class="swatch unlabelled" style="background:rgb\(([\d, ]+)\)">'
                           r"</i>([^<]*)</span>", legend)
    assert tuple(int(v) for v in unlabelled[1].split(",")) == UNLABELLED_RGB
    assert unlabelled[2] == "unlabelled pixel (label 255)"
    # the label map draws them so: background muted, unlabelled dark grey, class 2 its colour
    labels = png_of(next(a for a in page.find("img") if a["alt"] == "labels")["src"])
    assert (labels[1, 0, :3] == BACKGROUND_RGB).all() and (labels[0, :, :3] == UNLABELLED_RGB).all()
    assert (labels[2:6, 2:6, :3] == PALETTE[2]).all()


def test_a_dataset_without_names_numbers_the_classes(tmp_path, seg_named, serve):
    path, split = seg_named
    serve(Named(split.labels, None))
    legend = _legend(page_of(tmp_path, [path])[0])
    assert re.findall(r'data-class="\d" style="[^"]*"></i>([^<]*)<', legend) == [
        "class 0", "class 1", "class 2"]
    assert "rgb(205, 205, 198)" not in legend  # no background class: none is muted


# --------------------------------------------------------------------------- the controls
def _controls(text: str) -> tuple[list, bool]:
    page = Page(text)
    sorts = [a["value"] for a in page.find("option")]
    return sorts, any(a.get("id") == "min-radius" for a in page.find("input"))


def test_radius_controls_only_where_the_cards_radii_differ(tmp_path, seg_named):
    cls = write_records(tmp_path / "cls.tsv", CLS_COLUMNS, CLS_ROWS, "certify")
    assert _controls(page_of(tmp_path, [cls])[0]) == (
        ["radius:desc", "radius:asc", "score:desc", "idx:asc"], True)
    # one radius per run (segmentation), one certified ε for every box, or none (PREDICT)
    boxes = write_records(tmp_path / "boxes.tsv", MEDIAN_COLUMNS, [
        _median_row(i, "1,0.5,5.5,6;0.5,0,5,5.5", "2,1.5,6.5,7;2.5,2,7,7.5") for i in range(3)],
        "median", num_classes=4)
    predict = tmp_path / "predict.tsv"
    predict.write_text("idx\tlabel\tpredict\tcorrect\ttime\n0\t1\t1\t1\t0.1\n1\t2\t-1\t0\t0.1\n")
    for files, said in (([seg_named[0]], f"radius {SEG_RADIUS:.3f} on every card"),
                        ([boxes], "radius 0.500 on every card"), ([predict], None)):
        text = page_of(tmp_path, files)[0]
        assert _controls(text) == (["score:desc", "idx:asc"], False), files
        assert 'id="min-radius-value"' not in text
        assert (said in text) if said else 'class="fixed"' not in text
    # a page whose cards differ keeps them for all its files
    assert _controls(page_of(tmp_path, [seg_named[0], cls])[0])[1]


# --------------------------------------------------------------------------- boxes
def _box_row(idx: int, median: str) -> tuple:
    """A box at ε 0.1 and 0.5, target (1, 1, 6, 6), with the given median."""
    row = _median_row(idx, "1,0.5,5.5,6;0.5,0,5,5.5", "2,1.5,6.5,7;2.5,2,7,7.5")
    return (*row[:2], median, *row[3:])


def test_box_cards_fill_the_envelope_and_say_the_coordinate_order(tmp_path):
    boxes = write_records(tmp_path / "boxes.tsv", MEDIAN_COLUMNS, [
        _box_row(0, "1.5,1,6,6.5"), _box_row(1, "1.5,-0.04,6,6.5")], "median", num_classes=4)
    text, page = page_of(tmp_path, [boxes])
    svgs = re.findall(r'<svg class="boxes".*?</svg>', text)
    # ε = 0.5: outer (0.5, 0, 7, 7.5) less inner (2.5, 2, 5, 5.5), filled even-odd, under the
    # boxes' outlines
    (path,) = re.findall(r'<path class="envelope" fill-rule="evenodd" d="([^"]+)"/>', svgs[0])
    assert path == ("M0.500 0.000H7.000V7.500H0.500Z M2.500 2.000H5.000V5.500H2.500Z")
    assert svgs[0].index("<path") < svgs[0].index("<rect")
    assert re.search(r"path\.envelope[^{]*\{fill:rgba\(", STYLE)
    assert all(f'width="{BOX_PX}"' in s.split(">")[0] for s in svgs)  # one drawing width
    assert re.search(r"figcaption\{[^}]*width:0;[^}]*min-width:100%", STYLE)  # captions fit it
    assert text.count("<b>box</b> (x0, y0, x1, y1)</span>") == 2
    assert f"boxes: (x0, y0, x1, y1) = ({BOX_ORDER}), in pixels" in _legend(text)
    assert '<i class="swatch envelope"' in _legend(text)
    # one decimal of a pixel, −0.04 said 0.0 (not "-0.0")
    assert "<b>median</b> 1.5, 1.0, 6.0, 6.5</span>" in text
    assert "<b>median</b> 1.5, 0.0, 6.0, 6.5</span>" in text and "median</b> 1.5, -0" not in text
    # the score: the median box's IoU with the target (intersection 4.5 × 5)
    ious = [22.5 / (25 + 4.5 * 5.5 - 22.5), 22.5 / (25 + 4.5 * 6.54 - 22.5)]
    assert [float(c["data-score"]) for c in page.find("figure", "card")] == pytest.approx(
        ious, abs=1e-5)


def test_box_iou():
    assert box_iou((0, 0, 2, 2), (1, 0, 3, 2)) == pytest.approx(1 / 3)
    assert box_iou((0, 0, 1, 1), (2, 2, 3, 3)) == 0.0
    assert box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0  # empty boxes: no union
    assert box_iou((0, 0, 1, 1), (0, 0, 1, 1)) == 1.0


# --------------------------------------------------------------------------- the address
def test_the_script_checks_the_address_against_the_controls():
    """The address is anyone's text: it must never reach a CSS selector (``#sort=%22`` made
    ``querySelector`` throw and killed the controls), a malformed escape must not throw, and a
    value counts only where it is one of the controls' own."""
    calls = re.findall(r"querySelector(?:All)?\(([^)]*)\)", SCRIPT)
    assert calls and all(re.fullmatch(r'"[^"+]*"', arg.strip()) for arg in calls), calls
    assert re.search(r"try \{ return decodeURIComponent\(\w+\); \} catch", SCRIPT)
    assert SCRIPT.count("decodeURIComponent") == 1
    assert "sorts.indexOf(v) >= 0" in SCRIPT  # the select's own option values
    assert "inRange(v)" in SCRIPT and 'v === "0" || v === "1"' in SCRIPT


DRIVE = """<script>
(function () {  // after the page's script: use the controls as a reader would
  var root = document.documentElement, sort = document.getElementById("sort");
  function order() {
    return Array.prototype.map.call(document.querySelectorAll("section[data-kind=classification]"
      + " .card"), function (c) { return c.getAttribute("data-idx"); }).join(",");
  }
  root.setAttribute("data-start", order());
  sort.value = "idx:asc"; sort.dispatchEvent(new Event("input"));
  root.setAttribute("data-by-idx", order());
  var slider = document.getElementById("min-radius");
  slider.value = "0.45"; slider.dispatchEvent(new Event("input"));
  root.setAttribute("data-after-min", document.getElementById("shown").getAttribute("data-shown"));
  root.setAttribute("data-box-widths", Array.prototype.map.call(document.querySelectorAll(
    "section[data-kind=boxes] .card"), function (c) { return c.offsetWidth; }).join(","));
})();
</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get "
                                             "install chromium; .ci/run does when it can)")
def test_a_hostile_address_leaves_the_controls_working(tmp_path):
    cls = write_records(tmp_path / "cls.tsv", CLS_COLUMNS, CLS_ROWS, "certify")
    boxes = write_records(tmp_path / "boxes.tsv", MEDIAN_COLUMNS, [  # captions' lengths differ
        _box_row(0, "1,1,6,6"), _box_row(1, "1.23456,1.23456,6.23456,6.23456")], "median",
        num_classes=4)
    page = tmp_path / "page.html"
    page.write_text(page_of(tmp_path, [cls, boxes])[0].replace("</body>", DRIVE))
    by_radius = "9,8,6,5,4,2,1,0,3,7"  # largest first, abstentions (3, 7) last
    for fragment, start in (("", by_radius), ("#sort=%22", by_radius), ("#sort=%", by_radius),
                            ("#sort=%27%5D%22&min=abc&hide=2", by_radius),
                            ("#min=99&sort=radius:asc", "3,7,0,1,2,4,5,6,8,9"),
                            ("#sort=idx:asc&min=0.45&hide=1", "0,1,2,3,4,5,6,7,8,9")):
        dom, log = chromium(page, tmp_path / "profile", fragment)
        root = dict(Page(dom).find("html")[0])
        assert root.get("data-ready") == "1" and "data-errors" not in root, (fragment, root)
        assert ":CONSOLE" not in log, fragment
        assert root["data-start"] == start, fragment
        assert root["data-by-idx"] == "0,1,2,3,4,5,6,7,8,9"  # the select still sorts
        assert root["data-after-min"] == "6"  # radius 0.5, 0.6, 0.8, 0.9; two boxes (ε 0.5)
        widths = root["data-box-widths"].split(",")
        assert len(widths) == 2 and len(set(widths)) == 1, widths  # box cards of one width
