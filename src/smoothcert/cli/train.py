"""``smoothcert train``: one flag per :class:`~smoothcert.training.TrainConfig` field, generated
from the field, over an optional YAML recipe; then one call of
:func:`smoothcert.training.train`."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping

from ..errors import SmoothcertError
from .catalog import field_flag, names
from .common import (
    add_common,
    command,
    is_main_rank,
    parse_params,
    progress_mode,
    resolve_device,
    workers_arg,
)


# --------------------------------------------------------------------------- flags
def _train_args(p):
    """One flag per TrainConfig field, as the catalog describes it (its help text, the flag
    where it is not --field-name, the names it takes, listed in the epilog), the deprecated
    --dd-* spellings of --sigma-param, and the run's own flags."""
    train = names("train")
    p.add_argument("--config", metavar="YAML",
                   help="recipe: a YAML file of TrainConfig fields (configs/); flags override it")
    for field in train["fields"]:
        _field_flag(p, field)
    _old_sigma_flags(p, train["old_sigma_flags"])
    p.add_argument("--out", required=True, help="run folder: checkpoint.pt, log.tsv, config.yaml")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic cuDNN kernels: on a GPU, a resumed run then ends with the "
                        "same weights as an uninterrupted one (slower)")
    workers_arg(p)
    add_common(p, data_root=False)  # --data-root is a field
    p.epilog = _choices_epilog(train["fields"])


def _field_flag(p, field: dict) -> None:
    """The flag of a TrainConfig field (:func:`~smoothcert.cli.catalog.train_field`). An unset
    flag leaves no attribute (argparse.SUPPRESS), so that a recipe's value stands; its help
    states the field's default itself."""
    options = {"dest": field["dest"], "default": argparse.SUPPRESS, "help": field["help"],
               "metavar": field["metavar"]}
    if field["kind"] == "bool":
        options["action"] = argparse.BooleanOptionalAction
    elif field["kind"] == "dict":  # KEY=VALUE, repeatable: one key of the mapping each
        options["action"] = "append"
    else:
        options["type"] = {**_SCALARS, "tuple": _int_tuple}[field["kind"]]
    p.add_argument(field["flag"], **options)


_SCALARS = {"int": int, "float": float, "str": str}  # a kind in the catalog -> its type


def _int_tuple(text: str) -> tuple[int, ...]:
    """``30,60`` -> (30, 60)."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 30,60, got {text!r}") from None


def _old_sigma_flags(p, kinds: dict) -> None:
    """--dd-steps, --dd-step-size, --dd-num-samples, --dd-start-epoch: deprecated spellings of
    ``--sigma-param KEY=VALUE`` for the data-dependent σ mode (``kinds``: each one's type,
    that of its parameter), hidden from the help and read through
    :func:`smoothcert.upgrade.sigma_flags`."""
    for old, kind in kinds.items():
        p.add_argument("--" + old.replace("_", "-"), dest=old, type=_SCALARS[kind],
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _choices_epilog(fields: list[dict]) -> str:
    """The names of every field that takes one from a registry, one line each."""
    lines = ["names (under a method its hyperparameters, set with --param KEY=VALUE; under a σ "
             "mode its parameters, set with --sigma-param KEY=VALUE):"]
    for field in fields:
        if field["choices"] is not None:
            lines += ["", f"{field['flag']} {field['metavar']}"]
            lines += [f"{name}\t{text}" for name, text in field["choices"].items()]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command
@command("train", "train a base classifier, a denoiser or a diffusion model", _train_args,
         # train refuses an existing run folder unless told to continue it
         resume_hint="rerun the same command with --resume to continue")
def cmd_train(args):
    from ..training import TrainConfig, train
    from ..training.recipes import load_recipe

    recipe = load_recipe(args.config) if args.config else {}
    config = TrainConfig.from_dict(_train_fields(recipe, args))
    if config.init_checkpoint is not None:
        from ..io import check_not_input
        from ..training.loop import CHECKPOINT

        init = config.init_checkpoint  # a checkpoint file, or a run folder holding one
        check_not_input(os.path.join(args.out, CHECKPOINT),
                        [init, os.path.join(init, CHECKPOINT)], what="the --init-from checkpoint")
    if args.deterministic:
        import torch

        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    path = train(
        config,
        args.out,
        device=resolve_device(args.device),
        resume=args.resume,
        progress=progress_mode(args),  # off a terminal: a line every 30 s within epochs
        workers=args.workers,
        epoch_lines=True,  # without bars too: a log (SLURM, `make demo > log`) shows each epoch
    )
    if is_main_rank():  # once under torchrun
        print(f"checkpoint: {path}")


def _train_fields(recipe: dict, args) -> dict:
    """The recipe's fields (as :func:`~smoothcert.training.recipes.load_recipe` gives them, in
    the current config format) with the flags' over them. A KEY=VALUE flag sets one key of its
    mapping; a deprecated --dd-* flag replaces its σ-mode parameter, whoever set it
    (:func:`smoothcert.upgrade.sigma_flags`: one deprecation line)."""
    from ..training.config import TrainConfig
    from ..upgrade import OLD_SIGMA_PARAMS, sigma_flags

    fields = dict(recipe)
    for f in dataclasses.fields(TrainConfig):
        if f.default_factory is dict:
            fields[f.name] = _merged(f.name, fields.get(f.name),
                                     parse_params(getattr(args, f.name, []), field_flag(f)))
        elif hasattr(args, f.name):
            fields[f.name] = getattr(args, f.name)
    old = {key: getattr(args, key) for key in OLD_SIGMA_PARAMS if hasattr(args, key)}
    for key in old:
        fields["sigma_mode_params"].pop(OLD_SIGMA_PARAMS[key], None)
    return sigma_flags({**fields, **old}) if old else fields


def _merged(name: str, base, flags: dict) -> dict:
    """The recipe's mapping ``base`` (None: empty) with the flags' keys over it."""
    if base is not None and not isinstance(base, Mapping):
        raise SmoothcertError(f"{name} must be a mapping, got {type(base).__name__}")
    return {**(base or {}), **flags}
