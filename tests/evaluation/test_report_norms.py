"""``report --norm l1|l2|linf`` (issue 37): each file's radius in the chosen norm, said in the
table; old files report as they did; a certifier's own unit (``Certifier.radius_norm``).

Record files: 4 digits test images (d = 64) certified with Gaussian and uniform noise from the
upgrade fixtures' checkpoint, and the fixtures' old files."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from smoothcert import certify_dataset
from smoothcert.certifiers import CERTIFIERS
from smoothcert.certifiers.certify import Certify
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.intervals import acr_difference
from smoothcert.evaluation.norms import in_norm, in_norms
from smoothcert.evaluation.report import UNIT_COLUMN, agreement_report, report
from smoothcert.runs.records import manifest_path, read_records

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
OLD = FIXTURES / "records"
RADII = "0:1:0.25"
# the files whose report today's code printed before the radius columns (reports/before_radii.*)
BEFORE = [OLD / "v4_certify_gaussian.tsv", OLD / "v4_certify_uniform.tsv",
          OLD / "v4_data_dependent_uniform.tsv", OLD / "v4_predict_uniform.tsv",
          OLD / "v1_certify_gaussian.tsv", OLD / "v2_certify_uniform.tsv",
          OLD / "v3_data_dependent_uniform.tsv", FIXTURES / "corpus" / "step4_fixed_n.tsv",
          FIXTURES / "corpus" / "step5_heat_g001_s050_deterministic.tsv"]
# Since issue 45 one table reads one norm, so the ℓ2 and the ℓ1 files of BEFORE are reported
# apart (the PREDICT file, without a radius, with the ℓ1 files); the ℓ1 table says its norm.
L1_BEFORE = [p for p in BEFORE if "uniform" in p.name]
L2_BEFORE = [p for p in BEFORE if p not in L1_BEFORE]
OPTIONAL = {"dataset", "adjusted", "σ_x min", "σ_x mean", "σ_x max", "$\\sigma_x$ min",
            "$\\sigma_x$ mean", "$\\sigma_x$ max", "sigma_min", "sigma_mean", "sigma_max"}
"""Columns a table shows for some of its files only (several datasets, data-dependent σ_x)."""


def cells(text: str, fmt: str) -> list[dict]:
    """Each row of a report table as {column: its cell as printed} (json: as parsed)."""
    if fmt == "json":
        return json.loads(text)
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(text)))
    if fmt == "md":
        lines = [[c.strip() for c in line.strip().strip("|").split("|")]
                 for line in text.splitlines()]
        lines.pop(1)  # the alignment row
    else:  # latex: the header and the rows, each ending in \\
        lines = [[c.strip() for c in line.removesuffix("\\\\").split("&")]
                 for line in text.splitlines() if line.endswith("\\\\")]
    return [dict(zip(lines[0], row)) for row in lines[1:]]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    """(Gaussian, uniform) certify files of the same 4 images, σ = 0.25, n = 300."""
    folder = tmp_path_factory.mktemp("norms")
    for noise in ("gaussian", "uniform"):
        certify_dataset(str(FIXTURES / "checkpoint_v1.pt"), load_dataset("digits", "test"),
                        noise=noise, n0=20, n=300, batch=1000, skip=90, max_count=4,
                        out=folder / f"{noise}.tsv")
    return folder / "gaussian.tsv", folder / "uniform.tsv"


def acr(path: Path, column: str) -> float:
    r = read_records(path)
    return float(np.mean(np.where(r["correct"] == 1, r[column], 0.0)))


def accuracy(path: Path, column: str, radius: float) -> float:
    r = read_records(path)
    return float(np.mean((r["correct"] == 1) & (r[column] >= radius)))


@pytest.mark.parametrize("fmt", ["md", "csv", "latex", "json"])
@pytest.mark.parametrize("group, unit", [(L2_BEFORE, None), (L1_BEFORE, "ℓ1")])
def test_old_files_report_the_cells_they_did(fmt, group, unit):
    # The golden text is the output of the code before the radius columns (commit 9a6dbf5), of
    # all BEFORE files in one table: each norm's table prints the same cells for its files.
    golden = cells((FIXTURES / "reports" / f"before_radii.{fmt}").read_text(encoding="utf-8"),
                   fmt)
    old_rows = {row["name"]: row for row in golden}
    rows = cells(report(group, RADII, fmt=fmt), fmt)
    assert len(rows) == len(group) and all(row["name"] in old_rows for row in rows)
    unit_key = UNIT_COLUMN[0] if fmt in ("csv", "json") else UNIT_COLUMN[1]
    for row in rows:
        old = old_rows[row["name"]]
        assert set(row) - set(old) == ({unit_key} if unit else set())
        assert set(old) - set(row) <= OPTIONAL
        assert {k: v for k, v in row.items() if k in old} == {k: old[k] for k in row if k in old}
        if unit:
            assert row[unit_key] == ("$\\ell_1$" if fmt == "latex" else unit)


def test_old_files_report_through_the_cli_and_their_mix_of_norms_is_refused(capsys):
    assert main(["report", *map(str, L2_BEFORE)]) == 0
    assert capsys.readouterr().out == report(L2_BEFORE, RADII)
    assert main(["report", *map(str, BEFORE)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "different norms (ℓ2: " in err


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_norm_reads_each_files_column_of_that_norm(files, norm):
    table = json.loads(report(files, RADII, fmt="json", norm=norm))
    for path, row in zip(files, table):
        assert row["radius_in"] == {"l1": "ℓ1", "l2": "ℓ2", "linf": "ℓ∞"}[norm]
        assert row["acr"] == pytest.approx(acr(path, f"radius_{norm}"), rel=1e-12)
        for r in (0.0, 0.25, 0.5):
            assert row[f"r={r:g}"] == accuracy(path, f"radius_{norm}", r)


def test_linf_heading_and_values_in_markdown(files):
    gaussian = read_records(files[0])
    assert gaussian["radius_linf"] == pytest.approx(gaussian["radius"] / 8, rel=1e-12)
    md = report(files, "0,0.01,0.02", norm="linf").splitlines()
    assert md[0] == "| name | radius in | n | clean acc | abstain | ACR | r=0 | r=0.01 | r=0.02 |"
    assert md[2].startswith("| gaussian | ℓ∞ | 4 | 25.0% | 25.0% | "
                            f"{acr(files[0], 'radius_linf'):.3f} | 25.0% | ")
    assert md[3].startswith("| uniform | ℓ∞ | 4 | ")


def test_without_norm_each_file_reads_its_noises_radius_as_before(files):
    # one file at a time: files of two norms share no table without --norm (issue 45)
    plain = [json.loads(report([path], RADII, fmt="json"))[0] for path in files]
    assert UNIT_COLUMN[0] not in plain[0]  # ℓ2: Cohen et al.'s table, as it was
    assert plain[1][UNIT_COLUMN[0]] == "ℓ1"  # any other norm is said
    assert plain[0]["acr"] == acr(files[0], "radius") == acr(files[0], "radius_l2")
    assert plain[1]["acr"] == acr(files[1], "radius") == acr(files[1], "radius_l1")
    # the primary norm named explicitly gives the same numbers, with the norm said
    gauss_l2 = json.loads(report(files[:1], RADII, fmt="json", norm="l2"))[0]
    uniform_l1 = json.loads(report(files[1:], RADII, fmt="json", norm="l1"))[0]
    assert {**gauss_l2, "radius_in": None} == {**plain[0], "radius_in": None}
    assert {**uniform_l1, "radius_in": None} == {**plain[1], "radius_in": None}


def test_an_old_file_reads_its_primary_norm_from_radius():
    for path, norm in ((OLD / "v4_certify_gaussian.tsv", "l2"),
                       (OLD / "v1_certify_uniform.tsv", "l1")):
        plain = json.loads(report([path], RADII, fmt="json"))[0]
        named = json.loads(report([path], RADII, fmt="json", norm=norm))[0]
        assert named.pop("radius_in") == {"l1": "ℓ1", "l2": "ℓ2"}[norm]
        assert plain.pop("radius_in", "ℓ1") == "ℓ1"  # said without --norm where not ℓ2
        assert named == plain


@pytest.mark.parametrize("path, norm", [(OLD / "v4_certify_gaussian.tsv", "linf"),
                                        (OLD / "v4_certify_uniform.tsv", "l2"),
                                        (FIXTURES / "corpus" / "step4_fixed_n.tsv", "l1")])
def test_an_old_file_in_another_norm_is_refused_with_how_to_get_it(path, norm):
    with pytest.raises(SmoothcertError, match=f"has no radius_{norm} column .* re-certify it to "
                                              "report .* radii, or report it without --norm"):
        report([path], RADII, norm=norm)


def test_the_cli_refuses_an_old_file_in_another_norm_in_one_line(capsys):
    assert main(["report", str(OLD / "v4_certify_gaussian.tsv"), "--norm", "linf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "re-certify" in err


def test_a_bad_norm_is_one_line_exit_2(files, capsys):
    assert main(["report", str(files[0]), "--norm", "l3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'l3'" in err and "linf" in err
    with pytest.raises(SmoothcertError, match="unknown norm 'l3'; choose one of l2, l1, linf"):
        report(files, RADII, norm="l3")


def test_predict_files_pass_and_attack_files_are_l2(files):
    table = json.loads(report([files[0], OLD / "v4_predict_uniform.tsv"], RADII, fmt="json",
                              norm="linf"))
    assert table[1]["acr"] is None and table[1]["radius_in"] == "ℓ∞"
    assert "v4_attack" in report([OLD / "v4_attack.tsv"], RADII, norm="l2")
    with pytest.raises(SmoothcertError, match="attack distances, which are ℓ2"):
        report([OLD / "v4_attack.tsv"], RADII, norm="linf")


def test_envelope_common_agreement_and_intervals_use_the_chosen_norm(files, tmp_path):
    table = json.loads(report(files, RADII, fmt="json", norm="linf", envelope=True))
    envelope = table[-1]
    assert envelope["name"] == "envelope" and envelope["radius_in"] == "ℓ∞"
    for r in (0.0, 0.01, 0.02):
        best = max(accuracy(p, "radius_linf", r) for p in files)
        assert json.loads(report(files, [r], fmt="json", norm="linf",
                                 envelope=True))[-1][f"r={r:g}"] == best
    # --common: a file of the first 2 images against the 4
    short = tmp_path / "short.tsv"
    short.write_text("".join(files[0].read_text().splitlines(keepends=True)[:3]))
    manifest = json.loads(manifest_path(files[0]).read_text())
    manifest_path(short).write_text(json.dumps(manifest))
    common = json.loads(report([short, files[1]], RADII, fmt="json", norm="linf", common=True))
    assert common[1]["n"] == 2
    agreement = json.loads(main_json(["report", str(files[0]), str(files[1]), "--agreement",
                                      "--norm", "linf", "--radii", "0.005", "--format", "json"]))
    g, u = (in_norm(read_records(p), "linf") for p in files)
    assert agreement[0]["acr_difference"] == pytest.approx(
        acr(files[1], "radius_linf") - acr(files[0], "radius_linf"), rel=1e-12)
    interval = acr_difference(g, u, resamples=100, seed=0)
    assert interval.estimate == pytest.approx(agreement[0]["acr_difference"], rel=1e-12)


def main_json(argv) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


def test_the_plot_says_the_norm_and_marks_the_n_limit_in_it(files):
    from scipy.stats import norm as gauss

    from smoothcert.evaluation.plots import certified_accuracy_figure, n_limited_radius

    records = in_norms([read_records(files[0])], "linf")
    fig = certified_accuracy_figure(records, norm="linf")
    assert fig.axes[0].get_xlabel() == "L∞ radius"
    limit = 0.25 * gauss.ppf(0.001 ** (1 / 300))
    assert n_limited_radius(records[0], "linf") == pytest.approx(limit / 8, rel=1e-12)
    assert n_limited_radius(records[0]) == pytest.approx(limit, rel=1e-12)


class PatchCertifier(Certify):
    """A stand-in for a certifier whose radius is a patch side (ABLCERT's ablation)."""

    def radius_norm(self):
        return "patch side, pixels"


@pytest.fixture
def patch_file(files, tmp_path, monkeypatch) -> Path:
    """The Gaussian file, its manifest naming a certifier whose radius is a patch side."""
    monkeypatch.setitem(CERTIFIERS, "test-patch", PatchCertifier)
    path = tmp_path / "patch.tsv"
    shutil.copy(files[0], path)
    manifest = json.loads(manifest_path(files[0]).read_text())
    manifest["identity"]["certifier"] = "test-patch"
    manifest_path(path).write_text(json.dumps(manifest))
    return path


def test_a_certifiers_own_unit_is_said_and_refuses_norm(files, patch_file):
    from smoothcert.evaluation.plots import certified_accuracy_figure

    assert Certify().radius_norm() is None  # the noise's norm
    table = json.loads(report([patch_file, files[1]], RADII, fmt="json"))
    assert [row["radius_in"] for row in table] == ["patch side, pixels", "ℓ1"]
    assert table[0]["acr"] == acr(patch_file, "radius")  # read as it is
    fig = certified_accuracy_figure([read_records(patch_file)])
    assert fig.axes[0].get_xlabel() == "radius (patch side, pixels)"
    both = certified_accuracy_figure([read_records(patch_file), read_records(files[1])])
    assert both.axes[0].get_xlabel() == "radius (units differ by file)"
    # what compares the files radius by radius needs one unit (issue 45)
    for flag, call in (("--envelope", lambda: report([patch_file, files[1]], RADII,
                                                     envelope=True)),
                       ("--agreement", lambda: agreement_report([patch_file, files[1]], RADII))):
        with pytest.raises(SmoothcertError) as caught:
            call()
        assert str(caught.value) == (
            f"{flag} compares the files radius by radius, but their radii are in different "
            f"units (patch side, pixels: {patch_file}; ℓ1: {files[1]}); drop {flag} or report "
            "them separately")
    from smoothcert.evaluation.plots import cost_figure

    two = [read_records(patch_file), read_records(files[1])]
    with pytest.raises(SmoothcertError, match="^--envelope compares the files radius by"):
        certified_accuracy_figure(two, envelope=True)
    with pytest.raises(SmoothcertError, match="^--plot-cost compares the files radius by"):
        cost_figure(two, 1.0)
    # and the ℓp files beside it one norm: no --norm reads the patch file
    with pytest.raises(SmoothcertError, match=r"different norms \(patch side, pixels: .*; ℓ2: "
                                              r".*; ℓ1: .*\).* no --norm reads every file"):
        report([patch_file, *files], RADII)
    with pytest.raises(SmoothcertError, match="patch.tsv certifies patch side, pixels, not an "
                                              "ℓp radius; report it without --norm"):
        report([patch_file], RADII, norm="l2")


def test_the_unit_column_is_defined_in_report_help(capsys):
    assert main(["report", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f" {UNIT_COLUMN[1]} " in help_text and "--norm {l2,l1,linf}" in help_text


def test_in_norm_leaves_the_other_columns(files):
    records = read_records(files[1])
    linf = in_norm(records, "linf")
    assert linf["radius"].tolist() == records["radius_linf"].tolist()
    assert {k: v.tolist() for k, v in linf.data.items() if k != "radius"} == \
        {k: v.tolist() for k, v in records.data.items() if k != "radius"}
    assert in_norm(records, None) is records
    assert dataclasses.replace(linf, data=records.data) == records
