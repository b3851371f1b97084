"""Scaling out on torch.distributed, on CPU (gloo, two processes): data-parallel training equals
one process step for step, every method trains under DDP, only rank 0 writes, a resumed run
equals an uninterrupted one, torchrun runs the CLI, and certification sharded over torchrun's
ranks then merged equals one process.

The two-process training runs share one torchrun launch of this file (``two_ranks``): starting
processes that import torch is most of the cost on a small machine.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from conftest import write_checkpoint
from smoothcert import SmoothcertError
from smoothcert.cli.app import main
from smoothcert.models.checkpoint import load_checkpoint, model_from_checkpoint
from smoothcert.runs.records import read_records
from smoothcert.training import TrainConfig, Trainer, train
from smoothcert.training import loop as train_module
from smoothcert.training import trainer as trainer_module
from smoothcert.training.distributed import World, join

TINY_SIGMA = 1e-8
"""Noise far below float32's resolution of pixels in [0, 1] (spacing 6e-8 near 1): the ranks draw
other noise than one process does, so equality is only testable where noise cannot matter."""

STEP_ATOL = 1e-5
"""Per-step |loss(2 processes) − loss(1 process)|, losses ≈ 2.3. Measured (torch 2.14 CPU): at
most 3.6e-7 over the 23 steps of the gaussian case, at most 9.5e-7 over all cases (and at most
4.5e-8 between the final weights, checked at 1e-5). The only differences left are float32
rounding: each rank's forward pass over half the batch and DDP's mean of two half-batch
gradients sum in another order than one pass over the whole batch (≈1 ulp per step),
compounded over the steps. A real error (a rank not averaging its gradient,
examples seen twice or missed) moves the loss by 1e-3 or more within a few steps (ranks that
do not average their gradients: 6e-2 in the gaussian case, 3.6e-3 in the 6 steps of macer)."""

BASE = dict(dataset="digits", arch="digits_cnn", sigma=TINY_SIGMA, epochs=1, lr=0.05, seed=3)

# One epoch of digits (1,438 training images); batch 240 is 6 steps, enough to compound errors.
METHOD_CASES = {
    "gaussian": dict(method="gaussian", batch_size=64),  # 23 steps: the headline comparison
    "stability": dict(method="stability"),  # two forward passes per step
    "consistency": dict(method="consistency"),
    "macer": dict(method="macer", method_params={"num_noise": 4}),
    # ε = 0: the attack's forward and gradient passes through the DDP model all run, but
    # leave x unchanged (with ε > 0 the adversarial inputs, hence the losses, depend on the
    # noise draws: 1e-5 to 1e-3 apart even between two single-process runs of other seeds)
    "smoothadv": dict(method="smoothadv", method_params={"num_noise": 2, "num_steps": 2,
                                                         "epsilon": 0.0}),
    "easy_focus": dict(method="easy_focus", method_params={"discard": False, "attack_steps": 2}),
    "heat": dict(method="heat", lr=0.01, method_params={"num_steps": 1, "num_projections": 2}),
    # η = 0: each rank draws its own mixing weights λ, so the mixup term differs from one
    # process's; the attack (α = 0: x̂ = x) and both forward passes still run through DDP
    "smoothmix": dict(method="smoothmix", method_params={"num_noise": 2, "num_steps": 2,
                                                         "alpha": 0.0, "eta": 0.0}),
    # K ~ Binomial(m, p̂) comes from each rank's own stream, but at σ ≈ 0 every copy of an
    # input is classified alike, so p̂ is 0 or 1 and K (1 or m) does not depend on the draw;
    # ε = 0 keeps the worst-case noise at the drawn one while the attack's passes still run
    "catrs": dict(method="catrs", method_params={"num_noise": 2, "num_steps": 1,
                                                 "epsilon": 0.0, "target": "self"}),
}

# The resume check trains with real noise: same config, same number of processes.
RESUME = TrainConfig(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=2, batch_size=240,
                     lr=0.05, seed=3)
DATA_DEPENDENT = TrainConfig(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=1,
                             batch_size=240, lr=0.05, seed=3, sigma_mode="data_dependent",
                             dd_step_size=0.1)  # σ moves by ~1e-3: no change rounds away
COST = ("seconds", "peak_mem_mb")


def read_log(path) -> list[dict[str, str]]:
    header, *rows = path.read_text().splitlines()
    return [dict(zip(header.split("\t"), row.split("\t"))) for row in rows]


def method_config(name: str, init: str) -> TrainConfig:
    fields = {**BASE, "batch_size": 240, **METHOD_CASES[name]}
    if name == "heat":
        fields["init_checkpoint"] = init
    return TrainConfig(**fields)


def step_losses(config: TrainConfig, world: World):
    """One epoch; the loss of each global batch (the mean over its examples, all ranks) and the
    final weights flattened."""
    steps, update = [], trainer_module._Meter.update

    def record(meter, out, y):
        steps.append(torch.stack([out["loss"].detach().double() * len(y),
                                  torch.tensor(len(y), dtype=torch.float64)]))
        update(meter, out, y)

    trainer_module._Meter.update = record
    try:
        trainer = Trainer(config, world.device, world=world)
        trainer.train_epoch()
    finally:
        trainer_module._Meter.update = update
    total = world.all_reduce_sum(torch.stack(steps))
    weights = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return (total[:, 0] / total[:, 1]).tolist(), weights, trainer


# --------------------------------------------------------------------------- the two ranks
def _two_ranks(out) -> None:
    """What each of the two processes runs under torchrun (this file as its script): the CLI's
    training, every method for one epoch, data-dependent σ, an interrupted and resumed run.
    Rank 0 saves the results to out/results.pt."""
    torch.set_num_threads(1)
    with join("cpu") as world:  # the process group from torchrun's environment
        rank = world.rank
        assert world.size == 2
        assert main(["train", "--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25",
                     "--epochs", "1", "--batch", "64", "--lr", "0.05", "--no-progress",
                     "--device", "cpu", "--out", str(out / "cli")]) == 0
        results = {"steps": {}, "weights": {}}
        for name in METHOD_CASES:
            losses, weights, _ = step_losses(method_config(name, str(out / "init.pt")), world)
            results["steps"][name] = losses
            results["weights"][name] = world.gather(weights)
        _, _, trainer = step_losses(DATA_DEPENDENT, world)
        results["sigmas"] = world.gather(trainer.per_example_sigma.state())
        del trainer  # its DDP model holds the process group: leaving join() must free it
        _straight_and_resumed(world, out)
        if world.is_main:
            torch.save(results, out / "results.pt")
        inside = gloo_workers()
    threads = {"inside": inside, "after": gloo_workers()}
    (out / f"threads{rank}.json").write_text(json.dumps(threads))


def gloo_workers() -> int:
    """How many gloo worker threads this process runs (their names in /proc; -1 elsewhere)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return -1
    names = []
    for task in tasks.iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            names.append((task / "comm").read_text().strip())
    return names.count("pt_gloo_runloop")


