"""Report tables in every format, and the certified-accuracy plot."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from conftest import COHEN_ROWS, GRID
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.plots import LEGEND_INSIDE_MAX, line_styles, plot_certified_accuracy
from smoothcert.evaluation.report import radius_label, report
from smoothcert.evaluation.tables import FORMATS, get_format
from smoothcert.runs.records import read_records
from smoothcert.upgrade import MANIFEST_VERSION

COHEN_HEADER = ("idx", "label", "predict", "radius", "correct", "time")
# The 8 rows of conftest.COHEN_ROWS: CA at GRID = 5/8, 4/8, 3/8, 2/8, 1/8, 0 (see there),
# ACR = 2.8/8 = 0.35, clean 5/8, abstain 2/8.
LABELS = ["r=0", "r=0.25", "r=0.5", "r=0.75", "r=1", "r=1.25"]
CA = [0.625, 0.5, 0.375, 0.25, 0.125, 0.0]
ACR, CLEAN, ABSTAIN = 0.35, 0.625, 0.25

PREDICT_HEADER = ("idx", "label", "predict", "correct", "time", "count", "runner_up", "pvalue",
                  "n", "alpha", "sigma", "seed")
# 4 rows: 2 right, 1 wrong, 1 abstention → clean 0.5, abstain 0.25
PREDICT_ROWS = [
    (0, 1, 1, 1, 0.5, 90, 5, 1e-20, 100, 0.001, 0.25, 0),
    (1, 2, -1, 0, 0.5, 50, 48, 0.9, 100, 0.001, 0.25, 0),
    (2, 3, 4, 0, 0.5, 80, 10, 1e-10, 100, 0.001, 0.25, 0),
    (3, 5, 5, 1, 0.5, 99, 1, 1e-25, 100, 0.001, 0.25, 0),
]

OURS_HEADER = ("idx", "label", "predict", "radius", "correct", "time", "p_lower", "nA", "n0", "n",
               "alpha", "sigma", "seed")
OURS_ROWS = [
    (0, 1, 1, 0.9, 1, 0.25, 0.99, 99990, 100, 100000, 0.001, 0.5, 0),
    (1, 2, 2, 0.3, 1, 0.25, 0.72, 72000, 100, 100000, 0.001, 0.5, 0),
    (2, 3, -1, 0.0, 0, 0.25, 0.40, 40000, 100, 100000, 0.001, 0.5, 0),
]


def write_tsv(path, header, rows):
    lines = ["\t".join(header)] + ["\t".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path):
    cohen = write_tsv(tmp_path / "cohen_noise_0.25.tsv", COHEN_HEADER, COHEN_ROWS)
    pred = write_tsv(tmp_path / "pred.tsv", PREDICT_HEADER, PREDICT_ROWS)
    return cohen, pred


def _table_rows(text, sep, strip):
    """Data lines of an md/latex table as lists of cells."""
    return [[c.strip() for c in strip(line).split(sep)] for line in text.splitlines()]


# --------------------------------------------------------------------------- formats
def test_registry_has_the_five_formats():
    assert set(FORMATS) >= {"md", "latex", "csv", "json", "html"}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_names_every_file_and_radius(files, fmt):
    text = report(files, GRID, fmt=fmt)
    assert "cohen" in text and "pred" in text
    assert all(label in text for label in LABELS)


def test_markdown(files):
    lines = _table_rows(report(files, GRID, fmt="md"), "|", lambda s: s.strip().strip("|"))
    assert lines[0] == ["name", "n", "clean acc", "abstain", "ACR", *LABELS]
    assert set(lines[1]) <= {"---", "---:"}
    assert lines[2] == ["cohen_noise_0.25", "8", "62.5%", "25.0%", "0.350",
                        "62.5%", "50.0%", "37.5%", "25.0%", "12.5%", "0.0%"]
    assert lines[3] == ["pred", "4", "50.0%", "25.0%", "–", *["–"] * len(GRID)]


def test_latex(files):
    text = report(files, GRID, fmt="latex")
    lines = text.splitlines()
    assert lines[0] == r"\begin{tabular}{l" + "r" * (4 + len(GRID)) + "}"
    assert [lines[1], lines[3], lines[-2], lines[-1]] == [
        r"\toprule", r"\midrule", r"\bottomrule", r"\end{tabular}"]
    rows = _table_rows("\n".join(lines[4:6]), "&", lambda s: s.removesuffix(r"\\"))
    assert rows[0] == [r"cohen\_noise\_0.25", "8", r"62.5\%", r"25.0\%", "0.350",
                       r"62.5\%", r"50.0\%", r"37.5\%", r"25.0\%", r"12.5\%", r"0.0\%"]
    assert rows[1] == ["pred", "4", r"50.0\%", r"25.0\%", "--", *["--"] * len(GRID)]


def test_csv_keeps_full_precision(files):
    rows = list(csv.DictReader(io.StringIO(report(files, GRID, fmt="csv"))))
    cohen, pred = rows
    assert cohen["name"] == "cohen_noise_0.25" and cohen["n"] == "8"
    assert float(cohen["acr"]) == pytest.approx(ACR, rel=1e-12)
    assert (float(cohen["clean_accuracy"]), float(cohen["abstention_rate"])) == (CLEAN, ABSTAIN)
    assert [float(cohen[label]) for label in LABELS] == CA
    assert (float(pred["clean_accuracy"]), float(pred["abstention_rate"])) == (0.5, 0.25)
    assert pred["acr"] == "" and all(pred[label] == "" for label in LABELS)


def test_json_is_machine_readable(files):
    cohen, pred = json.loads(report(files, GRID, fmt="json"))
    assert cohen["name"] == "cohen_noise_0.25" and cohen["n"] == 8
    assert cohen["acr"] == pytest.approx(ACR, rel=1e-12)
    assert (cohen["clean_accuracy"], cohen["abstention_rate"]) == (CLEAN, ABSTAIN)
    assert [cohen[label] for label in LABELS] == CA
    assert (pred["clean_accuracy"], pred["abstention_rate"]) == (0.5, 0.25)
    assert pred["acr"] is None and all(pred[label] is None for label in LABELS)


def test_radii_as_text_and_one_path(files):
    assert report(files[0], "0:1.25:0.25", fmt="json") == report([files[0]], GRID, fmt="json")


def test_radius_labels_read_back():
    assert [radius_label(r) for r in (0.0, 1.0, 0.3, 0.125)] == ["r=0", "r=1", "r=0.3", "r=0.125"]


def test_unknown_format_raises(files):
    with pytest.raises(SmoothcertError, match="unknown report format 'txt'; known: csv, html, "
                                              "json"):
        report(files, GRID, fmt="txt")
    with pytest.raises(SmoothcertError, match="known"):
        get_format("txt")


def test_empty_file_and_no_files_raise(tmp_path):
    empty = write_tsv(tmp_path / "empty.tsv", COHEN_HEADER, [])
    with pytest.raises(SmoothcertError, match="no rows"):
        report([empty], GRID)
    with pytest.raises(SmoothcertError, match="at least one"):
        report([], GRID)


# --------------------------------------------------------------------------- plots
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_two_files_is_a_png(tmp_path, files):
    ours = write_tsv(tmp_path / "ours.tsv", OURS_HEADER, OURS_ROWS)
    records = [read_records(p) for p in (files[0], ours, files[1])]  # the predict file is skipped
    out = plot_certified_accuracy(records, tmp_path / "ca.png")
    assert out == tmp_path / "ca.png"
    assert (tmp_path / "ca.png").read_bytes()[:8] == PNG_MAGIC
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was renamed away


def test_line_styles_stay_distinct_past_ten_curves():
    styles = [(tuple(s["color"]), s["linestyle"]) for s in line_styles()]
    assert len(styles) == 40 and len(set(styles)) == 40
    assert {ls for _, ls in styles[:10]} == {"-"} and len({c for c, _ in styles[:10]}) == 10
    assert styles[10][1] == "--" and styles[10][0] == styles[0][0]  # 11th: 1st color, dashed


def test_long_legend_goes_beside_the_axes(tmp_path):
    def width(path):  # PNG IHDR: width in bytes 16-20
        return int.from_bytes(path.read_bytes()[16:20], "big")

    records = [read_records(write_tsv(tmp_path / f"run{i}.tsv", OURS_HEADER, OURS_ROWS))
               for i in range(LEGEND_INSIDE_MAX + 1)]
    few = plot_certified_accuracy(records[:LEGEND_INSIDE_MAX], tmp_path / "few.png")
    many = plot_certified_accuracy(records, tmp_path / "many.png")
    assert width(many) / width(few) == pytest.approx(8.0 / 5.0, rel=0.01)


def test_report_writes_plot(tmp_path, files):
    report(files, GRID, fmt="md", plot=tmp_path / "fig.png")
    assert (tmp_path / "fig.png").read_bytes()[:8] == PNG_MAGIC


def test_plot_other_suffix_and_max_radius(tmp_path, files):
    plot_certified_accuracy([read_records(files[0])], tmp_path / "ca.svg", max_radius=0.6)
    assert b"<svg" in (tmp_path / "ca.svg").read_bytes()[:1000]


def test_plot_errors(tmp_path, files):
    with pytest.raises(SmoothcertError, match="no record file has a radius"):
        plot_certified_accuracy([read_records(files[1])], tmp_path / "x.png")
    with pytest.raises(SmoothcertError, match="not supported"):
        plot_certified_accuracy([read_records(files[0])], tmp_path / "x.notaformat")
    with pytest.raises(SmoothcertError, match="does not exist"):
        plot_certified_accuracy([read_records(files[0])], tmp_path / "nodir" / "x.png")
    assert not list(tmp_path.glob("x.*")) and not list(tmp_path.glob(".*.tmp"))


def test_no_matplotlib_at_import_and_no_global_state(tmp_path, files):
    code = (
        "import sys, smoothcert.evaluation.report, smoothcert.evaluation.plots,"
        " smoothcert.evaluation.metrics\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at package import'\n"
        "import matplotlib\n"
        "matplotlib.use('svg')\n"
        "from smoothcert.evaluation.plots import plot_certified_accuracy\n"
        "from smoothcert.runs.records import read_records\n"
        f"plot_certified_accuracy([read_records({str(files[0])!r})], {str(tmp_path / 'a.png')!r})\n"
        "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_memory_certifier_files_get_an_adjusted_count(tmp_path):
    import json

    header = ("idx", "label", "predict", "radius", "correct", "time", "adjusted")
    rows = [(0, 1, 1, 0.5, 1, 0.1, 1), (1, 2, 2, 0.25, 1, 0.1, 0), (2, 3, 3, 0.75, 1, 0.1, 1)]
    dd = tmp_path / "dd.tsv"
    dd.write_text("\n".join("\t".join(map(str, r)) for r in [header, *rows]) + "\n")
    plain = tmp_path / "plain.tsv"
    plain.write_text("\n".join("\t".join(map(str, r[:-1])) for r in [header, *rows]) + "\n")
    table = json.loads(report([plain, dd], (0.0, 0.5), fmt="json", envelope=True))
    assert [row["adjusted"] for row in table] == [None, 2, None]  # plain, dd, envelope


# ------------------------------------------------------------------ tables spliced into a document
DOC = """# Results

