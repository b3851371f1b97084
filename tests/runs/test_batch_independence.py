"""Records do not depend on --batch: noise is drawn in canonical chunks (``sampling.CHUNK``).

Each example's draws are cut into chunks of a fixed size, whatever the forward batch, so every
certifier gives the same rows (``time`` aside) for every batch size, ``batch`` leaves the run
identity, a finished run grows with a larger ``--max``, and the record files from before the
chunks were fixed (identity with ``batch``: chunks of that batch) still resume and grow in their
own chunks. (Old files of every version: ``tests/test_upgrade.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from smoothcert import Gaussian, certify_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.rng import example_generator
from smoothcert.runs.records import manifest_path, merge_records, read_manifest, read_records
from smoothcert.smoothing.engine import CHUNK, BatchedVotes
from smoothcert.smoothing.smoothed import Smoothed
from smoothcert.upgrade import MANIFEST_VERSION

pytestmark = pytest.mark.usefixtures("one_thread")

BATCHES = (7, 100, 1000)  # below, near and at the chunk; none divides CHUNK = 1024
N = 2 * CHUNK + 452  # 2 full chunks and a short one, so chunks straddle every batch size
RUN = dict(sigma=0.5, num_classes=4, n0=100, n=N, alpha=0.001, seed=7, skip=60)
CERTIFIERS = {
    "certify": {},
    "predict": {},
    "sequential": {"radii": "0,0.25,0.5"},
    "data-dependent": {"num_steps": 3},
}


class Linear25(nn.Module):
    """A fixed random linear map of 1×5×5 inputs to 4 classes: every class gets votes. An input
    of 25 values matters: on the CPU ``normal_`` fills 16 values at a time and redraws a call's
    last 16 when its size is not a multiple of 16, so only draws of such sizes (25·k for k not a
    multiple of 16) show how the calls are cut; 8×8 or 28×28 inputs would hide it."""

    input_shape = (1, 5, 5)

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(25, 4, generator=torch.Generator().manual_seed(3)))

    def forward(self, x):
        return x.flatten(1) @ self.w


@pytest.fixture(scope="module")
def model():
    return Linear25().eval()


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.rand(400, 1, 5, 5, generator=g),
                                          torch.randint(0, 4, (400,), generator=g))


def timeless(rows):
    """Rows without ``time``, in idx order (the sequential certifier finishes out of order)."""
    return sorted(({k: v for k, v in r.items() if k != "time"} for r in rows),
                  key=lambda r: r["idx"])


@pytest.mark.parametrize("certifier", sorted(CERTIFIERS))
def test_records_are_the_same_for_every_batch_size(model, data, certifier):
    runs = [timeless(certify_dataset(model, data, **RUN, max_count=5, batch=b,
                                     certifier=certifier, options=CERTIFIERS[certifier]))
            for b in BATCHES]
    assert len(runs[0]) == 5
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_votes_and_soft_scores_read_the_same_stream_for_every_batch_size():
    # A model whose logits are so far apart that each softmax is exactly one-hot: its soft
    # scores times n are its votes, draw for draw, if both cut the same chunks.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    model[1].weight.data *= 1e6
    x, engine = torch.rand(1, 3, 4), BatchedVotes()

    def generator():
        return torch.Generator().manual_seed(5)

    votes = [engine.votes(model, x, Gaussian(0.5), N, 3, b, generator()) for b in BATCHES]
    soft = [engine.soft_scores(model, x, Gaussian(0.5), N, 3, b, generator()) * N
            for b in BATCHES]
    assert min(votes[0]) > 0  # every class is drawn: a shifted stream would change the counts
    for v, s in zip(votes, soft, strict=True):
        assert v.tolist() == votes[0].tolist() == s.round().long().tolist()
    assert torch.equal(votes[0], engine.votes(model, x, Gaussian(0.5), N, 3, N, generator()))


def test_batch_leaves_the_identity_and_a_run_resumes_with_another(model, data, tmp_path):
    out = tmp_path / "r.tsv"
    certify_dataset(model, data, **RUN, max_count=3, batch=7, out=out)
    identity = read_manifest(out)["identity"]
    assert "batch" not in identity and "max_count" not in identity
    assert identity["chunk"] == CHUNK
    grown = certify_dataset(model, data, **RUN, max_count=6, batch=1000, out=out)
    fresh = certify_dataset(model, data, **RUN, max_count=6, batch=100)
    assert timeless(grown) == timeless(fresh)
    assert read_manifest(out)["indices"]["max_count"] == 6  # merge checks coverage against it
    assert read_manifest(out)["identity"] == identity


def test_a_smaller_max_is_refused_and_changes_nothing(model, data, tmp_path):
    out = tmp_path / "r.tsv"
    certify_dataset(model, data, **RUN, max_count=4, batch=100, out=out)
    before = out.read_bytes(), manifest_path(out).read_bytes()
    with pytest.raises(SmoothcertError, match="--max 4 or more"):
        certify_dataset(model, data, **RUN, max_count=3, batch=100, out=out)
    assert (out.read_bytes(), manifest_path(out).read_bytes()) == before


def test_extended_shards_merge_to_the_extended_run(model, data, tmp_path):
    out = tmp_path / "s.tsv"
    for max_count in (3, 7):
        paths = [tmp_path / f"s.shard{k}-of-2.tsv" for k in range(2)]
        for k in range(2):
            certify_dataset(model, data, **RUN, max_count=max_count, batch=100,
                            out=out, shard=(k, 2))
    merged = merge_records(paths, tmp_path / "merged.tsv")
    whole = certify_dataset(model, data, **RUN, max_count=7, batch=1000)
    assert timeless(read_records(merged).rows()) == timeless(whole)


def test_shards_grown_to_different_maxima_are_not_merged(model, data, tmp_path):
    out = tmp_path / "s.tsv"
    paths = [tmp_path / f"s.shard{k}-of-2.tsv" for k in range(2)]
    for k, max_count in ((0, 3), (1, 3), (0, 7)):  # only shard 0 grown to --max 7
        certify_dataset(model, data, **RUN, max_count=max_count, batch=100, out=out,
                        shard=(k, 2))
    with pytest.raises(SmoothcertError, match=r"s.shard1-of-2.tsv covers other indices "
                       r"\(--skip 60 --max 3\) than .*s.shard0-of-2.tsv \(--skip 60 --max 7\)"):
        merge_records(paths, tmp_path / "merged.tsv")
    assert not (tmp_path / "merged.tsv").exists()


def version_1_copy(path: Path, dest: Path, batch: int, max_count: int, rows: int) -> Path:
    """``path``'s first ``rows`` rows with a manifest of version 1, before fixed chunks:
    ``batch`` and ``max_count`` in the identity, no ``chunk``, the certifier named ``task``."""
    manifest = json.loads(manifest_path(path).read_text())
    del manifest["format_version"]
    identity = manifest["identity"]
    del identity["chunk"], identity["engine"], identity["indices"], identity["noise"]
    identity.update(batch=batch, max_count=max_count, task=identity.pop("certifier"))
    manifest_path(dest).write_text(json.dumps(manifest))
    lines = path.read_text().splitlines(keepends=True)
    dest.write_text("".join(lines[:1 + rows]))
    return dest


def test_an_old_file_resumes_and_grows_with_its_own_chunks_and_any_batch(model, data,
                                                                         tmp_path):
    # Before fixed chunks, a run with --batch 50 drew chunks of 50 (what chunk=50 draws now):
    # its file, resumed with --batch 1000, must go on drawing chunks of 50, also for the
    # examples a larger --max adds.
    kwargs = dict(**RUN, max_count=4)
    new_rule = certify_dataset(model, data, **kwargs, batch=50, out=tmp_path / "n.tsv")
    old = version_1_copy(tmp_path / "n.tsv", tmp_path / "old.tsv", batch=50, max_count=4,
                         rows=0)
    resumed = certify_dataset(model, data, **kwargs, batch=1000, out=old)
    smoothed = Smoothed(model, Gaussian(RUN["sigma"]), 4, BatchedVotes(chunk=50))

    def drawn_in_chunks_of_50(rows):  # the old engine: one input at a time, chunks = batch
        for row in rows:
            c = smoothed.certify(data[int(row["idx"])][0], RUN["n0"], N, RUN["alpha"], 50,
                                 example_generator(RUN["seed"], int(row["idx"]), "cpu"))
            assert (row["nA"], row["p_lower"]) == (c.count, c.p_lower)

    drawn_in_chunks_of_50(resumed)
    assert timeless(resumed) != timeless(new_rule)  # the chunks matter: the rule is needed
    assert "batch" in json.loads(manifest_path(old).read_text())["identity"]  # file unchanged
    grown = certify_dataset(model, data, **{**kwargs, "max_count": 5}, batch=7, out=old)
    assert timeless(grown)[:4] == timeless(resumed) and len(grown) == 5
    drawn_in_chunks_of_50(grown[4:])
    rewritten = json.loads(manifest_path(old).read_text())  # now in the current format
    assert rewritten["identity"]["chunk"] == 50 and rewritten["indices"]["max_count"] == 5
    assert "batch" not in rewritten["identity"] and rewritten["format_version"] == MANIFEST_VERSION
