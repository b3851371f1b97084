"""Ensembles (models/ensemble.py): one checkpoint twice certifies as the checkpoint alone; the
identity holds every member; K-consensus with K = all members is the ensemble itself, with K
smaller it skips member evaluations and certifies the consensus classifier; bad inputs are one
line."""

import json

import pytest
import torch
from torch import nn

from conftest import Halfspace, write_checkpoint
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.models import build_model
from smoothcert.models.checkpoint import save_checkpoint, versions
from smoothcert.models.ensemble import Ensemble
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import read_manifest

RUN = dict(sigma=0.25, n0=20, n=300, alpha=0.001, batch=128, seed=4, skip=40)


def without_time(rows):
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


def member(path, seed, dataset="digits"):
    """A digits_cnn checkpoint initialised from ``seed`` (different members, same layout)."""
    torch.manual_seed(seed)
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5])
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
    (dict(consensus=0), "consensus K must be an integer in 1..2"),
    (dict(consensus=3), "consensus K must be an integer in 1..2"),
    (dict(consensus=True), "consensus K must be an integer"),
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
    capsys.readouterr()
    other = member(tmp_path / "c.pt", 3, dataset="mnist")
    bad = [([str(a), str(b), "--consensus", "3"], "consensus K must be an integer in 1..2"),
           ([str(a), str(other)], "ensemble members must share dataset"),
           ([str(a), str(b), "--ensemble-mode", "median"], "invalid choice")]
    for args, match in bad:
        target = tmp_path / "bad.tsv"
        assert main(["certify", *args, *common, "--out", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert match in err and len(err.splitlines()) <= 2, err  # argparse: usage + one line
        assert not target.exists()
