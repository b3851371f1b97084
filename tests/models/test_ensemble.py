"""Ensembles (models/ensemble.py): one checkpoint twice certifies as the checkpoint alone; the
identity holds every member; K-consensus with K = all members is the ensemble itself, with K
smaller it skips member evaluations and certifies the consensus classifier; exact consensus
skips members without changing a vote; bad inputs are one line."""

import json

import pytest
import torch
from torch import nn

from conftest import Halfspace, write_checkpoint
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.model_calls import engine_call
from smoothcert.models import build_model
from smoothcert.models.checkpoint import save_checkpoint, versions
from smoothcert.models.ensemble import Ensemble
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import read_manifest

RUN = dict(sigma=0.25, n0=20, n=300, alpha=0.001, batch=128, seed=4, skip=40)


def without_time(rows):
    """The rows without the cost columns (time; member_passes, which only ensembles have)."""
    return [{k: v for k, v in r.items() if k not in ("time", "member_passes")} for r in rows]


def member(path, seed, dataset="digits", scale=1.0):
    """A digits_cnn checkpoint initialised from ``seed`` (different members, same layout), its
    last layer's weights times ``scale`` (a large scale: confident softmaxes)."""
    torch.manual_seed(seed)
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5])
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(scale)
    meta = {"arch": "digits_cnn", "dataset": dataset, "num_classes": 10, "input_shape": [1, 8, 8],
            "mean": [0.5], "std": [0.5], "noise": {"name": "gaussian", "sigma": 0.25},
            "method": {"name": "gaussian", "hparams": {}}, "epoch": 0, "versions": versions(),
            "config": {}}
    return save_checkpoint(path, model, meta)


@pytest.mark.parametrize("mode", ["logits", "softmax"])
def test_one_checkpoint_twice_certifies_as_the_checkpoint_alone(tmp_path, mode):
    ck = write_checkpoint(tmp_path / "m.pt")
    data = load_dataset("digits", "test")
    alone = certify_dataset(ck, data, **RUN)
    twice = certify_dataset(Ensemble.from_checkpoints([ck, ck], mode), data, **RUN,
                            out=tmp_path / "e.tsv")
    assert len(alone) == 9 and without_time(twice) == without_time(alone)
    assert [r["member_passes"] for r in twice] == [2 * (20 + 300)] * 9  # two members, n0 + n
    assert "member_passes" not in alone[0]
    identity = read_manifest(tmp_path / "e.tsv")["identity"]
    sha = identity["ensemble"]["members"][0]
    assert identity["ensemble"] == {"members": [sha, sha], "mode": mode, "consensus": None}
    assert identity["checkpoint_sha256"] != sha  # the ensemble's own fingerprint


def test_a_resumed_ensemble_refuses_another_mode_or_member(tmp_path):
    a, b = member(tmp_path / "a.pt", 1), member(tmp_path / "b.pt", 2)
    data = load_dataset("digits", "test")
    out = tmp_path / "e.tsv"
    certify_dataset(Ensemble.from_checkpoints([a, b]), data, **{**RUN, "skip": 120}, out=out)
    for other in (Ensemble.from_checkpoints([a, b], "softmax"), Ensemble.from_checkpoints([b, a]),
                  Ensemble.from_checkpoints([a, b], consensus=2)):
        with pytest.raises(SmoothcertError, match="checkpoint_sha256|ensemble"):
            certify_dataset(other, data, **{**RUN, "skip": 120}, out=out)


def test_logits_mode_is_the_mean_and_softmax_mode_the_log_mean_probability():
    members = [nn.Linear(4, 3) for _ in range(3)]
    x = torch.randn(5, 4)
    outs = torch.stack([m(x) for m in members])
    with torch.no_grad():
        assert torch.allclose(Ensemble(members)(x), outs.mean(0))
        assert torch.allclose(Ensemble(members, "softmax")(x).exp(),
                              outs.softmax(dim=2).mean(0), atol=1e-6)


def halfspaces(biases):
    w = torch.zeros(1, 4, 4)
    w[0, 0, 0] = 1.0
    return [Halfspace(w, b=b, input_shape=(1, 4, 4)) for b in biases]


