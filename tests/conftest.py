import importlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from smoothcert.models import build_model
from smoothcert.models.checkpoint import save_checkpoint, versions


class Halfspace(nn.Module):
    """f(x) = [w·x > b] as two logits: the closed-form oracle of randomized smoothing.

    Under N(0, σ²I) noise, P(f(x+δ) = 1) = Φ((w·x − b)/(σ‖w‖)), and the smoothed classifier's
    exact L2 robustness radius at x is the distance |w·x − b| / ‖w‖ to the hyperplane.
    """

    def __init__(self, w, b=0.0, input_shape=None):
        super().__init__()
        self.register_buffer("w", torch.as_tensor(w, dtype=torch.float32).flatten())
        self.b = float(b)
        if input_shape is not None:
            self.input_shape = tuple(input_shape)

    def forward(self, x):
        z = x.flatten(1) @ self.w - self.b
        return torch.stack([-z, z], dim=1)


# Cohen et al.'s certify.py format: time as str(datetime.timedelta).
#   idx 0: correct, radius 0.25  (exactly on the grid: counts at r=0.25, inclusive)
#   idx 1: correct, radius 0.5   (exactly on the grid)
#   idx 2: abstain (-1), radius 0
#   idx 3: WRONG (predict 5, label 4) with radius 0.8: counts nowhere
#   idx 4: correct, radius 1.2
#   idx 5: correct, radius 0.1
#   idx 6: abstain
#   idx 7: correct, radius 0.75  (exactly on the grid)
COHEN_ROWS = [
    (0, 1, 1, 0.25, 1, "0:00:01.500000"),
    (1, 2, 2, 0.5, 1, "0:00:02.500000"),
    (2, 3, -1, 0.0, 0, "0:00:01.000000"),
    (3, 4, 5, 0.8, 0, "0:00:03.000000"),
    (4, 0, 0, 1.2, 1, "0:00:02.000000"),
    (5, 6, 6, 0.1, 1, "0:00:01.000000"),
    (6, 7, -1, 0.0, 0, "0:00:00.500000"),
    (7, 8, 8, 0.75, 1, "0:01:00.500000"),
]
GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25)


class Clock:
    """A clock that moves only when a test (or a :class:`TimedDevice`) moves it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def launch_bound(rows: int) -> float:
    """10 ms a launch, 1 µs a row: larger batches are faster per draw, ever less so."""
    return 0.01 + 1e-6 * rows


class TimedDevice(nn.Module):
    """A linear model of a 1×4×4 input standing for an accelerator: a forward of b rows
    advances ``clock`` by ``cost(b)`` seconds (half under bf16 autocast), records b in
    ``batches``, and above ``fits`` rows raises torch's out-of-memory error."""

    def __init__(self, clock: Clock, cost=launch_bound, fits: int | None = None):
        super().__init__()
        self.clock, self.cost, self.fits = clock, cost, fits
        self.register_buffer("w", torch.ones(16, 3))
        self.batches: list[int] = []

    def forward(self, x):
        rows = x.shape[0]
        if self.fits is not None and rows > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory (a test)")
        self.batches.append(rows)
        half = torch.is_autocast_enabled("cpu")
        self.clock.now += self.cost(rows) * (0.5 if half else 1.0)
        return x.flatten(1) @ self.w


