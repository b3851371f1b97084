"""The ablation certifier against the authors' code: numbers recorded from alevine0/patchSmoothing
(``utils_band.py``, ``utils_block.py``: ``predict_and_certify``, ``random_mask_batch_one_sample``)
and alevine0/randomizedAblation (``utils.py: population_radius_for_majority``), run unchanged on
the CPU by ``tests/fixtures/patchsmoothing/make_fixtures.py`` (its docstring says how)."""

import json
from pathlib import Path

import pytest
import torch
from test_ablation import Net64, encoded

from smoothcert.runs import certify_dataset
from smoothcert.smoothing.ablation import Ablation
from smoothcert.stats.ablation import l0_radius, patch_certified, patch_delta, patch_radius, top_two

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "patchsmoothing" /
                     "golden.json").read_text())


@pytest.mark.parametrize("run", GOLDEN["counts"],
                         ids=lambda r: f"{r['mode']}-b{r['size']}-m{r['m']}")
def test_prediction_and_certificate_of_count_vectors(run):
    # Ties between the top two, top and runner-up in either index order, gaps of exactly 2Δ.
    for counts, predict, certified in zip(GOLDEN["counts_cases"], run["predict"],
                                          run["certified"], strict=True):
        t = top_two(counts)
        assert t.top == predict, counts
        assert patch_certified(t, patch_delta(run["mode"], run["m"], run["size"])) == certified
        side = 28  # the fixtures' 28×28 images
        assert (patch_radius(t, run["mode"], run["size"], side) >= run["m"]) == certified


def test_count_vectors_cover_ties_and_both_outcomes():
    flags = {f for run in GOLDEN["counts"] for f in run["certified"]}
    assert flags == {True, False}
    assert any(sorted(c)[-1] == sorted(c)[-2] for c in GOLDEN["counts_cases"])


def _net_rows(mode, size, threshold):
    net = GOLDEN["net"]
    model = encoded(Net64(net["weight"], net["bias"]), shape=(1, 8, 8))
    xs = torch.tensor(net["images"])
    data = torch.utils.data.TensorDataset(xs, torch.zeros(len(xs), dtype=torch.long))
    return certify_dataset(model, data, certifier="ablation", num_classes=10, batch=64,
                           options={"mode": mode, "size": size, "threshold": threshold})


def test_end_to_end_on_the_authors_network_and_images():
    # Masks, encoding, threshold votes and the rule together: a fixed linear network of the
    # authors' 2-channel encoding on 8×8 images, certified by their code and by ours.
    cache, checked = {}, 0
    for run in GOLDEN["net"]["runs"]:
        key = (run["mode"], run["size"], run["threshold"])
        if key not in cache:
            cache[key] = _net_rows(*key)
        rows = cache[key]
        assert [r["predict"] for r in rows] == run["predict"], run
        assert [r["radius"] >= run["m"] for r in rows] == run["certified"], run
        checked += sum(run["certified"])
    assert checked > 0


@pytest.mark.parametrize("case", GOLDEN["masks"],
                         ids=lambda c: f"{c['mode']}-b{c['size']}-{c['position']}")
def test_masks_equal_the_authors_at_fixed_positions(case):
    shape = (1, 5, 7)  # not square: rows and columns cannot be swapped unseen
    position = case["position"][0] if case["mode"] == "column" else \
        case["position"][0] * shape[2] + case["position"][1]
    mask = Ablation(case["mode"], case["size"]).sweep_masks(shape, position, 1)[0]
    assert mask.int().tolist() == case["kept"]


@pytest.mark.parametrize("case", GOLDEN["l0"], ids=lambda c: f"d{c['d']}-k{c['keep']}")
def test_l0_radius_equals_the_authors(case):
    # The authors write radius 0 both for p_lower <= 1/2 (no certificate) and for a class
    # certified at x with no pixel: ours says None for the first.
    for p, radius in zip(case["p_lower"], case["radius"], strict=True):
        ours = l0_radius(p, case["d"], case["keep"])
        assert (0 if ours is None else ours) == radius, p
        assert (ours is None) == (p <= 0.5)
