"""The HTML report: a self-contained page (tables, curves, gallery) from record files written
with the records API, its gallery's cards for classification, segmentation and median files,
the CLI's flags, and the page in a real headless browser (Debian's chromium; skipped without)."""

from __future__ import annotations

import base64
import dataclasses
import io
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.stats import norm

from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.gallery import PALETTE
from smoothcert.evaluation.html import html_report
from smoothcert.evaluation.report import report
from smoothcert.runs.artifacts import save_artifacts
from smoothcert.runs.records import open_records, read_records

IDENTITY = {"split": "test", "seed": 0, "alpha": 0.001, "sigma": 0.25}
CLS_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time", "n0", "n", "alpha",
               "sigma", "seed")
# 10 examples of digits' test split; every 4th abstains (idx 3, 7), the rest certify at 0.1·idx,
# idx 9 a wrong class
CLS_ROWS = [(i, i % 10, -1 if i % 4 == 3 else 0 if i == 9 else i % 10,
             0.0 if i % 4 == 3 else 0.1 * i, int(i % 4 != 3 and i != 9), 0.01, 10, 100, 0.001,
             0.25, 0) for i in range(10)]
SEG_COLUMNS = ("idx", "labelled", "certified", "certified_correct", "abstained",
               "pixel_accuracy", "abstain_rate", "tp", "fp", "fn", "tau", "radius", "n0", "n",
               "alpha", "correction", "sigma", "map_sha256", "time", "seed")
MEDIAN_COLUMNS = ("idx", "target", "median", "eps", "lower", "upper", "percentile", "n",
                  "alpha", "sigma", "time", "seed")


def write_records(path, columns, rows, certifier, dataset="digits", num_classes=10):
    """A record file and manifest as a run writes them (records API), naming ``dataset``."""
    manifest = {"identity": {"certifier": certifier, "dataset": dataset, **IDENTITY},
                "num_classes": num_classes}
    writer, _ = open_records(path, columns, manifest)
    with writer:
        for row in rows:
            writer.write(dict(zip(columns, row)))
    return path


@pytest.fixture(scope="module")
def cls_file(tmp_path_factory):
    return write_records(tmp_path_factory.mktemp("cls") / "cls.tsv", CLS_COLUMNS, CLS_ROWS,
                         "certify")


# 8×8 certified maps of two digits images: classes 0..2, 255 abstained
MAPS = {0: np.full((8, 8), 1, np.uint8), 1: np.full((8, 8), 255, np.uint8)}
MAPS[0][:, :3] = 255  # 24 of 64 pixels abstain
MAPS[0][0, 3:] = 2


SEG_RADIUS = 0.25 * norm.ppf(0.75)  # σΦ⁻¹(τ)


@pytest.fixture(scope="module")
def seg_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("seg") / "seg.tsv"
    rows = []
    # per class c: tp_c + fn_c = the pixels labelled c (49 and 15); Σ tp = certified_correct
    for idx, (acc, rate, tp, fp, fn) in {0: (0.5, 24 / 64, "0,27,5", "0,3,2", "0,22,10"),
                                         1: (0.0, 1.0, "0,0,0", "0,0,0", "0,49,15")}.items():
        sha = save_artifacts(path, idx, {"map": MAPS[idx]})["map_sha256"]
        rows.append((idx, 64, 64 - int(rate * 64), int(acc * 64), int(rate * 64), acc, rate,
                     tp, fp, fn, 0.75, SEG_RADIUS, 10, 100, 0.001, "holm", 0.25, sha, 0.1, 0))
    return write_records(path, SEG_COLUMNS, rows, "segment", num_classes=3)


# 3 inputs, ε grid (0.1, 0.5): idx 0 finite at both, idx 1 at 0.1 only, idx 2 at none
def _median_row(idx, lower, upper):
    return (idx, "1,1,6,6", "1.5,1,6,6.5", "0.1,0.5", lower, upper, 0.5, 100, 0.001, 0.25,
            0.1, 0)


MEDIAN_ROWS = [
    _median_row(0, "1,0.5,5.5,6;0.5,0,5,5.5", "2,1.5,6.5,7;2.5,2,7,7.5"),
    _median_row(1, "1,0.5,5.5,6;-inf,0,5,5.5", "2,1.5,6.5,7;2.5,2,inf,7.5"),
    _median_row(2, "-inf,0.5,5.5,6;-inf,0,5,5.5", "2,1.5,6.5,7;2.5,2,inf,7.5"),
]


@pytest.fixture(scope="module")
def median_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("median") / "boxes.tsv"
    return write_records(path, MEDIAN_COLUMNS, MEDIAN_ROWS, "median", num_classes=4)