def test_consensus_of_all_members_is_the_ensemble_itself():
    """K = M: where all members agree their class is the mean's argmax, elsewhere the mean
    decides, so the outputs are the plain ensemble's (nothing is skipped either)."""
    x = torch.zeros(2000, 1, 4, 4)
    x[:, 0, 0, 0] = torch.linspace(-1, 1, 2000)
    plain = Ensemble(halfspaces([0.0, 0.1, 0.1]))
    same = Ensemble(halfspaces([0.0, 0.1, 0.1]), consensus=3)
    with torch.no_grad():
        assert torch.equal(plain(x).argmax(1), same(x).argmax(1))
        assert torch.equal(plain(x), same(x))


def test_consensus_skips_later_members_where_the_first_agree():
    x = torch.zeros(1000, 1, 4, 4)
    x[:, 0, 0, 0] = torch.linspace(-1, 1, 1000)
    full = Ensemble(halfspaces([0.0, 0.05, 0.05]))
    fast = Ensemble(halfspaces([0.0, 0.05, 0.05]), consensus=2)
    with torch.no_grad():
        votes_full, votes_fast = full(x).argmax(1), fast(x).argmax(1)
    # the first two disagree only on 0 < x0 ≤ 0.05: there all three run, elsewhere two
    assert torch.equal(votes_full, votes_fast)  # the third member is the second's copy
    assert full.evaluations == 3000 and fast.evaluations < 2 * 1000 + 0.05 * 1000


def test_a_smaller_consensus_certifies_the_consensus_classifier():
    """Members 1 and 2 vote class 0 by a little, member 3 class 1 by a lot: the mean says 1,
    the 2-consensus says 0 — another base classifier, as the module doc states."""
    class Fixed(nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.register_buffer("logits", torch.tensor(logits))

        def forward(self, x):
            return self.logits.expand(len(x), -1)

    members = [Fixed([0.1, 0.0]), Fixed([0.1, 0.0]), Fixed([0.0, 5.0])]
    x = torch.zeros(3, 2)
    assert Ensemble(members)(x).argmax(1).tolist() == [1, 1, 1]
    assert Ensemble(members, consensus=2)(x).argmax(1).tolist() == [0, 0, 0]
    assert Ensemble(members, consensus=3)(x).argmax(1).tolist() == [1, 1, 1]


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(consensus=0), "an integer K in 1..2"),
    (dict(consensus=3), "an integer K in 1..2"),
    (dict(consensus=True), "an integer K in 1..2"),
    (dict(consensus="all"), "consensus must be 'exact' or an integer K"),
    (dict(consensus="exact"), "exact consensus needs the softmax mode"),
    (dict(mode="median"), "ensemble mode must be one of logits, softmax"),
])
def test_bad_ensemble_options_are_refused(kwargs, match):
    with pytest.raises(SmoothcertError, match=match):
        Ensemble([nn.Linear(2, 2), nn.Linear(2, 2)], **kwargs)
    with pytest.raises(SmoothcertError, match="one or more nn.Module members"):
        Ensemble(["not a module"])


