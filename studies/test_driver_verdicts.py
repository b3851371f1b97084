"""The verdict rule of studies/driver.py (:func:`driver.judge`): each word on intervals built by
hand at the rule's boundaries, the claimed direction, the summary line of a claim, and one
verdict table written from two tiny record files in Cohen's format. No training; under a
second."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # studies/driver.py
import driver  # noqa: E402
from driver import Comparison, judge, summary  # noqa: E402


def interval(low, high, estimate=None):
    return SimpleNamespace(low=low, high=high,
                           estimate=(low + high) / 2 if estimate is None else estimate)


@pytest.mark.parametrize("low, high, word", [
    (0.01, 0.05, "reproduced"),        # entirely above 0
    (-0.05, -0.01, "not reproduced"),  # entirely below
    (-0.01, 0.015, "tie"),             # covers 0, inside (−δ, δ) with δ = 0.02
    (-0.005, 0.035, "underpowered"),   # covers 0 and reaches δ (threat-models' ℓ∞ r=0.005)
    (-0.03, 0.01, "underpowered"),     # reaches −δ: an effect of δ against is not excluded
    (0.0, 0.05, "underpowered"),       # a bound at exactly 0 covers 0
    (-0.01, 0.02, "underpowered"),     # H = δ is not below δ
    (0.0, 0.0, "tie"),                 # the degenerate interval of identical files
])
def test_each_word_for_a_claimed_increase(low, high, word):
    assert judge(interval(low, high), effect=0.02).word == word


def test_a_claimed_decrease_mirrors_the_interval():
    assert judge(interval(-0.05, -0.01), 0.02, "less").word == "reproduced"
    assert judge(interval(0.01, 0.05), 0.02, "less").word == "not reproduced"
    assert judge(interval(-0.03, 0.01), 0.02, "less").word == "underpowered"
    assert judge(interval(-0.01, 0.01), 0.02, "less").word == "tie"


def test_a_claimed_equality_needs_the_interval_inside_the_margin():
    assert judge(interval(-0.01, 0.01), 0.02, "equal").word == "reproduced"
    assert judge(interval(0.02, 0.05), 0.02, "equal").word == "not reproduced"
    assert judge(interval(-0.35, -0.25), 0.02, "equal").word == "not reproduced"
    assert judge(interval(0.01, 0.05), 0.02, "equal").word == "underpowered"


def test_no_margin_never_gives_a_tie():
    assert judge(interval(-0.001, 0.001), 0.0).word == "underpowered"
    assert judge(interval(0.0, 0.0), 0.0).word == "underpowered"


def test_detectable_is_the_half_width_and_the_cell_reports_it():
    v = judge(interval(-0.032, 0.048, 0.008), effect=0.008)  # ACES h01 at r = 0, 125 images
    assert v.word == "underpowered" and v.detectable == pytest.approx(0.040)
    assert v.cell() == "+0.008 [-0.032, +0.048] underpowered (detects ±0.040)"
    assert judge(interval(0.01, 0.05, 0.03), 0.02).cell(100, 1) == "+3.0 [+1.0, +5.0] reproduced"


def test_bad_claims_and_margins_are_refused():
    with pytest.raises(ValueError, match="claimed must be one of"):
        judge(interval(0, 1), 0.02, "more")
    with pytest.raises(ValueError, match="effect >= 0"):
        judge(interval(0, 1), -0.02)
    with pytest.raises(ValueError, match="low <= high"):
        judge(interval(1, 0), 0.02)


def test_summary_groups_the_words_of_one_claim():
    found = {"ACR": judge(interval(0.009, 0.011), 0.001),
             "r=0.005": judge(interval(-0.005, 0.035), 0.02),
             "r=0.02": judge(interval(0.005, 0.07), 0.02)}
    assert summary(found) == "reproduced at ACR, r=0.02; underpowered at r=0.005 (±0.020)"
    assert summary({k: found[k] for k in ("ACR", "r=0.02")}) == "reproduced"
    assert summary({"r=0": found["r=0.005"]}) == "underpowered at r=0 (±0.020)"


def test_combine_words_a_claim_that_rests_on_several_intervals():
    up, down = judge(interval(0.01, 0.05), 0.02), judge(interval(-0.05, -0.01), 0.02)
    tie, wide = judge(interval(-0.01, 0.01), 0.02), judge(interval(-0.03, 0.05), 0.02)
    assert driver.combine([up, up, tie]) == "tie"
    assert driver.combine([up, wide, tie]) == "underpowered"
    assert driver.combine([up, wide, down]) == "not reproduced"
    assert driver.combine([up, up]) == driver.combine([up, wide], "any") == "reproduced"
    assert driver.combine([down, tie], "any") == "tie"
    assert driver.combine([down, down], "any") == "not reproduced"
    assert driver.combine([]) == "—"


def test_an_older_verdict_tuple_is_a_default_comparison():
    c = driver.as_comparison(("block", "l1", "a", "b", [0.5, 1.0]))
    assert c == Comparison("block", "a", "b", (0.5, 1.0), "l1")
    assert c.claim_at(0.5) == ("greater", driver.ACCURACY_EFFECT)
    aces = Comparison("v", "a", "b", (0.0, 0.25), claimed="less", at={0.0: ("greater", 0.008)})
    assert aces.claim_at(0.0) == ("greater", 0.008) and aces.claim_at(0.25)[0] == "less"
    assert aces.margins(0.046) == "< δ 0.02, ACR δ 0.046; r=0: > δ 0.008"


def cohen_file(path: Path, radii: list[float]) -> None:
    """A record file in Cohen et al.'s format: image i of label 0, predicted 0 (correct)
    with ``radii[i]``, or −1 (abstain) where the radius is 0."""
    rows = ["idx\tlabel\tpredict\tradius\tcorrect\ttime"]
    rows += [f"{i}\t0\t{0 if r > 0 else -1}\t{r}\t{int(r > 0)}\t0:00:01.0"
             for i, r in enumerate(radii)]
    path.write_text("\n".join(rows) + "\n")


def test_write_verdicts_judges_two_record_files(tmp_path):
    (tmp_path / "records").mkdir()
    cohen_file(tmp_path / "records" / "first.tsv", [0.5] * 20)
    cohen_file(tmp_path / "records" / "second.tsv", [1.0] * 20)  # every radius doubled
    doc = tmp_path / "README.md"
    doc.write_text("<!-- report:v -->\n<!-- /report:v -->\n")
    found = driver.write_verdicts(tmp_path, doc, [Comparison("v", "first", "second", (0.75,))])
    judged = found["first", "second"]
    assert judged["ACR"].word == "reproduced" and judged["ACR"].estimate == pytest.approx(0.5)
    assert judged["ACR"].effect == pytest.approx(0.05 * 0.5)  # ACR_SHARE of the first's ACR
    assert judged["r=0.75"].word == "reproduced"  # 0% to 100% of the images
    row = driver.generated_block(doc.read_text(), "v")[2]
    assert row.startswith("| second − first | 20 | > δ 0.02, ACR δ 0.025 | +0.500 ")