class Page(HTMLParser):
    """Every start tag's (name, attributes) of a page."""

    def __init__(self, text):
        super().__init__()
        self.tags = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def find(self, tag, css=None):
        return [a for t, a in self.tags
                if t == tag and (css is None or css in (a.get("class") or "").split())]


def fetched(text: str) -> list:
    """What a page would load from elsewhere: each src or href that is not inlined (``data:``)
    or in the page (``#...``), and each CSS ``url(...)`` that is not a ``data:`` URI."""
    found = [value for _, attrs in Page(text).tags for name, value in attrs.items()
             if name in ("src", "href") and not (value or "").startswith(("data:", "#"))]
    return found + re.findall(r"url\(\s*['\"]?(?!data:)([^'\")]+)", text)


def png_of(uri: str) -> np.ndarray:
    assert uri.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))))


def page_of(tmp_path, files, **kwargs) -> tuple[str, Page]:
    out = html_report(files, "0:1:0.25", tmp_path / "report.html", **kwargs)
    text = out.read_text(encoding="utf-8")
    return text, Page(text)


# --------------------------------------------------------------------------- the page
def test_the_page_loads_nothing_and_holds_the_reports_table(tmp_path, cls_file):
    text, page = page_of(tmp_path, [cls_file])
    assert fetched(text) == []
    # the control: the same check finds what a page would fetch
    assert len(fetched('<img src="https://e.org/a.png"><link href="s.css"><script src="j.js">'
                       '</script><p style="background:url(//e.org/b.png)">')) == 4
    assert report([cls_file], "0:1:0.25", fmt="html") in text  # the table report prints
    (curves,) = page.find("img", "curves")
    assert png_of(curves["src"]).std() > 0  # the curves, a real (non-blank) PNG


def test_each_kind_of_file_gets_reports_table_on_one_page(tmp_path, cls_file, seg_file,
                                                         median_file):
    text = page_of(tmp_path, [median_file, cls_file, seg_file])[0]
    tables = [report([f], "0:1:0.25", fmt="html") for f in (cls_file, seg_file, median_file)]
    assert all(t in text for t in tables)
    assert [text.index(t) for t in tables] == sorted(text.index(t) for t in tables)
    kinds = re.findall(r'data-kind="(\w+)"', text)  # the gallery in the files' order
    assert kinds == ["boxes", "classification", "segmentation"]


def test_the_gallery_has_the_asked_number_of_cards_spread_over_the_file(tmp_path, cls_file):
    page = page_of(tmp_path, [cls_file], gallery=4)[1]
    assert [int(c["data-idx"]) for c in page.find("figure", "card")] == [0, 3, 6, 9]
    assert len(page_of(tmp_path, [cls_file], gallery=50)[1].find("figure", "card")) == 10
    text, page = page_of(tmp_path, [cls_file], gallery=0)
    assert not page.find("figure") and 'id="gallery"' not in text


def test_cards_carry_radius_and_mark_abstentions(tmp_path, cls_file):
    text, page = page_of(tmp_path, [cls_file])
    cards = {int(c["data-idx"]): c for c in page.find("figure", "card")}
    for idx, _, predict, radius, *_ in CLS_ROWS:
        abstain = predict == -1
        assert ("abstain" in cards[idx]["class"].split()) == abstain
        assert float(cards[idx]["data-radius"]) == pytest.approx(-1.0 if abstain else radius,
                                                                 abs=1e-6)
    assert text.count('<span class="badge">abstained</span>') == 2
    assert [i for i, c in cards.items() if "wrong" in c["class"].split()] == [9]
    images = page.find("img", None)[1:]  # the inputs, after the curves
    assert len(images) == 10 and png_of(images[0]["src"]).shape == (8, 8)
    (slider,) = [a for a in page.find("input") if a.get("id") == "min-radius"]
    assert float(slider["max"]) == pytest.approx(0.9)  # the largest radius of the cards


def test_a_dataset_that_cannot_be_loaded_is_one_line_and_the_page_is_written(tmp_path):
    path = write_records(tmp_path / "x.tsv", CLS_COLUMNS, CLS_ROWS[:3], "certify",
                         dataset="fashion-mnist")
    text, page = page_of(tmp_path, [path], data_root=tmp_path / "missing")
    (note,) = re.findall(r'<p class="note">([^<]*)</p>', text)
    assert "fashion-mnist test could not be loaded" in note and "--data-root" in note
    assert len(page.find("figure", "card")) == 3 and not page.find("img", None)[1:]


def test_a_file_without_manifest_gets_cards_without_images(tmp_path):
    path = tmp_path / "cohen.tsv"
    path.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t0.1\n")
    text, page = page_of(tmp_path, [path])
    assert "no manifest" in text and len(page.find("figure", "card")) == 1