def test_cli_certifies_an_ensemble_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    a, b = member(tmp_path / "a.pt", 1), member(tmp_path / "b.pt", 2)
    common = ["--n0", "10", "--n", "50", "--skip", "120", "--device", "cpu", "--no-progress"]
    out = tmp_path / "e.tsv"
    assert main(["certify", str(a), str(b), *common, "--out", str(out)]) == 0
    identity = json.loads((tmp_path / "e.tsv.manifest.json").read_text())["identity"]
    assert len(identity["ensemble"]["members"]) == 2 and identity["ensemble"]["mode"] == "logits"
    assert "member evaluations per noisy input: 2.000 of 2" in capsys.readouterr().out
    exact = ["--ensemble-mode", "softmax", "--consensus", "exact"]
    sure = member(tmp_path / "sure.pt", 1, scale=1000.0)  # confident softmaxes
    assert main(["certify", str(sure), str(sure), str(sure), *exact, *common,
                 "--out", str(tmp_path / "x.tsv")]) == 0
    per_input = float(capsys.readouterr().out.split("per noisy input: ")[1].split()[0])
    assert 2 <= per_input < 2.5  # three copies of one model: the third runs only on near-ties
    other = member(tmp_path / "c.pt", 3, dataset="mnist")
    bad = [([str(a), str(b), "--consensus", "3"], "an integer K in 1..2"),
           ([str(a), str(b), "--consensus", "0"], "expected 'exact' or a positive integer K"),
           ([str(a), str(b), "--consensus", "exact"], "exact consensus needs the softmax mode"),
           ([str(a), str(other)], "ensemble members must share dataset"),
           ([str(a), str(b), "--ensemble-mode", "median"], "invalid choice")]
    for args, match in bad:
        target = tmp_path / "bad.tsv"
        assert main(["certify", *args, *common, "--out", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert match in err and len(err.splitlines()) <= 2, err  # argparse: usage + one line
        assert not target.exists()


class Table(nn.Module):
    """Row i of the input holds the index i; the output is row i of fixed logits."""

    def __init__(self, logits):
        super().__init__()
        self.register_buffer("logits", torch.as_tensor(logits, dtype=torch.float32))

    def forward(self, x):
        return self.logits[x[:, 0].long()]


def test_exact_consensus_changes_no_vote_and_skips_members():
    """Random members, some confident (scaled logits), some not, including rows built on the
    boundary S_c − S_j = M − k: the votes in an argmax_only engine call are the plain softmax
    ensemble's on every row, members are skipped, and outside one the outputs are the whole
    mean."""
    g = torch.Generator().manual_seed(0)
    rows, members = 4000, 5
    shared = torch.randn(1, rows, 7, generator=g)  # members that mostly agree, as trained ones
    scale = torch.rand(1, rows, 1, generator=g) * 12  # from flat (0) to confident (12)
    logits = (shared + 0.5 * torch.randn(members, rows, 7, generator=g)) * scale
    logits[:, :5] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # exact ties: class 0
    logits[:3, 5, 0], logits[3:, 5, 1] = 60.0, 60.0  # S_0 − S_1 = 3 − 0 after 3 of 5: decided
    logits[:2, 6, 0], logits[2, 6, 1], logits[3:, 6, 1] = 60.0, 60.0, 60.0  # 2 vs 3: class 1
    x = torch.arange(rows, dtype=torch.float32).unsqueeze(1)
    tables = [Table(m) for m in logits]
    plain, exact = Ensemble(tables, "softmax"), Ensemble(tables, "softmax", consensus="exact")
    with torch.no_grad():
        want = plain(x)
        with engine_call(argmax_only=True):
            got = exact(x)
        assert torch.equal(got.argmax(1), want.argmax(1))
        assert got.argmax(1)[6] == 1 and got.argmax(1)[5] == 0
        assert plain.evaluations == members * rows
        # no row can stop before 3 of 5 (a margin ≤ k must exceed 5 − k); many stop there
        assert 3 * rows <= exact.evaluations < 0.9 * members * rows
        assert torch.equal(exact(x), want)  # not counting votes: the whole mean


def test_exact_consensus_certifies_as_the_ensemble_with_its_identity(tmp_path):
    """CERTIFY and lbound (soft scores) through certify_dataset: the same rows as the plain
    softmax ensemble, the same identity (a file resumes with or without it), fewer member
    evaluations."""
    a = member(tmp_path / "a.pt", 1, scale=1000.0)
    b = member(tmp_path / "b.pt", 2, scale=1000.0)
    data = load_dataset("digits", "test")
    for certifier in ("certify", "lbound"):
        plain = Ensemble.from_checkpoints([a, a, b], "softmax")
        exact = Ensemble.from_checkpoints([a, a, b], "softmax", consensus="exact")
        run = {**RUN, "certifier": certifier}
        want = certify_dataset(plain, data, **run, out=tmp_path / f"{certifier}_plain.tsv")
        got = certify_dataset(exact, data, **run, out=tmp_path / f"{certifier}_exact.tsv")
        assert without_time(got) == without_time(want)
        assert (read_manifest(tmp_path / f"{certifier}_exact.tsv")["identity"]
                == read_manifest(tmp_path / f"{certifier}_plain.tsv")["identity"])
        passes = RUN["n"] + (RUN["n0"] if certifier == "certify" else 1)  # lbound: clean top
        assert [r["member_passes"] for r in want] == [3 * passes] * len(want)  # soft scores too
        if certifier == "certify":  # the first two members are one model: the third is skipped
            assert exact.evaluations < 0.8 * plain.evaluations
            assert sum(r["member_passes"] for r in got) == exact.evaluations
    out = tmp_path / "resumed.tsv"
    first = certify_dataset(Ensemble.from_checkpoints([a, a, b], "softmax", consensus="exact"),
                            data, **{**RUN, "max_count": 4}, out=out)
    rest = certify_dataset(Ensemble.from_checkpoints([a, a, b], "softmax"), data, **RUN, out=out)
    assert len(first) == 4 and without_time(rest) == without_time(
        certify_dataset(plain, data, **RUN))