def _straight_and_resumed(world: World, out) -> None:
    train(RESUME, out / "straight", progress=False)
    save = train_module._save

    def save_then_die(path, trainer):
        save(path, trainer)
        raise KeyboardInterrupt  # every rank, after the first epoch's checkpoint

    train_module._save = save_then_die
    try:
        train(RESUME, out / "resumed", progress=False)
    except KeyboardInterrupt:
        pass
    finally:
        train_module._save = save
    train(RESUME, out / "resumed", progress=False, resume=True)


def torchrun(*args, cwd, check=True) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 ARGS`` (a free port), which must succeed
    unless ``check`` is False."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           *args]
    tests = str(Path(__file__).resolve().parents[1])  # this file run as a script finds conftest
    path = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0 or not check, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    init = write_checkpoint(out / "init.pt")  # heat fine-tunes a digits_cnn
    torchrun(__file__, str(out), cwd=out)
    return out, torch.load(out / "results.pt", weights_only=True), str(init)


@pytest.mark.parametrize("name", list(METHOD_CASES))
def test_two_processes_take_the_single_process_steps(two_ranks, name, one_thread):
    _, results, init = two_ranks
    expected, weights, _ = step_losses(method_config(name, init), World())
    losses = results["steps"][name]
    assert len(losses) == len(expected)
    worst = max(abs(a - b) for a, b in zip(losses, expected))
    assert worst <= STEP_ATOL, (name, worst)
    rank0, rank1 = results["weights"][name]
    assert torch.equal(rank0, rank1)  # DDP kept the replicas identical
    torch.testing.assert_close(rank0, weights, rtol=0, atol=1e-5)


