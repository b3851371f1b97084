"""Checkpoint I/O: round trip, atomic writes, and clear errors for every kind of bad file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smoothcert import SmoothcertError
from smoothcert.models import (
    build_model,
    checkpoint_meta,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    versions,
)


def small_model():
    torch.manual_seed(0)
    return build_model("digits_cnn", 10, (1, 8, 8), [0.3], [0.4])


def meta(**overrides):
    fields = dict(
        arch="digits_cnn",
        dataset="digits",
        num_classes=10,
        input_shape=(1, 8, 8),
        mean=(0.3,),
        std=(0.4,),
        noise={"name": "gaussian", "sigma": 0.25},
        method={"name": "gaussian", "hparams": {"num_noise": 1}},
        epoch=3,
        config={"lr": 0.1, "milestones": [30, 60]},
    )
    fields.update(overrides)
    return checkpoint_meta(**fields)


@pytest.fixture
def saved(tmp_path):
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.rand(2, 1, 8, 8)).sum().backward()
    optimizer.step()  # weights now differ from a fresh init with the same seed
    train_state = {"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(), "step": 7}
    path = save_checkpoint(tmp_path / "ckpt.pt", model, meta(), train_state)
    return path, model


def test_round_trip_gives_identical_outputs(saved):
    path, model = saved
    loaded, loaded_meta = model_from_checkpoint(path)
    assert not loaded.training
    assert loaded_meta["arch"] == "digits_cnn" and loaded_meta["epoch"] == 3
    assert loaded_meta["input_shape"] == [1, 8, 8] and loaded_meta["noise"]["sigma"] == 0.25
    assert loaded.input_shape == (1, 8, 8) and loaded.num_classes == 10
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))


def test_train_state_round_trips(saved):
    path, _ = saved
    ckpt = load_checkpoint(path)
    assert ckpt.train_state["step"] == 7
    assert ckpt.train_state["rng"].dtype == torch.uint8
    assert ckpt.train_state["optimizer"]["param_groups"][0]["momentum"] == 0.9
    assert ckpt.meta["versions"] == versions()
    assert set(versions()) == {"smoothcert", "torch", "python"}


def test_atomic_write_leaves_no_temp_files_and_overwrites(saved, tmp_path):
    path, model = saved
    save_checkpoint(path, model, meta(epoch=4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
    assert load_checkpoint(path).meta["epoch"] == 4


def test_failed_save_keeps_old_file_and_leaves_no_temp(saved, tmp_path, monkeypatch):
    path, model = saved

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError):
        save_checkpoint(path, model, meta(epoch=9))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
    monkeypatch.undo()
    assert load_checkpoint(path).meta["epoch"] == 3


def test_missing_file(tmp_path):
    with pytest.raises(SmoothcertError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")


def test_truncated_file(saved):
    path, _ = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SmoothcertError, match="truncated"):
        load_checkpoint(path)


def test_garbage_bytes(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(SmoothcertError, match="cannot be read"):
        model_from_checkpoint(path)


def test_foreign_reference_checkpoint(tmp_path):
    """A Cohen et al. style .pth.tar: loadable weights-only, but not ours."""
    path = tmp_path / "checkpoint.pth.tar"
    state = {"1.conv1.weight": torch.zeros(16, 3, 3, 3)}
    torch.save({"epoch": 90, "arch": "cifar_resnet110", "state_dict": state}, path)
    with pytest.raises(SmoothcertError, match="not a smoothcert checkpoint.*import"):
        load_checkpoint(path)


def test_non_dict_payload(tmp_path):
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    with pytest.raises(SmoothcertError, match="not a smoothcert checkpoint"):
        load_checkpoint(path)


def test_future_format_version(saved):
    path, _ = saved
    obj = torch.load(path, weights_only=True)
    obj["format_version"] = 99
    torch.save(obj, path)
    with pytest.raises(SmoothcertError, match="version"):
        load_checkpoint(path)


def test_weights_that_do_not_fit_the_arch(tmp_path):
    path = save_checkpoint(
        tmp_path / "c.pt", small_model(), meta(arch="lenet", input_shape=(1, 28, 28))
    )
    with pytest.raises(SmoothcertError, match="do not fit"):
        model_from_checkpoint(path)


def test_save_rejects_incomplete_or_non_plain_meta(tmp_path):
    model = small_model()
    with pytest.raises(SmoothcertError, match="lacks"):
        save_checkpoint(tmp_path / "c.pt", model, {"arch": "digits_cnn"})
    for value in (object(), np.float64(0.1)):  # numpy scalars would break weights-only loading
        with pytest.raises(SmoothcertError, match=r"config.*lr"):
            save_checkpoint(tmp_path / "c.pt", model, meta(config={"lr": value}))
    assert not any(tmp_path.iterdir())


def test_role_is_stored_only_for_models_that_are_not_classifiers(tmp_path):
    """Old checkpoints (no "role") stay classifiers; a denoiser's meta says so and loads bare."""
    assert "role" not in meta() and "role" not in meta(role="classifier")
    from smoothcert.models import checkpoint_role

    assert checkpoint_role(meta()) == "classifier"
    torch.manual_seed(0)
    denoiser = build_model("dncnn", 10, (1, 8, 8), [0.3], [0.4], {"depth": 3, "width": 4})
    dmeta = meta(arch="dncnn", role="denoiser", arch_kwargs={"depth": 3, "width": 4})
    assert dmeta["role"] == "denoiser" and checkpoint_role(dmeta) == "denoiser"
    save_checkpoint(tmp_path / "d.pt", denoiser, dmeta)
    loaded, stored = model_from_checkpoint(tmp_path / "d.pt")
    assert stored["role"] == "denoiser" and loaded.role == "denoiser"
    assert not isinstance(loaded, torch.nn.Sequential) and not loaded.training
    x = torch.rand(2, 1, 8, 8)
    torch.testing.assert_close(loaded(x), denoiser.eval()(x))
    with pytest.raises(SmoothcertError, match="unknown model role 'generator'"):
        meta(role="generator")


def test_role_that_contradicts_the_arch_is_refused(tmp_path):
    save_checkpoint(tmp_path / "c.pt", small_model(), dict(meta(), role="denoiser"))
    with pytest.raises(SmoothcertError, match="says role 'denoiser' but arch 'digits_cnn' is a "
                                              "classifier"):
        model_from_checkpoint(tmp_path / "c.pt")
    denoiser = build_model("dncnn", 10, (1, 8, 8), [0.3], [0.4])
    save_checkpoint(tmp_path / "d.pt", denoiser, meta(arch="dncnn"))  # role left out
    with pytest.raises(SmoothcertError, match="says role 'classifier' but arch 'dncnn' is a "
                                              "denoiser"):
        model_from_checkpoint(tmp_path / "d.pt")