# --------------------------------------------------------------------------- segmentation
def test_segmentation_cards_show_the_certified_map_with_abstained_pixels_see_through(
        tmp_path, seg_file):
    text, page = page_of(tmp_path, [seg_file])
    cards = page.find("figure", "card")
    assert [c["data-idx"] for c in cards] == ["0", "1"]
    assert ["abstain" in c["class"] for c in cards] == [False, True]  # every pixel abstains
    maps = [png_of(a["src"]) for a in page.find("img", "map")]
    for shown, certified in zip(maps, MAPS.values()):
        assert shown.shape == (8, 8, 4)
        assert np.array_equal(shown[..., 3] == 0, certified == 255)  # abstained: transparent
        kept = certified != 255
        assert np.array_equal(shown[kept][:, :3], PALETTE[certified[kept]])
    assert "<b>pixel acc</b> 50.0%" in text and "<b>abstain</b> 37.5%" in text


def test_a_missing_map_is_said_on_its_card(tmp_path, seg_file):
    folder = tmp_path / "copy"
    folder.mkdir()
    for suffix in ("", ".manifest.json"):
        shutil.copy(f"{seg_file}{suffix}", folder / f"seg.tsv{suffix}")
    text, page = page_of(tmp_path, [folder / "seg.tsv"])
    assert not page.find("img", "map") and text.count("cannot read the map") == 2


# --------------------------------------------------------------------------- boxes
def _rects(svg_text: str) -> dict:
    return {m[0]: tuple(float(v) for v in m[1:]) for m in re.findall(
        r'<rect class="(\w+)" x="([-\d.]+)" y="([-\d.]+)" width="([\d.]+)" height="([\d.]+)"',
        svg_text)}


def test_box_cards_draw_target_median_and_the_certified_envelope(tmp_path, median_file):
    text, page = page_of(tmp_path, [median_file])
    cards = {int(c["data-idx"]): c for c in page.find("figure", "card")}
    assert [float(cards[i]["data-radius"]) for i in range(3)] == [0.5, 0.1, -1.0]
    assert "abstain" in cards[2]["class"]
    svgs = re.findall(r"<svg class=\"boxes\".*?</svg>", text)
    assert len(svgs) == 3 and all('<image href="data:image/png;base64,' in s for s in svgs)
    rects = _rects(svgs[0])  # idx 0 at ε = 0.5: the largest with every interval finite
    assert rects["target"] == (1, 1, 5, 5) and rects["median"] == (1.5, 1, 4.5, 5.5)
    assert rects["outer"] == (0.5, 0, 6.5, 7.5)  # lower x0, y0; upper x1, y1
    assert rects["inner"] == (2.5, 2, 2.5, 3.5)  # upper x0, y0; lower x1, y1
    text = page_of(tmp_path, [median_file], eps=0.5)[0]
    clipped = _rects(re.findall(r"<svg class=\"boxes\".*?</svg>", text)[1])
    # idx 1: −inf and inf reach the drawing's edge, its margin 0.8 (a tenth of 8) past the
    # image's: x from −0.8, width 8 + 2 · 0.8
    assert clipped["outer"] == (-0.8, 0, 9.6, 7.5)


def test_box_gallery_refuses_an_eps_outside_the_grid(tmp_path, median_file, cls_file):
    with pytest.raises(SmoothcertError, match=r"--gallery-eps 0.3 is not in .* \(0.1, 0.5\)"):
        page_of(tmp_path, [median_file], eps=0.3)
    with pytest.raises(SmoothcertError, match="no file is one; drop it"):
        page_of(tmp_path, [cls_file], eps=0.1)
    assert not (tmp_path / "report.html").exists()


# --------------------------------------------------------------------------- CLI
def test_cli_writes_the_page_and_refuses_what_does_not_fit(tmp_path, cls_file, capsys):
    from smoothcert.cli import main

    out = tmp_path / "r.html"
    assert main(["report", str(cls_file), "--format", "html", "--out", str(out),
                 "--gallery", "3"]) == 0
    assert out.read_text().count('<figure class="card') == 3
    assert capsys.readouterr().err.strip().endswith(f"report: {out}")
    for argv, message in (
            (["--format", "html"], "give its file with --out"),
            (["--gallery", "3"], "--gallery is for the page of --format html"),
            (["--format", "html", "--out", str(cls_file)], "--out"),
            (["--format", "html", "--out", str(out), "--agreement"], "does not apply")):
        assert main(["report", str(cls_file), *argv]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert message in line


# --------------------------------------------------------------------------- browser
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium"
                                        if Path("/usr/bin/chromium").exists() else None)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--enable-logging=stderr", "--v=0",
         "--window-size=1280,2000")


