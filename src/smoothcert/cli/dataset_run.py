"""What certify, predict and attack share: they run a checkpoint's smoothed classifier (behind a
denoiser with ``--denoiser``) over a dataset split into a record file, through one call of
:func:`smoothcert.runs.certify_dataset`."""

from __future__ import annotations

import argparse
import os

from ..errors import SmoothcertError
from .common import (
    BATCH,
    DRAWS,
    add_common,
    example_args,
    image_size_arg,
    is_main_rank,
    progress_mode,
    resolve_device,
    workers_arg,
)

# --------------------------------------------------------------------------- flags
DENOISER_HELP = ("a trained denoiser checkpoint (train --method denoiser-mse|denoiser-stability, "
                 "import-checkpoint --format denoised-smoothing) or diffusers:FOLDER (a local "
                 "diffusers DDPM pipeline or UNet+scheduler folder), put in front of the "
                 "classifier: the smoothed function is classifier(denoiser(x + noise))")


def model_args(p) -> None:
    """The classifier checkpoint and the denoiser in front of it."""
    p.add_argument("checkpoint", nargs="+",
                   help="a smoothcert classifier checkpoint (checkpoint.pt or its run folder); "
                        "several of one dataset form one ensemble base classifier")
    p.add_argument("--ensemble-mode", choices=("logits", "softmax"),
                   help="how several checkpoints combine: the mean of their logits (default) or "
                        "of their softmaxes")
    p.add_argument("--consensus", type=consensus_arg, metavar="K|exact",
                   help="K-consensus (Horváth et al. 2022): on each noisy input the first K "
                        "members run first and, where they agree, their class is the vote (the "
                        "certificates are this consensus classifier's: K < all members is "
                        "cheaper and another classifier, K = all members the ensemble itself); "
                        "'exact' (with --ensemble-mode softmax): each noisy input stops once the "
                        "members still to run cannot change its vote, so the certificates are "
                        "the ensemble's and only the cost falls")
    p.add_argument("--denoiser", metavar="SPEC", help=DENOISER_HELP)


def noise_args(p) -> None:
    from ..noise.base import NOISES

    p.add_argument("--noise", choices=sorted(NOISES),
                   help="smoothing noise; σ is its per-coordinate standard deviation (default: "
                        "the checkpoint's)")
    p.add_argument("--sigma", type=float,
                   help="noise level (default: the checkpoint's; required for a classifier "
                        "trained without noise, e.g. train --method standard)")


def monte_carlo_args(p, n_help: str = "draws, at most 2**53 (default 100000)") -> None:
    p.add_argument("--n", type=DRAWS, default=100_000, help=n_help)
    p.add_argument("--alpha", type=float, default=0.001, help="failure probability")
    p.add_argument("--batch", type=BATCH, default=1000,
                   help="noisy inputs per forward pass, at most 2**31-1; lower it when the "
                        "device runs out of memory")


def dataset_run_args(p) -> None:
    """Which examples, the seed, the record file and the shard: every runner command's flags."""
    example_args(p, "test", "the split whose examples are run",
                 "run seed; example idx uses (seed, idx)")
    p.add_argument("--out", required=True, help="record file (TSV); a manifest goes beside it")
    p.add_argument("--num-shards", type=int, help="default: WORLD_SIZE or SLURM array size")
    p.add_argument("--shard-index", type=int, help="default: RANK or SLURM array task id")
    image_size_arg(p, "image folders: side S of the square inputs (default: the "
                      "checkpoint's input size)")
    workers_arg(p)
    _engine_args(p)
    add_common(p)


def _engine_args(p) -> None:
    """The engine's optional accelerations; each changes the computed function, so each is
    recorded in the run's identity."""
    from ..smoothing.engine import PRECISIONS

    p.add_argument("--precision", default="fp32", choices=tuple(PRECISIONS),
                   help="run the model under bf16/fp16 autocast (noise stays float32; the "
                        "certificate is then for the reduced-precision classifier)")
    p.add_argument("--channels-last", action="store_true",
                   help="channels-last memory format for the model and its inputs")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")