def test_data_dependent_sigmas_are_merged_across_ranks(two_ranks):
    rank0, rank1 = two_ranks[1]["sigmas"]
    assert torch.equal(rank0, rank1)
    assert (rank0 != DATA_DEPENDENT.sigma).all()  # each example's σ moved once, on its rank


def test_resumed_under_two_processes_equals_uninterrupted(two_ranks):
    out = two_ranks[0]
    straight = load_checkpoint(out / "straight" / "checkpoint.pt")
    resumed = load_checkpoint(out / "resumed" / "checkpoint.pt")
    assert resumed.meta["epoch"] == straight.meta["epoch"] == 2
    for key, value in straight.state_dict.items():
        assert torch.equal(resumed.state_dict[key], value), key
    for a, b in zip(straight.train_state["rank_noise_generators"],
                    resumed.train_state["rank_noise_generators"]):
        assert torch.equal(a, b)
    rows, expected = read_log(out / "resumed" / "log.tsv"), read_log(out / "straight" / "log.tsv")
    assert [r["epoch"] for r in rows] == ["1", "2"]
    for row, ref in zip(rows, expected):
        assert {k: v for k, v in row.items() if k not in COST} == {
            k: v for k, v in ref.items() if k not in COST
        }


@pytest.mark.parametrize("rank", [0, 1])
def test_leaving_the_world_joins_the_default_groups_gloo_workers(two_ranks, rank):
    """The cause of the old abort at exit ("terminate called without an active exception"):
    torch._dynamo, imported by DDP while the group existed, kept references to the group, so
    destroy_process_group could not free it; its gloo workers outlived the interpreter, and one
    still freeing the last barrier's Python tensor aborted the process when Python shut down.
    join() now imports dynamo first: once nothing holds a DDP model, leaving join() must free
    the group and join its workers (the count was unchanged before the fix)."""
    threads = json.loads((two_ranks[0] / f"threads{rank}.json").read_text())
    if threads["inside"] < 0:
        pytest.skip("no /proc to count threads in")
    if threads["inside"] == 0 and tuple(map(int, torch.__version__.split(".")[:2])) < (2, 11):
        pytest.skip("this torch does not name its gloo threads (2.11 does, 2.5 does not)")
    assert threads["inside"] > 0 and threads["after"] == 0, threads


# --------------------------------------------------------------------------- one process
class Pretend(World):
    """Rank ``rank`` of ``size`` without a process group: enough to see the epoch's split."""

    def wrap(self, model):
        return model

    def broadcast_order(self, order):
        return order


def test_ranks_split_every_global_batch_into_disjoint_parts():
    config = TrainConfig(**{**BASE, "batch_size": 48})  # 1,438 = 29·48 + 46: last parts 16/15/15
    alone = Trainer(config)._batches()
    parts = [[Pretend(r, 3).part(b) for b in Trainer(config, world=Pretend(r, 3))._batches()]
             for r in range(3)]
    for step, batch in enumerate(alone):
        assert torch.equal(torch.cat([parts[r][step] for r in range(3)]), batch)
    assert [len(parts[r][-1]) for r in range(3)] == [16, 15, 15]
    world = Pretend(0, 3)
    scales = [world.loss_scale(len(parts[r][-1]), 46) for r in range(3)]
    means = [torch.rand(()) for _ in range(3)]  # per-part mean losses; DDP averages the ranks
    ddp = sum(s * m for s, m in zip(scales, means)) / 3
    torch.testing.assert_close(ddp, sum(len(parts[r][-1]) * means[r] for r in range(3)) / 46)


def test_batch_not_divisible_by_the_processes_is_refused():
    with pytest.raises(SmoothcertError, match="batch size 64 is the global batch.*multiple of 3"):
        Trainer(TrainConfig(**{**BASE, "batch_size": 64}), world=Pretend(0, 3))


def test_alone_without_world_size_in_the_environment():
    with join("cpu", env={"RANK": "0"}) as world:
        assert (world.rank, world.size, world.is_main, world.distributed) == (0, 1, True, False)
        assert not dist.is_initialized()


