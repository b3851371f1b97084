"""``report`` over files of different norms (issue 45): without ``--norm`` one line refuses
them, naming each file's norm and the ``--norm`` values every file holds; with it, the table,
the plots, the page, the envelope and the agreement all read and say that norm. A file of one
norm other than ℓ2 says its norm too. Flags a page cannot apply are refused, not dropped.

Record files: 4 digits test images (d = 64) certified with Gaussian (ℓ2), Laplace (ℓ1) and
exp-inf (ℓ∞) noise from the upgrade fixtures' checkpoint (n = 300: well under a second)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from smoothcert import certify_dataset
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation import norms, plots
from smoothcert.evaluation.html import html_report
from smoothcert.evaluation.report import agreement_report, radius_label, refuse, report
from smoothcert.runs.records import manifest_path, read_records

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
OLD = FIXTURES / "records"
RADII = "0:0.5:0.125"
NOISES = {"gaussian": "ℓ2", "laplace": "ℓ1", "exp-inf": "ℓ∞"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    """Certify files of the same 4 images, σ = 0.25: Gaussian, Laplace, exp-inf."""
    folder = tmp_path_factory.mktemp("mixed")
    for noise in NOISES:
        certify_dataset(str(FIXTURES / "checkpoint_v1.pt"), load_dataset("digits", "test"),
                        noise=noise, n0=20, n=300, batch=1000, skip=90, max_count=4,
                        out=folder / f"{noise}.tsv")
    return [folder / f"{noise}.tsv" for noise in NOISES]


def mixed_message(paths) -> str:
    listing = "; ".join(f"{NOISES[Path(p).stem]}: {p}" for p in paths)
    return (f"the files' radii are in different norms ({listing}), and one table, plot, "
            "envelope or agreement reads one norm; add --norm l2, --norm l1 or --norm linf "
            "(radii every file holds)")


def accuracy(path: Path, column: str, radius: float) -> float:
    r = read_records(path)
    return float(np.mean((r["correct"] == 1) & (r[column] >= radius)))


def acr(path: Path, column: str) -> float:
    r = read_records(path)
    return float(np.mean(np.where(r["correct"] == 1, r[column], 0.0)))


# --------------------------------------------------------------------------- refused
def test_every_file_holds_every_norm_so_the_message_offers_all_three(files):
    assert [norms.readable_norms(read_records(p)) for p in files] == [("l2", "l1", "linf")] * 3
    assert norms.readable_norms(read_records(OLD / "v4_certify_uniform.tsv")) == ("l1",)
    predict = read_records(OLD / "v4_predict_uniform.tsv")
    assert norms.readable_norms(predict) == ("l2", "l1", "linf")


def test_the_table_of_mixed_norms_is_one_line_naming_each_files_norm(files):
    with pytest.raises(SmoothcertError) as caught:
        report([str(p) for p in files], RADII)
    assert str(caught.value) == mixed_message(files)


@pytest.mark.parametrize("flags", [
    [], ["--envelope"], ["--plot", "{tmp}/curves.png"], ["--plot-cost", "{tmp}/cost.png"],
    ["--out", "{tmp}/table.md"], ["--format", "html", "--out", "{tmp}/page.html"],
    ["--format", "html", "--out", "{tmp}/page.html", "--plot", "{tmp}/curves.png"],
])
def test_the_cli_refuses_mixed_norms_before_printing_or_writing(files, tmp_path, capsys,
                                                                flags):
    argv = ["report", *map(str, files), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"smoothcert report: error: {mixed_message(files)}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_agreement_of_two_norms_is_refused(files, capsys):
    pair = files[:2]  # Gaussian ℓ2 against Laplace ℓ1: their ΔACR would subtract them
    with pytest.raises(SmoothcertError, match=r"different norms \(ℓ2: .*; ℓ1: .*\)"):
        agreement_report(pair, RADII)
    assert main(["report", *map(str, pair), "--agreement"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_plots_refuse_mixed_norms_through_the_python_api(files, tmp_path):
    records = [read_records(p) for p in files]
    with pytest.raises(SmoothcertError, match="different norms"):
        plots.plot_certified_accuracy(records, tmp_path / "curves.png")
    with pytest.raises(SmoothcertError, match="different norms"):
        plots.cost_figure(records, 0.1)
    assert list(tmp_path.iterdir()) == []


def test_the_page_of_mixed_norms_is_refused_and_not_written(files, tmp_path):
    with pytest.raises(SmoothcertError, match="different norms"):
        html_report(files, RADII, tmp_path / "page.html", gallery=0)
    assert list(tmp_path.iterdir()) == []


def test_a_file_without_the_shared_norm_leaves_no_norm_to_offer(files):
    # the old uniform file holds its ℓ1 radius only; the Gaussian file ℓ2 is not in it
    with pytest.raises(SmoothcertError) as caught:
        report([files[0], OLD / "v4_certify_uniform.tsv"], RADII)
    assert str(caught.value).endswith("reads one norm; add --norm l1 (radii every file holds)")
    with pytest.raises(SmoothcertError) as caught:
        report([OLD / "v4_certify_gaussian.tsv", OLD / "v4_certify_uniform.tsv"], RADII)
    assert str(caught.value).endswith("reads one norm; no --norm reads every file, so report "
                                      "them separately")


def test_predict_files_and_cohens_files_mix_with_their_norm(files, tmp_path):
    # a PREDICT file certifies no radius: it fits any report
    table = json.loads(report([files[1], OLD / "v4_predict_uniform.tsv"], RADII, fmt="json"))
    assert [row["radius_in"] for row in table] == ["ℓ1", "ℓ1"]
    cohen = tmp_path / "cohen.tsv"  # no manifest: Cohen et al.'s, Gaussian ℓ2
    cohen.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t0.1\n")
    assert "| cohen |" in report([cohen, files[0]], RADII)
    with pytest.raises(SmoothcertError, match=r"ℓ2: .*cohen.tsv, .*gaussian.tsv; ℓ1: "):
        report([cohen, files[0], files[1]], RADII)


# --------------------------------------------------------------------------- with --norm
@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_with_norm_the_table_and_envelope_read_that_norm(files, norm):
    table = json.loads(report(files, RADII, fmt="json", norm=norm, envelope=True))
    label = {"l1": "ℓ1", "l2": "ℓ2", "linf": "ℓ∞"}[norm]
    assert [row["radius_in"] for row in table] == [label] * 4
    for path, row in zip(files, table):
        assert row["acr"] == pytest.approx(acr(path, f"radius_{norm}"), rel=1e-12)
    for r in (0.0, 0.125, 0.25):
        best = max(accuracy(p, f"radius_{norm}", r) for p in files)
        assert table[-1][f"r={r:g}"] == best


def test_the_envelope_at_a_radius_is_the_best_certificate_in_that_norm(files):
    # exp-inf noise certifies ℓ∞ directly and ℓ1 by conversion (×d), Gaussian ℓ2 (= its ℓ1
    # bound): between their ℓ1 radii only exp-inf certifies in ℓ1, neither in ℓ2 nor ℓ∞
    gaussian, exp_inf = files[0], files[2]
    (g,), (e,) = (read_records(p)["radius_l1"][read_records(p)["correct"] == 1]
                  for p in (gaussian, exp_inf))
    assert e > g
    r = (e + g) / 2
    rows = {norm: json.loads(report([gaussian, exp_inf], [r], fmt="json", norm=norm,
                                    envelope=True))[-1][radius_label(r)]
            for norm in ("l1", "l2", "linf")}
    assert rows == {"l1": 0.25, "l2": 0.0, "linf": 0.0}


def test_with_norm_the_agreement_subtracts_radii_of_that_norm(files):
    rows = json.loads(agreement_report(files[:2], RADII, fmt="json", norm="linf"))
    assert rows[0]["radius_in"] == "ℓ∞"
    assert rows[0]["acr_difference"] == pytest.approx(
        acr(files[1], "radius_linf") - acr(files[0], "radius_linf"), rel=1e-12)
    md = agreement_report(files[:2], RADII, norm="linf").splitlines()[0]
    assert md.startswith("| first | second | radius in | n | agree |")


@pytest.fixture
def axes(monkeypatch) -> list:
    """The x and y labels of every figure the report draws (curves and cost), as drawn."""
    seen = []
    for name in ("certified_accuracy_figure", "cost_figure"):
        real = getattr(plots, name)

        def spy(*args, _real=real, **kwargs):
            fig = _real(*args, **kwargs)
            seen.append((fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()))
            return fig

        monkeypatch.setattr(plots, name, spy)
    return seen


def test_with_norm_the_plots_say_it(files, tmp_path, axes):
    report(files, RADII, norm="l1", plot=tmp_path / "c.png", plot_cost=tmp_path / "k.png",
           cost_radius=0.25)
    assert axes == [("forward passes per example (log scale)",
                     "certified accuracy at L1 radius 0.25 (%)"),
                    ("L1 radius", "certified accuracy (%)")]


def test_with_norm_the_page_says_it_in_its_table_and_curves(files, tmp_path, axes):
    page = html_report(files, RADII, tmp_path / "page.html", gallery=0, norm="linf")
    text = page.read_text(encoding="utf-8")
    assert text.count('<td class="text">ℓ∞</td>') == 3 and "<th>radius in</th>" in text
    assert axes == [("L∞ radius", "certified accuracy (%)")]


# --------------------------------------------------------------------------- one norm, not ℓ2
@pytest.mark.parametrize("index, axis", [(0, "L2 radius"), (1, "L1 radius"),
                                         (2, "L∞ radius")])
def test_files_of_one_norm_are_drawn_on_that_norms_axis(files, tmp_path, axes, index, axis):
    report([files[index]], RADII, plot=tmp_path / "c.png")
    html_report([files[index]], RADII, tmp_path / "page.html", gallery=0)
    assert axes == [(axis, "certified accuracy (%)")] * 2


def test_files_of_one_norm_other_than_l2_say_it_in_the_table(files):
    md = report([files[2]], RADII).splitlines()
    assert md[0].startswith("| name | radius in | n |") and md[2].startswith("| exp-inf | ℓ∞ |")
    assert "radius in" not in report([files[0]], RADII)  # ℓ2: Cohen et al.'s table as it was
    linf = norms.radius_units([read_records(files[2])], None)
    assert linf == {"linf": [str(files[2])]}
    assert list(norms.radius_units([read_records(p) for p in files], "l1")) == ["l1"]


# --------------------------------------------------------------------------- grammar
def test_one_refused_flag_needs_and_several_need():
    with pytest.raises(SmoothcertError) as one:
        refuse({"--plot": "p.png", "--norm": None}, "attack")
    assert str(one.value) == "--plot needs CERTIFY record files, not attack records"
    with pytest.raises(SmoothcertError) as two:
        refuse({"--ecdf": "e.png", "--envelope": True, "--cost": False}, "attack")
    assert str(two.value) == "--ecdf and --envelope need CERTIFY record files, not attack records"
    with pytest.raises(SmoothcertError) as three:
        report([OLD / "v4_attack.tsv"], RADII, envelope=True, cost=True, ecdf="e.png")
    assert str(three.value) == ("--ecdf, --envelope and --cost need CERTIFY record files, not "
                                "attack records")


# --------------------------------------------------------------------------- pages of dense files
@pytest.fixture(scope="module")
def segmentation(tmp_path_factory) -> tuple[Path, Path]:
    """A segmentation file of 2 images and a copy of its first image."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "certifiers"))
    import test_segment

    folder = tmp_path_factory.mktemp("seg")
    test_segment.run(out=folder / "seg.tsv")
    first = folder / "first.tsv"
    first.write_text("".join((folder / "seg.tsv").read_text().splitlines(keepends=True)[:2]))
    shutil.copy(manifest_path(folder / "seg.tsv"), manifest_path(first))
    return folder / "seg.tsv", first