Prose above.

<!-- report:ours -->
an old table
<!-- /report:ours -->

Prose below, and another block that must stay as it is:
<!-- report:other -->
kept
<!-- /report:other -->
"""


def test_splice_replaces_only_its_block(tmp_path, files):
    from smoothcert.evaluation.blocks import splice_block

    doc = tmp_path / "RESULTS.md"
    doc.write_text(DOC, encoding="utf-8")
    table = report(files[0], GRID)
    splice_block(doc, "ours", table)
    text = doc.read_text(encoding="utf-8")
    assert "an old table" not in text
    assert text == DOC.replace("an old table\n", table)
    splice_block(doc, "ours", table)  # idempotent: regenerating changes nothing
    assert doc.read_text(encoding="utf-8") == text


@pytest.mark.parametrize("doc_text, name", [
    (DOC, "missing"),                                        # no such block
    (DOC + "<!-- report:ours -->\n<!-- /report:ours -->\n", "ours"),  # twice
    ("<!-- /report:ours -->\n<!-- report:ours -->\n", "ours"),  # closed before opened
    (DOC, "bad name"),                                       # not a block name
])
def test_splice_refuses_an_ambiguous_document(tmp_path, doc_text, name):
    from smoothcert.evaluation.blocks import splice_block

    doc = tmp_path / "RESULTS.md"
    doc.write_text(doc_text, encoding="utf-8")
    with pytest.raises(SmoothcertError):
        splice_block(doc, name, "table\n")
    assert doc.read_text(encoding="utf-8") == doc_text  # untouched


def test_cli_into_writes_the_block_and_validates_first(tmp_path, files, capsys):
    from smoothcert.cli.app import main

    doc = tmp_path / "RESULTS.md"
    doc.write_text(DOC, encoding="utf-8")
    args = ["report", str(files[0]), "--radii", "0:1.25:0.25"]
    assert main(args + ["--into", str(doc), "--block", "ours"]) == 0
    table = capsys.readouterr().out
    assert doc.read_text(encoding="utf-8") == DOC.replace("an old table\n", table)
    for extra in (["--into", str(doc)], ["--block", "ours"],
                  ["--into", str(doc), "--block", "missing"],
                  ["--into", str(tmp_path / "none.md"), "--block", "ours"]):
        assert main(args + extra) == 2, extra
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, err
    assert doc.read_text(encoding="utf-8") == DOC.replace("an old table\n", table)


# ------------------------------------------------------------------ example-by-example agreement
CERT_HEADER = ("idx", "label", "predict", "radius", "correct", "time")
# (idx, correct, radius): A certifies 0 to 0.6, 1 to 0.3, 3 at 0 only; 2 is wrong.
A_ROWS = [(0, 1, 0.6), (1, 1, 0.3), (2, 0, 0.9), (3, 1, 0.0)]
# B, in another order: certifies 0 to 0.2, 2 to 0.5, 3 to 0.4; 1 abstains.
B_ROWS = [(3, 1, 0.4), (2, 1, 0.5), (1, 0, 0.0), (0, 1, 0.2)]


def _cert_file(path, rows):
    lines = [(i, 1, 1 if c else (-1 if r == 0 else 2), r, c, 0.1) for i, c, r in rows]
    return write_tsv(path, CERT_HEADER, lines)


def test_agreement_counts_each_example(tmp_path):
    from smoothcert.evaluation.metrics import certified_agreement

    a = read_records(_cert_file(tmp_path / "a.tsv", A_ROWS))
    b = read_records(_cert_file(tmp_path / "b.tsv", B_ROWS))
    got = certified_agreement(a, b, (0.0, 0.25, 0.5))
    # r=0: A {0,1,3}, B {0,2,3}; r=0.25: A {0,1}, B {2,3}; r=0.5: A {0}, B {2}
    assert got.both == (2, 0, 0)
    assert got.first_only == (1, 2, 1) and got.second_only == (1, 2, 1)
    assert got.count == 4 and got.agreement == pytest.approx(1 - 8 / 12)
    # paired radius differences B − A by idx: −0.4, −0.3, +0.5, +0.4 (sample sd √(0.65/3))
    assert got.acr_difference == pytest.approx(0.05)
    assert got.acr_difference_se == pytest.approx((0.65 / 3) ** 0.5 / 2)
    same = certified_agreement(a, a, (0.0, 0.25, 0.5))
    assert same.first_only == same.second_only == (0, 0, 0) and same.agreement == 1.0
    assert same.acr_difference == same.acr_difference_se == 0.0


def test_agreement_report_pairs_the_files(tmp_path):
    from smoothcert.evaluation.report import agreement_report

    a = _cert_file(tmp_path / "a.tsv", A_ROWS)
    b = _cert_file(tmp_path / "b.tsv", B_ROWS)
    rows = list(csv.DictReader(io.StringIO(agreement_report([a, b, a, a], "0,0.25", "csv"))))
    assert [(r["first"], r["second"], r["r=0"], r["r=0.25"]) for r in rows] == [
        ("a", "b", "1/1", "2/2"), ("a", "a", "0/0", "0/0")]
    assert float(rows[0]["acr_difference"]) == pytest.approx(0.05)
    assert float(rows[1]["acr_difference_se"]) == 0.0
    assert float(rows[0]["agreement"]) == pytest.approx(1 - 6 / 8)


def test_agreement_refuses_files_it_cannot_compare(tmp_path, files):
    from smoothcert.evaluation.report import agreement_report

    a = _cert_file(tmp_path / "a.tsv", A_ROWS)
    other = _cert_file(tmp_path / "other.tsv", A_ROWS[:3])
    twice = _cert_file(tmp_path / "twice.tsv", A_ROWS[:3] + A_ROWS[:1])
    for paths in ([a], [a, other], [a, twice], [a, files[1]]):  # odd, idx sets, repeat, PREDICT
        with pytest.raises(SmoothcertError):
            agreement_report(paths, "0,0.25")


def test_cli_agreement(tmp_path, capsys):
    from smoothcert.cli.app import main

    a = str(_cert_file(tmp_path / "a.tsv", A_ROWS))
    b = str(_cert_file(tmp_path / "b.tsv", B_ROWS))
    assert main(["report", a, b, "--agreement", "--radii", "0,0.25"]) == 0
    assert "| a | b | 4 | 25.0% | +0.050 | 0.233 | 1/1 | 2/2 |" in capsys.readouterr().out
    assert main(["report", a, b, "--agreement", "--train"]) == 2
    assert main(["report", a, "--agreement"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "pairs" in err[1]


def _legend_and_lines(fig):
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    vertical = [line for line in ax.get_lines() if line.get_linestyle() == ":"
                and len(set(line.get_xdata())) == 1]
    return ax, texts, vertical


def test_plot_is_ready_for_a_paper(tmp_path):
    """σ, n, α in the title (shared) or the legend (differing), certified accuracy in % as in
    the tables, and a dotted line at the largest radius n draws can certify: σΦ⁻¹(α^(1/n))."""
    from scipy.stats import norm

    from smoothcert.evaluation.plots import certified_accuracy_figure

    other = [(*row[:-2], 0.25, 0) for row in OURS_ROWS]  # σ = 0.25 instead of 0.5
    records = [read_records(write_tsv(tmp_path / f"{name}.tsv", OURS_HEADER, rows))
               for name, rows in (("s050", OURS_ROWS), ("s025", other))]
    ax, texts, vertical = _legend_and_lines(certified_accuracy_figure(records))
    assert ax.get_title() == "n=100000, α=0.001"
    assert texts[:2] == ["s050 (σ=0.5)", "s025 (σ=0.25)"]
    assert "%" in ax.get_ylabel() and ax.get_ylim()[1] == pytest.approx(102.0)
    assert max(ax.get_lines()[0].get_ydata()) == pytest.approx(100 * 2 / 3)
    limits = sorted(line.get_xdata()[0] for line in vertical)
    expected = [s * norm.ppf(0.001 ** (1 / 100_000)) for s in (0.25, 0.5)]  # 0.96, 1.92
    assert limits == pytest.approx(expected, rel=1e-12)
    assert texts[2:] == ["largest radius n draws can certify"]  # one entry for both lines
    s050, s025 = (tuple(line.get_color()) for line in ax.get_lines()[:2])
    by_x = sorted((line.get_xdata()[0], tuple(line.get_color())) for line in vertical)
    assert [color for _, color in by_x] == [s025, s050]  # each line in its curve's color
    assert ax.get_xlim()[1] == pytest.approx(1.05 * expected[1])


def test_plot_of_files_without_parameters_keeps_their_names(files):
    from smoothcert.evaluation.plots import certified_accuracy_figure

    ax, texts, vertical = _legend_and_lines(certified_accuracy_figure([read_records(files[0])]))
    assert texts == ["cohen_noise_0.25"] and ax.get_title() == "" and not vertical
    assert max(ax.get_lines()[0].get_ydata()) == pytest.approx(100 * CLEAN)


def test_plot_marks_the_limit_of_cli_certify_files_only(tmp_path):
    """A smoothcert CERTIFY file (manifest certifier certify) gets the line; a sequential one does
    not (its grid, not n, limits it), but its n_max comes from the manifest."""
    from smoothcert.evaluation.plots import certified_accuracy_figure, n_limited_radius

    path = write_tsv(tmp_path / "c.tsv", OURS_HEADER, OURS_ROWS)
    manifest = {"format_version": MANIFEST_VERSION,
                "identity": {"certifier": "certify", "sigma": 0.5, "n": 100000, "alpha": 0.001}}
    (tmp_path / "c.tsv.manifest.json").write_text(json.dumps(manifest))
    assert n_limited_radius(read_records(path)) == pytest.approx(1.9057, abs=1e-4)
    manifest["identity"]["certifier"] = "sequential"
    (tmp_path / "c.tsv.manifest.json").write_text(json.dumps(manifest))
    ax, texts, vertical = _legend_and_lines(certified_accuracy_figure([read_records(path)]))
    assert not vertical and ax.get_title() == "σ=0.5, n=100000, α=0.001"


def test_every_report_column_is_defined_in_help_and_readme(capsys, files):
    """`report --help` (its epilog) and the README's "Reading the tables" define every column of
    every table report prints; what both say of "clean acc" on CERTIFY files (the certified
    accuracy at r = 0) is checked on a table, not on their wording."""
    from pathlib import Path

    from smoothcert.cli.app import main
    from smoothcert.evaluation.report import (
        COST_COLUMNS,
        DATASET_COLUMN,
        ENVELOPE,
        SIGMA_COLUMNS,
        UNIT_COLUMN,
        attack_table,
        certification_table,
    )
    from smoothcert.evaluation.train_report import training_table

    headers = {*certification_table([], (0.5,)).headers, *attack_table([], (0.5,)).headers,
               *training_table([]).headers, "adjusted", ENVELOPE, "first", "second", "agree",
               DATASET_COLUMN[1], UNIT_COLUMN[1],
               *(header for _, header, _ in SIGMA_COLUMNS),
               *(header for _, header, _ in COST_COLUMNS)}
    generic = {"r=0.5": "r=R", "d≤0.5": "d≤D"}
    headers = {generic.get(h, h) for h in headers}
    assert main(["report", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Reading the tables", 1)[1].split("\n## ", 1)[0]
    for h in headers:
        assert f" {h.replace('≤', '<=')} " in help_text or f" {h}, " in help_text, h
        assert f"`{h}`" in section, h
    (cohen, _) = json.loads(report(files, (0.0, 0.5), fmt="json"))
    assert cohen["clean_accuracy"] == cohen["r=0"] == CLEAN


def test_cost_columns_are_means_of_the_rows_and_the_manifests_device(tmp_path, files):
    """--cost: s/img the mean of ``time``, passes/img the mean of n0 + n, the device from the
    manifest's provenance; a file without n (Cohen et al.'s) leaves passes empty."""
    rows = [(*row[:7], n, n0, n, *row[10:]) for row, n0, n in zip(OURS_ROWS, (100, 100, 50),
                                                                  (1000, 5000, 950))]
    ours = write_tsv(tmp_path / "seq.tsv", OURS_HEADER, rows)
    manifest = {"format_version": MANIFEST_VERSION, "provenance": {"device": "cuda:0"},
                "identity": {"certifier": "certify", "sigma": 0.5, "n": 5000, "alpha": 0.001}}
    (tmp_path / "seq.tsv.manifest.json").write_text(json.dumps(manifest))
    table = json.loads(report([ours, files[0]], (0.5,), fmt="json", cost=True))
    assert table[0]["seconds_per_example"] == pytest.approx(0.25)
    assert table[0]["passes_per_example"] == pytest.approx((1100 + 5100 + 1000) / 3)
    assert table[0]["device"] == "cuda:0"
    assert table[1]["passes_per_example"] is None and table[1]["device"] is None
    assert "passes/img" not in report([ours], (0.5,))  # only when asked


def test_cost_plot_joins_the_pareto_frontier(tmp_path):
    """Three files: cheap and bad, dear and good, dear and worse than a cheaper one: the
    frontier holds the first two only."""
    import matplotlib

    matplotlib.use("Agg")
    from smoothcert.evaluation.plots import plot_cost_frontier

    specs = {"cheap": (1000, [0.6, 0.0, 0.0]), "dear": (100_000, [0.9, 0.6, 0.0]),
             "worse": (50_000, [0.1, 0.0, 0.0])}
    paths = []
    for name, (n, radii) in specs.items():
        rows = [(*row[:3], r, *row[4:7], n, row[8], n, *row[10:])
                for row, r in zip(OURS_ROWS, radii)]
        paths.append(write_tsv(tmp_path / f"{name}.tsv", OURS_HEADER, rows))
    out = tmp_path / "cost.png"
    captured = {}
    import matplotlib.figure

    real_save = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        captured["fig"] = fig
        return real_save(fig, *args, **kwargs)

    matplotlib.figure.Figure.savefig = keep
    try:
        plot_cost_frontier([read_records(p) for p in paths], out, 0.5)
    finally:
        matplotlib.figure.Figure.savefig = real_save
    assert out.stat().st_size > 0
    (frontier,) = [line for line in captured["fig"].axes[0].get_lines()
                   if line.get_label() == "Pareto frontier"]
    assert list(frontier.get_xdata()) == [1100.0, 100_100.0]
    assert list(frontier.get_ydata()) == pytest.approx([100 / 3, 200 / 3])


def test_cost_flags_are_checked_before_anything_is_read(tmp_path, files, capsys):
    from smoothcert.cli.app import main

    assert main(["report", str(files[0]), "--cost-radius", "0.25"]) == 2
    assert "--cost-radius is the radius of --plot-cost" in capsys.readouterr().err
    out = tmp_path / "c.png"
    assert main(["report", str(files[0]), "--plot-cost", str(out), "--cost-radius", "-1"]) == 2
    assert "--cost-radius must be a finite number >= 0" in capsys.readouterr().err
    assert main(["report", str(files[0]), "--plot-cost", str(files[0])]) == 2
    assert not out.exists()
    assert main(["report", str(files[0]), "--plot-cost", str(out)]) == 2  # Cohen's: no n column
    assert "--plot-cost needs radius and n columns" in capsys.readouterr().err
    assert not out.exists()


def test_forward_passes_count_an_ensembles_member_passes():
    """A file of one model: n0 + n; an ensemble's: its member_passes; an ensemble's from before
    that column: n0 + n times the members, unknown (None) with a K-consensus of K < M."""
    import numpy as np

    from smoothcert.evaluation.metrics import forward_passes
    from smoothcert.runs.records import Records

    def records(manifest, **extra):
        data = {"idx": np.arange(2), "n0": np.array([100, 100]), "n": np.array([900, 400]),
                **extra}
        return Records("r.tsv", tuple(data), data, manifest)

    members = {"members": ["a", "b", "c"], "mode": "logits"}
    one = records({"identity": {}})
    old = records({"identity": {"ensemble": {**members, "consensus": None}}})
    old_k = records({"identity": {"ensemble": {**members, "consensus": 2}}})
    new = records({"identity": {"ensemble": {**members, "consensus": 2}}},
                  member_passes=np.array([2500, 1100]))
    assert list(forward_passes(one)) == [1000, 500]
    assert list(forward_passes(old)) == [3000, 1500]
    assert forward_passes(old_k) is None
    all_k = records({"identity": {"ensemble": {**members, "consensus": 3}}})
    assert list(forward_passes(all_k)) == [3000, 1500]  # K = M: nothing skipped
    assert list(forward_passes(new)) == [2500, 1100]


# ------------------------------------------------------------- files of other images or data
def _with_data(path, dataset, split="test"):
    """``path`` with a manifest saying which dataset split its rows certify."""
    manifest = {"format_version": MANIFEST_VERSION,
                "identity": {"certifier": "certify", "dataset": dataset, "split": split}}
    (path.parent / f"{path.name}.manifest.json").write_text(json.dumps(manifest))
    return path


def test_envelope_refuses_files_of_other_images_and_names_common(tmp_path, files, capsys):
    """The envelope takes the best file at each radius: over files of different examples it
    is a maximum over different populations. Refused in one line that names --common; with
    --common, the envelope of the 4 shared examples by hand: file A's idx 0..3 certify 0 at
    0.25 and 1 at 0.5 (2 abstains, 3 is wrong); B certifies 1 at 0.8 and 3 at 0.1 (0 is wrong,
    2 abstains) → at r = 0, 0.25, 0.75: max(2/4, 2/4), max(2/4, 1/4), max(0, 1/4)."""
    from smoothcert.cli.app import main

    other = write_tsv(tmp_path / "b.tsv", COHEN_HEADER,
                      [(0, 1, 5, 0.3, 0, 0.1), (1, 2, 2, 0.8, 1, 0.1), (2, 3, -1, 0.0, 0, 0.1),
                       (3, 4, 4, 0.1, 1, 0.1)])
    with pytest.raises(SmoothcertError, match="--common"):
        report([files[0], other], (0.0, 0.5), envelope=True)
    assert main(["report", str(files[0]), str(other), "--envelope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "8 and 4 examples (4 in both)" in err, err
    rows = json.loads(report([files[0], other], (0.0, 0.25, 0.75), fmt="json", envelope=True,
                             common=True))
    assert [rows[-1][k] for k in ("r=0", "r=0.25", "r=0.75")] == [0.5, 0.5, 0.25]
    assert main(["report", str(files[0]), str(other)]) == 0  # a table of both is fine


def test_a_table_of_several_datasets_says_which_row_is_which(tmp_path, files, caplog):
    """A table mixing datasets (make demo's digits beside Fashion-MNIST runs) gets a dataset
    column and a one-line note; one dataset (or files without a manifest) gets neither."""
    import logging

    digits = _with_data(write_tsv(tmp_path / "demo.tsv", OURS_HEADER, OURS_ROWS), "digits")
    fmnist = _with_data(write_tsv(tmp_path / "g025.tsv", OURS_HEADER, OURS_ROWS),
                        "fashion-mnist")
    with caplog.at_level(logging.WARNING, logger="smoothcert"):
        rows = json.loads(report([fmnist, digits, files[0]], (0.5,), fmt="json"))
    assert [r["dataset"] for r in rows] == ["fashion-mnist test", "digits test", None]
    (note,) = [r.getMessage() for r in caplog.records]
    assert note.startswith("note: ") and "digits test" in note and "\n" not in note
    md = report([fmnist, digits], (0.5,)).splitlines()
    assert md[0].startswith("| name | dataset | n |")
    assert md[2].startswith("| g025 | fashion-mnist test | 3 |")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="smoothcert"):
        one = json.loads(report([fmnist, files[0]], (0.5,), fmt="json"))
    assert "dataset" not in one[0] and not caplog.records


@pytest.mark.parametrize("mode", ["envelope", "common", "agreement"])
def test_example_by_example_modes_refuse_files_of_several_datasets(tmp_path, mode):
    """The same idx in two datasets are two different images: the envelope, --common and
    --agreement, which match files example by example, refuse them in one line."""
    from smoothcert.evaluation.report import agreement_report

    a = _with_data(_cert_file(tmp_path / "a.tsv", A_ROWS), "digits")
    b = _with_data(_cert_file(tmp_path / "b.tsv", B_ROWS), "fashion-mnist")
    with pytest.raises(SmoothcertError) as info:
        if mode == "agreement":
            agreement_report([a, b], "0,0.25")
        else:
            report([a, b], "0,0.25", **{mode: True})
    message = str(info.value)
    assert "\n" not in message and "digits test" in message and "fashion-mnist test" in message