def test_world_size_without_a_launcher_is_refused():
    refused = pytest.raises(SmoothcertError, match="MASTER_ADDR, MASTER_PORT are not set.*torchrun")
    with refused, join("cpu", env={"WORLD_SIZE": "2", "RANK": "0"}):
        pass
    assert not dist.is_initialized()


# --------------------------------------------------------------------------- torchrun
def test_torchrun_trains_one_run_folder(two_ranks):
    run = two_ranks[0] / "cli"  # `smoothcert train` in both processes
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.yaml", "log.tsv"]
    model, meta = model_from_checkpoint(run / "checkpoint.pt")
    assert (meta["arch"], meta["dataset"], meta["epoch"]) == ("digits_cnn", "digits", 1)
    assert meta["config"]["batch_size"] == 64  # the global batch
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    streams = load_checkpoint(run / "checkpoint.pt").train_state["rank_noise_generators"]
    assert len(streams) == 2 and not torch.equal(*streams)  # the ranks drew different noise
    (row,) = read_log(run / "log.tsv")
    assert 0 < float(row["train_acc"]) <= 1 and math.isfinite(float(row["test_acc"]))


def folder_checkpoint(path, classes) -> Path:
    """A random-weight torchvision ResNet-18 for 16×16 inputs of an image folder's classes."""
    from smoothcert.models import build_model
    from smoothcert.models.checkpoint import checkpoint_meta, save_checkpoint

    torch.manual_seed(0)
    shape, mean, std = (3, 16, 16), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    model = build_model("torchvision:resnet18", len(classes), shape, mean, std)
    meta = checkpoint_meta(arch="torchvision:resnet18", dataset="imagefolder",
                           num_classes=len(classes), input_shape=shape, mean=mean, std=std,
                           noise={"name": "gaussian", "sigma": 0.25},
                           method={"name": "gaussian", "hparams": {}}, epoch=0, config={},
                           classes=classes)
    return save_checkpoint(path, model, meta)


def test_torchrun_certifies_an_image_folder_with_one_progress_bar(tmp_path):
    """Two CPU ranks on a folder of JPEG/PNG files: each rank writes its shard (decoding with a
    worker of its own), only rank 0 draws a progress bar, and the merge equals one process.
    The one torchrun certification: the shard a rank takes from torchrun's environment is
    the runner's, whatever the dataset (in memory: test_cli's shards test sets RANK and
    WORLD_SIZE itself)."""
    from conftest import CLASSES, write_folder

    root = write_folder(tmp_path / "data")
    checkpoint = folder_checkpoint(tmp_path / "r18.pt", list(CLASSES))
    run = ["certify", str(checkpoint), "--data-root", str(root), "--n0", "8", "--n", "40",
           "--batch", "32", "--workers", "1", "--device", "cpu", "--progress", "always", "--out"]
    # "--" ends torchrun's own options: else it takes --n and --max for abbreviations of its
    # --nnodes and --max-restarts (pytorch/pytorch#120601)
    done = torchrun("-m", "smoothcert.cli", "--", *run, "sharded.tsv", cwd=tmp_path)
    assert "certify sharded.shard0-of-2.tsv" in done.stderr  # rank 0's bar
    assert "shard1-of-2.tsv:" not in done.stderr and "certify sharded.shard1" not in done.stderr
    shards = sorted(map(str, tmp_path.glob("sharded.shard*-of-2.tsv")))
    assert [Path(p).name for p in shards] == ["sharded.shard0-of-2.tsv", "sharded.shard1-of-2.tsv"]
    assert main(["merge", *shards, "--out", str(tmp_path / "merged.tsv")]) == 0
    assert main([*run, str(tmp_path / "one.tsv"), "--no-progress"]) == 0

    def rows(name):
        return [{k: v for k, v in r.items() if k != "time"}
                for r in read_records(tmp_path / name).rows()]

    assert len(rows("one.tsv")) == 9 and rows("merged.tsv") == rows("one.tsv")


if __name__ == "__main__":  # one of the processes that two_ranks starts with torchrun
    import faulthandler

    faulthandler.enable()  # a fatal signal prints every thread's Python stack
    _two_ranks(Path(sys.argv[1]))