def chromium(page: Path, profile: Path, fragment: str = "", screenshot: Path | None = None):
    """The DOM after the page's scripts ran, and chromium's log (console messages included)."""
    shot = [f"--screenshot={screenshot}"] if screenshot is not None else []
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", *shot,
                           page.resolve().as_uri() + fragment],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get "
                                             "install chromium; .ci/run does when it can)")
def test_the_page_in_a_headless_browser(tmp_path, cls_file, seg_file, median_file):
    predict = tmp_path / "predict.tsv"  # no radius: shown at min radius 0, as abstentions
    predict.write_text("idx\tlabel\tpredict\tcorrect\ttime\n0\t1\t1\t1\t0.1\n1\t2\t-1\t0\t0.1\n")
    out = html_report([cls_file, seg_file, median_file, predict], "0:1:0.25",
                      tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    dom, log = chromium(out, tmp_path / "profile", screenshot=shot)
    # loaded, its script ran to the end, no script error, no element failed, no console line
    root = dict(Page(dom).find("html")[0])
    assert root.get("data-ready") == "1" and "data-errors" not in root, root
    assert re.search(r'data-shown="(\d+)"', dom)[1] == str(10 + 2 + 3 + 2)  # all at first
    assert ":CONSOLE" not in log, [line for line in log.splitlines() if ":CONSOLE" in line]
    # the script sorted the cards by radius, largest first (abstentions last)
    shown = [float(c["data-radius"]) for c in Page(dom).find("figure", "card")]
    assert shown[:10] == sorted(shown[:10], reverse=True) and len(shown) == 10 + 2 + 3 + 2
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.shape == (2000, 1280) and pixels.std() > 20  # a page, not a blank canvas
    assert pixels[1400:].std() > 20  # its lower part, the gallery's cards, drawn too
    # the address sets the controls: only cards at radius ≥ 0.5 are shown; and the control: the
    # same checks catch a script error and an image that fails, added after the page's script
    broken = tmp_path / "broken.html"
    broken.write_text(out.read_text().replace(
        "</body>", '<img src="data:image/png;base64,AAAA"><script>nosuchfn();</script></body>'))
    dom, log = chromium(broken, tmp_path / "profile", "#min=0.5&hide=1")
    assert re.search(r'data-shown="(\d+)"', dom)[1] == "5"  # radius 0.5, 0.6, 0.8, 0.9; a box
    errors = dict(Page(dom).find("html")[0]).get("data-errors", "")
    assert "nosuchfn" in errors and "resource failed" in errors and "nosuchfn" in log


def test_inputs_become_grey_or_rgb_pixels():
    from smoothcert.evaluation.gallery import image_pixels

    rgb = np.random.default_rng(0).random((3, 4, 5))
    assert np.array_equal(image_pixels(rgb), np.rint(np.moveaxis(rgb, 0, -1) * 255))
    grey = image_pixels(np.array([[[0.0, 0.5, 1.0, 2.0, np.nan]]]))  # clipped, NaN black
    assert grey.tolist() == [[0, 128, 255, 255, 0]] and grey.dtype == np.uint8


def test_a_segmentation_label_map_greys_unlabelled_pixels(seg_file):
    import torch

    from smoothcert.data.dense import IGNORE_INDEX
    from smoothcert.evaluation.gallery import UNLABELLED_RGB, segmentation_card

    label = torch.zeros(8, 8, dtype=torch.int64)
    label[2:6, 2:6], label[0] = 2, IGNORE_INDEX
    manifest = {**read_records(seg_file).manifest, "identity": {  # a dataset that has one
        **read_records(seg_file).manifest["identity"], "dataset": "fashion-mnist-seg"}}
    records = dataclasses.replace(read_records(seg_file), manifest=manifest)
    card = segmentation_card(records, 0, (torch.rand(1, 8, 8), label)).html
    inputs, certified, labels = (png_of(a["src"]) for a in Page(card).find("img"))
    assert inputs.shape == (8, 8) and certified.shape == labels.shape == (8, 8, 4)
    assert (labels[0, :, :3] == UNLABELLED_RGB).all() and (labels[..., 3] == 255).all()
    assert (labels[2:6, 2:6, :3] == PALETTE[2]).all() and (labels[7, :, :3] == PALETTE[0]).all()
    # digits (the file's own dataset) has no ignore index: 255 is drawn as a class there
    card = segmentation_card(read_records(seg_file), 0, (torch.rand(1, 8, 8), label)).html
    labels = png_of(Page(card).find("img")[2]["src"])
    assert (labels[0, :, :3] == PALETTE[IGNORE_INDEX % len(PALETTE)]).all()
