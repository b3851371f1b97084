"""Step 8 (issue 15), items 2 and 3: outputs never overwrite inputs, and every boundary (launcher
environment, recipe types, integer limits, memory, a full disk, --data-root, flags of another
mode) answers with one line and exit 2, leaving what was written whole. Manifests can say which
data files were read (``data.data_files``)."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from conftest import write_checkpoint
from smoothcert.cli.app import build_parser, main
from smoothcert.cli.dataset_run import shard_from_env
from smoothcert.data import formats as data_mod
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.runs.records import read_records
from smoothcert.training.distributed import rank_device, world_size_from_env
from smoothcert.training.recipes import load_recipe

FAST = ["--n0", "10", "--n", "50", "--batch", "32", "--no-progress", "--device", "cpu"]
TRAIN = ["train", "--dataset", "digits", "--arch", "digits_cnn", "--method", "gaussian",
         "--sigma", "0.25", "--batch", "128", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "checkpoint.pt")


def certify(checkpoint, out, *extra) -> int:
    return main(["certify", str(checkpoint), *FAST, "--max", "4", "--out", str(out), *extra])


def one_line(capsys, *words) -> str:
    """The one error line on stderr (after the summary lines of epochs that were trained)."""
    err = "".join(line for line in capsys.readouterr().err.splitlines(keepends=True)
                  if not line.startswith("epoch="))
    assert err.count("\n") == 1 and err.startswith("smoothcert "), err
    for word in words:
        assert word in err, err
    return err


# --------------------------------------------------------------------------- outputs vs inputs
def test_outputs_never_overwrite_inputs(checkpoint, tmp_path, capsys):
    from smoothcert.runs.records import shard_path

    shards = [shard_path(tmp_path / "c.tsv", k, 2) for k in range(2)]
    for k in range(2):
        assert certify(checkpoint, tmp_path / "c.tsv", "--num-shards", "2",
                       "--shard-index", str(k)) == 0
    before = [s.read_bytes() for s in shards]
    capsys.readouterr()
    # merge onto one of its shards, or onto a path whose manifest is a shard's
    assert main(["merge", *map(str, shards), "--out", str(shards[0])]) == 2
    one_line(capsys, "--out would overwrite", shards[0].name)
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / ".." / tmp_path.name /
                                                         shards[1].name)]) == 2
    one_line(capsys, "--out would overwrite")
    assert [s.read_bytes() for s in shards] == before
    # report --into one of the record files it reads
    assert main(["report", *map(str, shards), "--into", str(shards[1]), "--block", "b"]) == 2
    one_line(capsys, "--into would overwrite")
    # train --out whose checkpoint is the --init-from checkpoint
    run = tmp_path / "run"
    init = write_checkpoint(run / "checkpoint.pt")
    assert main([*TRAIN, "--epochs", "1", "--init-from", str(init), "--out", str(run)]) == 2
    one_line(capsys, "--out would overwrite", "--init-from")


def test_import_checkpoint_refuses_its_input_as_out_even_with_force(tmp_path, capsys):
    from smoothcert.models import MODELS

    src = tmp_path / "m.pth"
    torch.save({"net": MODELS["lenet"](10, (1, 28, 28)).state_dict()}, src)
    before = src.read_bytes()
    assert main(["import-checkpoint", str(src), "--format", "macer", "--arch", "lenet",
                 "--dataset", "mnist", "--sigma", "0.25", "--out", str(src), "--force"]) == 2
    one_line(capsys, "--out would overwrite")
    assert src.read_bytes() == before


# --------------------------------------------------------------------------- launchers
BAD_ENV = {
    "RANK not an integer": {"RANK": "abc", "WORLD_SIZE": "2"},
    "WORLD_SIZE zero": {"RANK": "0", "WORLD_SIZE": "0"},
    "RANK beyond WORLD_SIZE": {"RANK": "2", "WORLD_SIZE": "2"},
    "RANK negative": {"RANK": "-1", "WORLD_SIZE": "2"},
    "SLURM id not an integer": {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"},
    "SLURM id past the array": {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "2",
                                "SLURM_ARRAY_TASK_MIN": "5"},
    "SLURM id below MIN": {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "2",
                           "SLURM_ARRAY_TASK_MIN": "5"},
    "SLURM count zero": {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "0"},
}


@pytest.mark.parametrize("case", sorted(BAD_ENV))
def test_malformed_launcher_variables_are_one_error(case):
    with pytest.raises(SmoothcertError, match="RANK|WORLD_SIZE|SLURM_ARRAY_TASK"):
        shard_from_env(BAD_ENV[case])


def test_launcher_variables_that_are_fine():
    assert shard_from_env({"RANK": "1", "WORLD_SIZE": "4"}) == (1, 4)
    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "6", "SLURM_ARRAY_TASK_COUNT": "2",
                           "SLURM_ARRAY_TASK_MIN": "5"}) == (1, 2)
    assert shard_from_env({}) == (0, 1)
    assert world_size_from_env({}) == 1


def test_world_size_and_local_rank_are_checked():
    with pytest.raises(SmoothcertError, match="WORLD_SIZE='0'"):
        world_size_from_env({"WORLD_SIZE": "0"})
    with pytest.raises(SmoothcertError, match="LOCAL_RANK='gpu0'"):
        rank_device(torch.device("cuda"), {"LOCAL_RANK": "gpu0"})


def test_certify_with_a_bad_rank_is_one_line_and_flags_override_it(checkpoint, tmp_path,
                                                                   capsys, monkeypatch):
    monkeypatch.setenv("RANK", "abc")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert certify(checkpoint, tmp_path / "c.tsv") == 2
    one_line(capsys, "RANK='abc'")
    assert not (tmp_path / "c.tsv").exists()
    assert certify(checkpoint, tmp_path / "c.tsv", "--num-shards", "1", "--shard-index", "0") == 0


# --------------------------------------------------------------------------- recipes
@pytest.mark.parametrize("field, match", [
    ("base: 3", "base must be the path"),
    ("base: [a.yaml]", "base must be the path"),
    ("base: base.yaml\nmethod_params: 3", "method_params must be a mapping"),
    ("base: bad_base.yaml", "method_params must be a mapping"),
    ("1: 2", "keys must be TrainConfig field names"),
])
def test_recipe_fields_of_the_wrong_type(tmp_path, field, match):
    (tmp_path / "base.yaml").write_text("dataset: digits\nmethod_params: {num_noise: 2}\n")
    (tmp_path / "bad_base.yaml").write_text("dataset: digits\nmethod_params: [1]\n")
    (tmp_path / "r.yaml").write_text(field + "\n")
    with pytest.raises(SmoothcertError, match=match):
        load_recipe(tmp_path / "r.yaml")


@pytest.mark.parametrize("field, match", [
    ('epochs: "ten"', "epochs must be an integer"),
    ("lr: [1]", "lr must be a positive"),
    ("method_params: 3", "method_params must be a mapping"),
    ("base: 3", "base must be the path"),
])
def test_train_recipe_of_the_wrong_type_is_one_line(tmp_path, capsys, field, match):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("dataset: digits\narch: digits_cnn\nmethod: gaussian\nsigma: 0.25\n"
                      f"epochs: 1\n{field}\n")
    assert main(["train", "--config", str(recipe), "--out", str(tmp_path / "run"),
                 "--no-progress", "--device", "cpu"]) == 2
    one_line(capsys, match)


# --------------------------------------------------------------------------- integer limits
@pytest.mark.parametrize("flag, value", [
    ("--n", 10**30), ("--n0", 10**30), ("--n", 2**53 + 1), ("--max", 10**20),
    ("--batch", 10**12), ("--batch", 2**31), ("--skip", 2**63),
])
def test_integers_beyond_the_engine_are_refused_at_parse(flag, value, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["certify", "c.pt", "--out", "x.tsv", flag, str(value)])
    assert info.value.code == 2
    one_line(capsys, f"argument {flag}: must be at most")


def test_the_limits_themselves_parse():
    args = build_parser().parse_args(["certify", "c.pt", "--out", "x.tsv", "--n", str(2**53),
                                      "--batch", str(2**31 - 1)])
    assert (args.n, args.batch) == (2**53, 2**31 - 1)


# --------------------------------------------------------------------------- memory
@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: "
                 "you tried to allocate 1024 bytes"),
    MemoryError(),
])
def test_a_batch_the_device_cannot_hold_is_one_line(checkpoint, tmp_path, capsys, monkeypatch,
                                                    error):
    from smoothcert.smoothing.engine import BatchedVotes

    forward, calls = BatchedVotes.forward, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 6:  # some rows are done first
            raise error
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(BatchedVotes, "forward", failing)
    out = tmp_path / "c.tsv"
    assert certify(checkpoint, out) == 2
    one_line(capsys, "out of memory with --batch 32", "smaller --batch")
    kept = len(read_records(out))  # the file is whole: complete rows only
    monkeypatch.setattr(BatchedVotes, "forward", forward)
    assert certify(checkpoint, out) == 0
    assert len(read_records(out)) == 4 and kept <= 4


# --------------------------------------------------------------------------- a full disk
def test_disk_full_while_training_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    import smoothcert.models.checkpoint as checkpoint_mod

    save, saves = torch.save, []

    def full_on_second(obj, f, *args, **kwargs):
        saves.append(1)
        if len(saves) == 2:
            f.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_mod.torch, "save", full_on_second)
    run = tmp_path / "run"
    assert main([*TRAIN, "--epochs", "2", "--out", str(run)]) == 2
    one_line(capsys, "disk full while saving epoch 2", "still holds epoch 1", "--resume")
    assert load_checkpoint(run / "checkpoint.pt").meta["epoch"] == 1
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.yaml", "log.tsv"]
    monkeypatch.setattr(checkpoint_mod.torch, "save", save)
    assert main([*TRAIN, "--epochs", "2", "--out", str(run), "--resume"]) == 0
    assert load_checkpoint(run / "checkpoint.pt").meta["epoch"] == 2


# --------------------------------------------------------------------------- --data-root
def write_idx(path, shape, seed):
    import struct

    import numpy as np

    array = np.random.default_rng(seed).integers(0, 10, size=shape, dtype=np.uint8)
    path.write_bytes(bytes([0, 0, 8, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)
                     + array.tobytes())


def write_fashion(folder):
    folder.mkdir(parents=True)
    write_idx(folder / "t10k-images-idx3-ubyte", (3, 28, 28), 0)
    write_idx(folder / "t10k-labels-idx1-ubyte", (3,), 1)
    return folder


def test_a_data_root_that_does_not_exist_is_not_searched_around(tmp_path, monkeypatch):
    monkeypatch.setattr(data_mod, "FASHION_MNIST_SYSTEM_DIR", write_fashion(tmp_path / "sys"))
    with pytest.raises(SmoothcertError, match="--data-root .*missing does not exist"):
        load_dataset("fashion-mnist", "test", data_root=tmp_path / "missing", download=False)
    (tmp_path / "empty").mkdir()  # exists but lacks the files: the other folders are searched
    assert len(load_dataset("fashion-mnist", "test", data_root=tmp_path / "empty",
                            download=False)) == 3


def test_certify_with_a_missing_data_root_is_one_line(checkpoint, tmp_path, capsys):
    assert certify(checkpoint, tmp_path / "c.tsv", "--data-root", str(tmp_path / "nope")) == 2
    one_line(capsys, "does not exist")


# --------------------------------------------------------------------------- report's modes
@pytest.mark.parametrize("extra, flags", [
    (["--train", "--plot", "p.png"], "--plot"),
    (["--train", "--envelope"], "--envelope"),
    (["--agreement", "--envelope"], "--envelope"),
    (["--agreement", "--plot", "p.png"], "--plot"),
    (["--agreement", "--ecdf", "e.png"], "--ecdf"),
    (["--train", "--radii", "0:1:0.5"], "--radii"),
])
def test_report_flags_of_another_mode_are_refused(tmp_path, capsys, monkeypatch, extra, flags):
    monkeypatch.chdir(tmp_path)
    assert main(["report", "a.tsv", "b.tsv", *extra]) == 2
    one_line(capsys, f"{flags} does not apply to {extra[0]}")
    assert list(tmp_path.iterdir()) == []


def test_envelope_refuses_files_of_different_splits(checkpoint, tmp_path, capsys):
    test, train = tmp_path / "test.tsv", tmp_path / "train.tsv"
    assert certify(checkpoint, test) == 0 and certify(checkpoint, train, "--split", "train") == 0
    capsys.readouterr()
    assert main(["report", str(test), str(train), "--envelope"]) == 2
    one_line(capsys, "--envelope combines files of one dataset split", "digits train")
    assert main(["report", str(test), str(train)]) == 0  # without the envelope: fine


# --------------------------------------------------------------------------- manifests' data
def test_data_files_name_what_was_read(tmp_path, monkeypatch):
    from smoothcert.data.datasets import data_files

    digits = data_files(load_dataset("digits", "test"))
    (entry,) = digits["files"]
    assert entry["path"].endswith("digits.csv.gz") and len(entry["sha256"]) == 64
    monkeypatch.setattr(data_mod, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "none")
    root = write_fashion(tmp_path / "fm")
    files = data_files(load_dataset("fashion-mnist", "test", data_root=root, download=False))
    assert [f["path"] for f in files["files"]] == [str(root / "t10k-images-idx3-ubyte"),
                                                   str(root / "t10k-labels-idx1-ubyte")]
    assert files["files"][0]["bytes"] == 16 + 3 * 28 * 28 and "mtime" in files["files"][0]
    json.dumps(files)  # goes into a JSON manifest as it is
    assert data_files(object()) is None


def test_data_files_of_an_image_folder(tmp_path):
    from PIL import Image

    from smoothcert.data.datasets import data_files

    for c in ("a", "b"):
        (tmp_path / "val" / c).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8)).save(tmp_path / "val" / c / f"{i}.png")
    ds = load_dataset("imagefolder", "test", data_root=tmp_path, image_size=8)
    assert data_files(ds) == {"folder": str((tmp_path / "val").resolve()), "classes": 2,
                              "image_files": 4}


def test_a_data_root_of_another_type_in_a_recipe_is_one_line():
    from smoothcert.training import TrainConfig

    with pytest.raises(SmoothcertError, match="data_root must be a path or null, got 3"):
        TrainConfig(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=1, data_root=3)


def test_the_manifest_names_the_data_files_a_run_read(tmp_path):
    import json

    from conftest import write_checkpoint
    from smoothcert.cli.app import main

    checkpoint = write_checkpoint(tmp_path / "c.pt")
    out = tmp_path / "r.tsv"
    assert main(["certify", str(checkpoint), "--n0", "5", "--n", "20", "--max", "1",
                 "--out", str(out), "--device", "cpu", "--progress", "never"]) == 0
    manifest = json.loads((tmp_path / "r.tsv.manifest.json").read_text())
    (entry,) = manifest["provenance"]["data_files"]["files"]
    assert entry["path"].endswith("digits.csv.gz") and entry["bytes"] > 0 and entry["sha256"]