# --------------------------------------------------------------------------- the shard
def shard_from_env(env=os.environ) -> tuple[int, int]:
    """(shard index, number of shards) from torchrun's RANK/WORLD_SIZE or a SLURM array; a
    malformed variable is one SmoothcertError naming it."""
    from ..training.distributed import launcher_rank, slurm_array_task

    return launcher_rank(env) or slurm_array_task(env) or (0, 1)


def _shard(args) -> tuple[int, int]:
    """--shard-index/--num-shards over the launcher's rank (given both, the launcher is not
    asked)."""
    given = args.num_shards is not None and args.shard_index is not None
    index, count = (0, 1) if given else shard_from_env()  # flags override the launcher's
    count = args.num_shards if args.num_shards is not None else count
    index = args.shard_index if args.shard_index is not None else index
    if count < 1 or not 0 <= index < count:
        raise SmoothcertError(f"--shard-index must lie in 0..{count - 1}, got {index}")
    return index, count


# --------------------------------------------------------------------------- the run
def run_certifier(certifier: str, args, options: dict) -> None:
    """Load the checkpoint's dataset split and hand everything to ``certify_dataset``; the
    certifier is ``--certifier`` where the command has one, else ``certifier``."""
    from ..models.checkpoint import load_checkpoint
    from ..runs import certify_dataset
    from ..runs.inputs import check_classifier
    from ..runs.records import shard_path
    from ..training.distributed import rank_device

    metas = [load_checkpoint(c).meta for c in args.checkpoint]
    for checkpoint, meta in zip(args.checkpoint, metas):
        check_classifier(checkpoint, meta)  # before the dataset is loaded
    device = rank_device(resolve_device(args.device))  # one GPU per torchrun rank
    model = _model(args, device)  # an ensemble's members checked before the dataset loads
    dataset, shard = _run_dataset(args, metas[0]), _shard(args)
    certify_dataset(
        model,
        dataset,
        sigma=args.sigma,
        noise=args.noise,
        n0=getattr(args, "n0", 100),  # predict and attack have no selection draws
        n=args.n,
        alpha=args.alpha,
        batch=args.batch,
        seed=args.seed,
        skip=args.skip,
        max_count=args.max_count,
        certifier=getattr(args, "certifier", certifier),
        options=options,
        out=args.out,
        shard=shard,
        device=device,
        workers=args.workers,
        engine={"precision": args.precision, "channels_last": args.channels_last,
                "compile": args.compile},
        progress=progress_mode(args) if is_main_rank() else False,
        denoiser=args.denoiser,
    )
    print(f"records: {shard_path(args.out, *shard)}")
    per_input = getattr(model, "evaluations_per_input", lambda: None)()
    if per_input is not None:  # what a consensus saved, in this invocation
        print(f"member evaluations per noisy input: {per_input:.3f} of {len(model.members)} "
              f"({model.evaluations} in all)")


def consensus_arg(text: str):
    """--consensus: 'exact' or a positive integer K (the upper bound, the number of members, is
    checked when the ensemble is built)."""
    if text == "exact":
        return text
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"expected 'exact' or a positive integer K, got {text!r}")
    return k


def _model(args, device):
    """The one checkpoint, or the :class:`~smoothcert.models.ensemble.Ensemble` of several (or
    of one, when --ensemble-mode or --consensus asks for it)."""
    from ..models.ensemble import Ensemble

    if len(args.checkpoint) == 1 and args.ensemble_mode is None and args.consensus is None:
        return args.checkpoint[0]
    return Ensemble.from_checkpoints(args.checkpoint, args.ensemble_mode or "logits",
                                     args.consensus, device=device)


def _run_dataset(args, meta: dict):
    """The split to run on; an image folder at the checkpoint's input size unless
    ``--image-size`` says otherwise."""
    from ..data.datasets import load_dataset
    from ..data.registry import dataset_spec

    name = args.dataset or meta["dataset"]
    image_size = args.image_size
    if image_size is None and dataset_spec(name).streamed:
        image_size = int(meta["input_shape"][-1])
    return load_dataset(name, args.split, data_root=args.data_root, image_size=image_size)
