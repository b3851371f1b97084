"""``merge`` writes a file that is record for record one run's, or nothing (issue 45, Step 21):
every copied map is checked against its row, a failed merge (a missing or wrong map, a full
disk) leaves what ``--out`` held before and names the right file, and integer columns stay
integers."""

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import smoothcert.io as io_mod
import smoothcert.runs.artifacts as artifacts_mod
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.models.encodings import AblationEncoding
from smoothcert.runs import certify_dataset
from smoothcert.runs.artifacts import artifact_dir, artifact_path, read_artifact
from smoothcert.runs.records import manifest_path, merge_records, read_records, shard_path


class Thresholds(nn.Module):
    """Each pixel's class by its value: class 0 below 1/3, 1 up to 2/3, 2 above."""

    task, num_classes = "segmentation", 3

    def forward(self, x):
        return torch.cat([torch.zeros_like(x), 6 * x - 2, 12 * x - 6], dim=1)


class Masks(torch.utils.data.TensorDataset):
    task, ignore_index = "segmentation", 255


def masks(count=4):
    g = torch.Generator().manual_seed(0)
    return Masks(torch.rand(count, 1, 4, 4, generator=g),
                 torch.randint(0, 3, (count, 4, 4), generator=g))


@pytest.fixture
def shards(tmp_path):
    """The two shard files of a segment run over 4 images (shard 0: idx 0, 2; 1: idx 1, 3)."""
    out = tmp_path / "s.tsv"
    for k in range(2):
        certify_dataset(Thresholds(), masks(), certifier="segment", sigma=0.1, n0=10, n=40,
                        batch=64, seed=2, num_classes=3, out=out, shard=(k, 2),
                        options={"tau": 0.75})
    return [shard_path(out, k, 2) for k in range(2)]


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def damage(path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "garbage":
        path.write_bytes(b"\x89PNG not really")
    else:  # another valid map: the other example's of the same shard
        shutil.copyfile(path.with_name("2.png"), path)


@pytest.mark.parametrize("how", ["missing", "garbage", "another map"])
def test_a_shards_wrong_or_missing_map_is_refused_and_nothing_is_left(shards, tmp_path, how):
    """Before: garbage or another valid PNG was copied into m.tsv.map/ with exit 0; a missing
    map left a partial m.tsv.map/ behind."""
    bad = artifact_path(shards[0], "map", 0)
    damage(bad, how)
    before = listing(tmp_path)
    with pytest.raises(SmoothcertError) as caught:
        merge_records(shards, tmp_path / "m.tsv")
    message = str(caught.value)
    assert "\n" not in message and str(bad) in message and "example 0" in message
    assert f"rerun the command of shard {shards[0]}" in message
    if how != "missing":
        assert "SHA-256 differs" in message
    assert listing(tmp_path) == before  # no merged file, manifest, map folder or temp file


def test_a_refused_merge_keeps_the_merged_file_it_would_replace(shards, tmp_path):
    out = tmp_path / "m.tsv"
    merge_records(shards, out)
    damage(artifact_path(shards[1], "map", 3), "garbage")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(SmoothcertError, match="SHA-256 differs"):
        merge_records(shards, out)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_the_merged_maps_are_the_rows_and_a_merge_replaces_an_old_one(shards, tmp_path):
    out = tmp_path / "m.tsv"
    artifact_dir(out, "map").mkdir()
    (artifact_dir(out, "map") / "7.png").write_bytes(b"an older merge's")
    merge_records(shards, out)
    assert sorted(p.name for p in artifact_dir(out, "map").iterdir()) == \
        ["0.png", "1.png", "2.png", "3.png"]
    for row in read_records(out).rows():
        read_artifact(out, "map", row["idx"], row["map_sha256"])
    shard_files = [f"{p.name}{end}" for p in shards for end in ("", ".manifest.json", ".map")]
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        sorted(["m.tsv", "m.tsv.manifest.json", "m.tsv.map", *shard_files])  # no temp, no old


def fill_disk_at_map(monkeypatch, nth: int):
    """The ``nth`` map written finds the disk full: its file is created, nothing fits."""
    real_open, count = open, {"n": 0}

    def full_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if os.fspath(file).endswith(".png") and "b" in mode and "r" not in mode:
            count["n"] += 1
            if count["n"] == nth:
                f.close()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return f

    def full_copy(source, target, **kwargs):  # the merge before: shutil.copyfile
        data = Path(source).read_bytes()
        with full_open(target, "wb") as f:
            f.write(data)

    monkeypatch.setattr(artifacts_mod, "open", full_open, raising=False)
    monkeypatch.setattr(shutil, "copyfile", full_copy)


def test_a_full_disk_names_the_merged_map_and_leaves_nothing(shards, tmp_path, monkeypatch,
                                                              capsys):
    """Before: a 0-byte m.tsv.map/2.png stayed, and the message blamed the intact source."""
    fill_disk_at_map(monkeypatch, nth=2)
    before = listing(tmp_path)
    out = tmp_path / "m.tsv"
    assert main(["merge", *map(str, shards), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write {artifact_path(out, 'map', 2)}" in err
    assert "No space left on device; the disk is full" in err and str(shards[0]) not in err
    assert listing(tmp_path) == before
    monkeypatch.undo()
    assert main(["merge", *map(str, shards), "--out", str(out)]) == 0  # the same command


def test_a_full_disk_at_the_merged_file_takes_its_maps_back(shards, tmp_path, monkeypatch,
                                                             capsys):
    """The maps are in place when the merged file is written: its failure removes them.
    Before: m.tsv.map/ stayed, naming rows that no file held."""
    real_open = open

    def full_open(file, mode="r", *args, **kwargs):
        if os.path.basename(os.fspath(file)).startswith(".m.tsv."):  # the merged file's temp
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io_mod, "open", full_open, raising=False)
    before = listing(tmp_path)
    out = tmp_path / "m.tsv"
    assert main(["merge", *map(str, shards), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"No space left on device: {out}; free some space" in err
    assert listing(tmp_path) == before


class Brightness(nn.Module):
    """Votes by the mean of the kept pixels, read from the ablation encoding (a kept pixel's
    two channels sum to 1, an ablated one's to 0): 4 classes at brightness 0, 1/3, 2/3, 1."""

    def forward(self, encoded):
        kept = encoded.flatten(1).sum(dim=1).clamp(min=1)
        mean = encoded[:, :1].flatten(1).sum(dim=1) / kept
        return -40.0 * (mean[:, None] - torch.linspace(0, 1, 4)) ** 2


def ablation_run(out, shard=(0, 1)):
    model = nn.Sequential(AblationEncoding(), Brightness()).eval()
    model.input_shape, model.input_encoding = (1, 8, 8), "ablation"
    g = torch.Generator().manual_seed(1)
    labels = torch.arange(5) % 4
    xs = (labels.float()[:, None, None, None] / 3 + torch.rand(5, 1, 8, 8, generator=g) - 0.5)
    return certify_dataset(model, torch.utils.data.TensorDataset(xs.clamp(0, 1), labels),
                           certifier="ablation", num_classes=4, batch=64, n0=10, n=200, seed=3,
                           options={"mode": "column", "size": 2}, out=out, shard=shard)


def test_merged_ablation_records_are_the_unsharded_runs_line_for_line(tmp_path):
    """Before: merge wrote ablation's integer radius (a count of ablations) as 0.0 and 2.0."""
    whole = tmp_path / "w.tsv"
    ablation_run(whole)
    for k in range(2):
        ablation_run(tmp_path / "s.tsv", shard=(k, 2))
    merged = merge_records([shard_path(tmp_path / "s.tsv", k, 2) for k in range(2)],
                           tmp_path / "m.tsv")

    def cells(path):
        lines = [line.split("\t") for line in path.read_text().splitlines()]
        time = lines[0].index("time")
        return [line[:time] + line[time + 1:] for line in lines]

    assert cells(merged) == cells(whole)
    assert {line[3] for line in cells(merged)[1:]} <= {"0", "1", "2", "3"}  # radius: a count
    assert manifest_path(merged).is_file()