class DataParallelKeys(nn.Module):
    """What the references' ``nn.DataParallel(net)`` saves (keys ``module.*``) and computes,
    without DataParallel's move of ``net`` to cuda:0 where exactly one GPU is visible: the
    tests compare it with the library's model on CPU tensors wherever they run."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


def write_checkpoint(path, arch="digits_cnn", num_classes=10, input_shape=(1, 8, 8),
                     method="gaussian"):
    """A freshly initialised (seed 0) checkpoint in smoothcert's format, for CLI tests."""
    torch.manual_seed(0)
    model = build_model(arch, num_classes, input_shape, [0.5], [0.5])
    meta = {"arch": arch, "dataset": "digits", "num_classes": num_classes,
            "input_shape": list(input_shape), "mean": [0.5], "std": [0.5],
            "noise": {"name": "gaussian", "sigma": 0.25},
            "method": {"name": method, "hparams": {}}, "epoch": 0,
            "versions": versions(), "config": {}}
    return save_checkpoint(path, model, meta)


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Every test runs torch on one intra-op thread. The suite's tensors are tiny (8×8 digits,
    models of a few thousand weights), where a second thread costs more in synchronisation than
    it gives: one epoch of digits_cnn took 0.9 s on one thread and 12 s on two while other
    processes shared this 2-core machine. Subprocesses (the CLI, torchrun) keep torch's default.
    (Modules may still name it, ``pytestmark = usefixtures("one_thread")``, from before.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def dying_writer(monkeypatch, rows: int, torn: str):
    """Make record files die after ``rows`` complete rows: the next write leaves the torn text
    ``torn`` (no newline, as a killed process would) and raises KeyboardInterrupt. Returns a
    function that restores the real writer."""
    from smoothcert.runs import records

    original = records.RecordWriter.write
    calls = {"n": 0}

    def write(self, row):
        calls["n"] += 1
        if calls["n"] == rows + 1:
            self._file.write(torn)
            self._file.flush()
            raise KeyboardInterrupt
        original(self, row)

    monkeypatch.setattr(records.RecordWriter, "write", write)
    return lambda: monkeypatch.setattr(records.RecordWriter, "write", original)


# Image folders in torchvision's ImageFolder layout (tests/data/test_image_folders.py, and
# torchrun over a folder in tests/training/test_distributed.py).
CLASSES = ("ant", "bee", "cat")
SIZES = ((37, 53), (64, 41), (29, 29))  # (H, W): odd, portrait, landscape, square


def write_image(path, seed: int, size=(37, 53), mode="RGB"):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    image.save(path)


def write_folder(root, classes=CLASSES, per_class=3, splits=("train", "val")):
    """Each class gets JPEG and PNG files of several sizes; one grayscale and one RGBA image."""
    for s, split in enumerate(splits):
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                ext = (".jpg", ".png", ".JPEG")[i % 3]
                mode = "L" if (c, i) == (1, 0) else ("RGBA" if (c, i, ext) == (2, 1, ".png")
                                                     else "RGB")
                write_image(folder / f"img{i}{ext}", 1000 * s + 10 * c + i, SIZES[i % 3], mode)
    return root


# Denoisers behind the digits classifier (tests/runs/test_denoised_runs.py,
# tests/cli/test_denoiser_cli.py): small random ones, so that they change the votes.
def write_dncnn_checkpoint(path, channels=1, size=8, seed=0):
    """A DnCNN of depth 3 and width 8 (role denoiser) whose last convolution is random: a fresh
    DnCNN is the identity, which would hide whether the runner applies it."""
    from smoothcert.models.checkpoint import checkpoint_meta

    torch.manual_seed(seed)
    params = {"depth": 3, "width": 8}
    model = build_model("dncnn", 10, (channels, size, size), [0.5] * channels,
                        [0.5] * channels, params)
    with torch.no_grad():
        model.dncnn[-1].weight.normal_(0, 0.2)
    meta = checkpoint_meta(
        arch="dncnn", dataset="digits", num_classes=10, input_shape=(channels, size, size),
        mean=[0.5] * channels, std=[0.5] * channels, noise={"name": "gaussian", "sigma": 0.25},
        method={"name": "denoiser-mse", "hparams": {}}, epoch=0, config={},
        arch_kwargs=params, role="denoiser")
    return save_checkpoint(path, model, meta)


def write_diffusers_folder(folder, channels=1, size=8, seed=0, unet=True, scheduler=True):
    """A tiny random diffusers UNet2DModel and a DDPM scheduler (Ho et al.'s linear betas) in
    google/ddpm-cifar10-32's flat layout: config.json, weights, scheduler_config.json."""
    import diffusers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if unet:
        diffusers.UNet2DModel(
            sample_size=size, in_channels=channels, out_channels=channels, layers_per_block=1,
            block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4).save_pretrained(folder)
    if scheduler:
        diffusers.DDPMScheduler(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02,
                                beta_schedule="linear").save_pretrained(folder)
    return folder


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def benchmark_module(name: str):
    """``benchmarks/NAME.py`` imported for a test (benchmarks are scripts, not a package: their
    folder is on sys.path only while the module is in use)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def gpu_suite_argv(part: str, output: str, tmp_path) -> list[str]:
    """The command line ``PART=part bash benchmarks/gpu_suite.sh`` runs, read back from
    ``tmp_path/output``: the script runs with a stand-in for Python that writes its arguments
    there (via stdout), so each part's arguments can be parsed by its benchmark."""
    import subprocess

    stub = tmp_path / "python"
    stub.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    stub.chmod(0o755)
    proc = subprocess.run(["bash", str(BENCHMARKS / "gpu_suite.sh")], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHON": str(stub),
                                                      "OUT": str(tmp_path), "PART": part})
    assert proc.returncode == 0, proc.stderr
    return (tmp_path / output).read_text().splitlines()
