"""Data-parallel training on ``torch.distributed``: who this process is, and the few collectives
the trainer needs.

A run launched by ``torchrun --nproc-per-node K`` has K processes (ranks), each told its place by
the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``).
:func:`join` turns that into a :class:`World`: it joins the default process group only when
``WORLD_SIZE`` > 1 (backend ``gloo`` for a CPU device, ``nccl`` for CUDA, where rank r of a node
trains on ``cuda:LOCAL_RANK``) and leaves it afterwards; without ``WORLD_SIZE`` > 1 it is a world
of one process and no collective runs, so single-process results do not change.

How the trainer uses it (``train.py``): every rank builds the same epoch order (the shuffle
generator has the same seed everywhere; the order is also broadcast from rank 0, so a method's
order can never diverge); every global batch of B examples is cut into K contiguous parts by
:meth:`World.part`, rank r training on part r, so the union of the ranks' examples is exactly the
single-process epoch. The model is wrapped in ``DistributedDataParallel`` (:meth:`World.wrap`),
which averages the gradients; :meth:`World.loss_scale` makes that average the gradient of the
mean loss over the global batch also when the parts differ in size (the last batch).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ..errors import SmoothcertError


@dataclass(frozen=True)
class World:
    """Rank ``rank`` of ``size`` data-parallel processes, computing on ``device``.

    ``size`` = 1 (the default) is a single process: every collective is then a no-op that
    returns its input, so code written for K processes runs unchanged on one.
    """

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the run's files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    # ------------------------------------------------------------------ splitting the work
    def check_batch(self, batch_size: int) -> None:
        """The global batch must split into equal parts, one per process."""
        if batch_size % self.size:
            raise SmoothcertError(
                f"the batch size {batch_size} is the global batch, split evenly over the "
                f"{self.size} processes; use a multiple of {self.size}"
            )

    def part(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of a global batch: sizes differ by at most one."""
        return batch.tensor_split(self.size)[self.rank] if self.distributed else batch

    def loss_scale(self, part_size: int, batch_size: int) -> float:
        """K·b_r/b: with it, DDP's mean over ranks of the scaled per-rank mean losses is the
        mean loss over the global batch of b examples (1 when the parts are equal)."""
        return self.size * part_size / batch_size

    # ------------------------------------------------------------------ collectives
    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` in ``DistributedDataParallel`` (gradients averaged over the ranks, buffers
        broadcast from rank 0 at each forward); the model itself when alone."""
        if not self.distributed:
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over the ranks (a new tensor on ``tensor``'s device)."""
        if not self.distributed:
            return tensor
        out = tensor.to(self.device, copy=True)
        dist.all_reduce(out)
        return out.to(tensor.device)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``tensor`` on every rank (same shape and dtype everywhere)."""
        if not self.distributed:
            return tensor
        out = tensor.to(self.device, copy=True)
        dist.broadcast(out, src=0)
        return out.to(tensor.device)

    def broadcast_order(self, order: torch.Tensor) -> torch.Tensor:
        """Rank 0's 1-D int64 ``order`` on every rank, whatever its length on the others."""
        if not self.distributed:
            return order
        length = self.broadcast(torch.tensor([len(order)]))
        mine = order if len(order) == int(length) else torch.zeros(int(length), dtype=order.dtype)
        return self.broadcast(mine)

    def gather(self, obj) -> list:
        """``obj`` of every rank, in rank order (picklable objects)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait for every rank (a tiny all-reduce, which works alike on gloo and NCCL)."""
        self.all_reduce_sum(torch.zeros(1, device=self.device))


def merge_rows(world: World, values: torch.Tensor, mine: torch.Tensor) -> torch.Tensor:
    """Rows of ``values`` (N, ...) that only their owners changed, merged over the ranks.

    ``mine`` (N,) bool marks the rows this rank changed; every other row must be equal on all
    ranks. A row changed by exactly one rank gets that rank's value exactly (x + 0 = x); one
    changed by several gets their mean.
    """
    if not world.distributed:
        return values
    shape = (-1,) + (1,) * (values.dim() - 1)
    owned = mine.to(values.dtype).view(shape)
    total = world.all_reduce_sum(values * owned)
    owners = world.all_reduce_sum(mine.to(values.dtype)).view(shape)
    return torch.where(owners > 0, total / owners.clamp_min(1), values)


def env_int(name: str, env: Mapping[str, str] = os.environ, *, default: int | None = None,
            minimum: int = 0) -> int:
    """The integer ``env[name]`` set by a launcher (torchrun, SLURM), at least ``minimum``;
    ``default`` when it is not set. Anything else is one SmoothcertError naming the variable."""
    if name not in env and default is not None:
        return default
    text = env[name]
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise SmoothcertError(
            f"environment variable {name}={text!r} must be an integer >= {minimum}; fix or "
            "unset it (it is set by torchrun or SLURM)")
    return value


def launcher_rank(env: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) as torchrun sets them, checked (0 <= RANK < WORLD_SIZE); None when
    either is not set."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    rank, size = env_int("RANK", env), env_int("WORLD_SIZE", env, minimum=1)
    if rank >= size:
        raise SmoothcertError(f"environment variable RANK={rank} must be below "
                              f"WORLD_SIZE={size}; fix or unset them")
    return rank, size


def slurm_array_task(env: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(task index from 0, task count) of a SLURM job array: SLURM_ARRAY_TASK_ID less
    SLURM_ARRAY_TASK_MIN (0 when unset), of SLURM_ARRAY_TASK_COUNT; None outside an array. An id
    outside MIN..MIN+COUNT−1 (an array with a step, or a list of ids) cannot name a shard."""
    if "SLURM_ARRAY_TASK_ID" not in env or "SLURM_ARRAY_TASK_COUNT" not in env:
        return None
    task = env_int("SLURM_ARRAY_TASK_ID", env)
    count = env_int("SLURM_ARRAY_TASK_COUNT", env, minimum=1)
    first = env_int("SLURM_ARRAY_TASK_MIN", env, default=0)
    if not first <= task < first + count:
        raise SmoothcertError(
            f"SLURM_ARRAY_TASK_ID={task} lies outside {first}..{first + count - 1} "
            f"(SLURM_ARRAY_TASK_MIN..MIN+COUNT-1); use a contiguous array such as "
            f"--array={first}-{first + count - 1}, or pass --shard-index and --num-shards")
    return task - first, count


def world_size_from_env(env: Mapping[str, str] = os.environ) -> int:
    """``WORLD_SIZE`` as torchrun sets it; 1 when absent."""
    return env_int("WORLD_SIZE", env, default=1, minimum=1)


def rank_device(device: torch.device, env: Mapping[str, str] = os.environ) -> torch.device:
    """The device of this rank: ``cuda`` without an index becomes ``cuda:LOCAL_RANK`` (one GPU
    per process); any other device is kept."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", env_int("LOCAL_RANK", env, default=0))
    return device


LAUNCH_ENV = ("RANK", "MASTER_ADDR", "MASTER_PORT")
"""What ``env://`` needs besides ``WORLD_SIZE``; torchrun sets all of them."""


def _check_launch_env(env: Mapping[str, str]) -> None:
    missing = [name for name in LAUNCH_ENV if name not in env]
    if missing:
        raise SmoothcertError(
            f"WORLD_SIZE={env['WORLD_SIZE']} asks for data-parallel training, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; launch with "
            "torchrun, or unset WORLD_SIZE to train in one process"
        )
    launcher_rank(env)  # RANK an integer below WORLD_SIZE


DRAIN_SECONDS = 0.2
"""How long a rank that joined a group sleeps before destroying it. A gloo worker frees each
finished collective right after the caller was woken; where the caller already dropped the
collective's tensors (``all_gather_object``'s, a barrier's), freeing them needs the GIL. Torch
2.5's ``~ProcessGroupGloo`` joins its workers while its caller holds the GIL, so a worker
still waiting for it deadlocks the rank for good (seen on a rank whose peer had exited:
main thread in ``std::thread::join``, the worker in ``gil_scoped_acquire``). Sleeping
releases the GIL and lets every worker finish first; no collective is needed, so a rank
leaving on an exception (its peers gone) sleeps and leaves as well."""


@contextlib.contextmanager
def join(device="cpu", env: Mapping[str, str] = os.environ) -> Iterator[World]:
    """The :class:`World` of this process for a block.

    An already initialised default process group (e.g. one the caller set up) is used as it is.
    Otherwise, with ``WORLD_SIZE`` > 1 in ``env`` (torchrun), the process joins one through
    ``env://`` (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``), backend ``gloo`` on CPU and
    ``nccl`` on CUDA, and leaves it when the block ends. Else it is a world of one.

    Leaving destroys the group only once nothing holds it any more: objects that keep a
    ``DistributedDataParallel`` model keep its group alive until they are freed, and it must
    not be alive when the interpreter shuts down (see :func:`_import_dynamo_first`).
    """
    device = torch.device(device)
    joined = not dist.is_initialized() and world_size_from_env(env) > 1
    if joined or (dist.is_initialized() and dist.get_world_size() > 1):
        device = rank_device(device, env)
        if device.type == "cuda":
            torch.cuda.set_device(device)
    if joined:
        _check_launch_env(env)
        _import_dynamo_first()
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://")
    try:
        if dist.is_initialized() and dist.get_world_size() > 1:
            yield World(dist.get_rank(), dist.get_world_size(), device)
        else:
            yield World(0, 1, device)
    finally:
        if joined:
            time.sleep(DRAIN_SECONDS)  # see DRAIN_SECONDS: the GIL free for the gloo workers
            dist.destroy_process_group()


def _import_dynamo_first() -> None:
    """Import ``torch._dynamo`` before the default process group exists.

    Importing it while a group exists (``DistributedDataParallel`` does so on first use) leaves
    about ten references to that group's Python object in dynamo's tables for good (torch
    2.15), so ``destroy_process_group()`` cannot free the group and its gloo worker threads
    live on into interpreter shutdown. A worker frees each finished collective's tensors after
    the caller has moved on; when the caller already dropped such a tensor's Python object, the
    worker takes the GIL to free it, and once the interpreter is finalizing that thread is
    unwound and the process aborts with "terminate called without an active exception": the
    abort that killed a rank now and then right after its last ``barrier()``. Imported first,
    dynamo holds no reference, the group is freed when the block ends and its workers are
    joined while Python is alive.
    """
    import torch._dynamo  # noqa: F401  (for its import-time side effect only)