@pytest.mark.parametrize("flag, value", [("plot", "curves.png"), ("envelope", True),
                                         ("norm", "l2"), ("cost", True)])
def test_a_page_without_classification_files_refuses_their_flags(segmentation, tmp_path,
                                                                   flag, value):
    value = tmp_path / value if isinstance(value, str) and "." in value else value
    with pytest.raises(SmoothcertError) as caught:
        html_report(segmentation[:1], RADII, tmp_path / "page.html", gallery=0,
                    **{flag: value})
    assert str(caught.value) == (f"--{flag} needs CERTIFY record files, not segmentation or "
                                 "median records")
    assert list(tmp_path.iterdir()) == []


def test_a_page_of_dense_files_takes_common(segmentation, tmp_path):
    page = html_report(segmentation, "0", tmp_path / "page.html", gallery=0, common=True)
    rows = page.read_text(encoding="utf-8").split("<tbody>")[1].split("</tr>")[:2]
    assert all("<td class=\"num\">1</td>" in row for row in rows)  # images: the 1 both hold


def test_latex_writes_the_norm_in_math_mode(files):
    tex = report(files, RADII, fmt="latex", norm="linf")  # pdfLaTeX has no ℓ or ∞ glyph
    assert r"gaussian & $\ell_\infty$ & 4 & " in tex and "ℓ" not in tex and "∞" not in tex
    assert r"laplace & $\ell_1$ & 4 & " in report([files[1]], RADII, fmt="latex")


def test_many_files_of_a_norm_are_counted_not_all_named():
    gaussian = [OLD / f"v{v}_certify_gaussian.tsv" for v in (1, 2, 3, 4)]
    uniform = OLD / "v4_certify_uniform.tsv"
    with pytest.raises(SmoothcertError) as caught:
        report([*gaussian, uniform], RADII)
    assert str(caught.value).startswith(
        f"the files' radii are in different norms (ℓ2: 4 files ({gaussian[0]}, {gaussian[1]}, "
        f"{gaussian[2]}, ...); ℓ1: {uniform}), and one table")
