"""Import an improved-diffusion or guided-diffusion checkpoint as a diffusers folder.

``smoothcert import-checkpoint FILE.pt --format improved-diffusion|guided-diffusion
[--preset carlini-cifar10|carlini-imagenet] [--param KEY=VALUE ...] --out FOLDER`` reads the
bare ``UNetModel.state_dict()`` (weights only), renames and splits its tensors into the diffusers
``UNet2DModel`` of :func:`~smoothcert.denoisers.openai_unet.diffusers_unet_config` and writes a
pipeline folder (``unet/``, ``scheduler/``, ``model_index.json``) that ``--denoiser
diffusers:FOLDER`` loads. The mapping of the two layouts is described in
:mod:`smoothcert.denoisers.openai_unet`; here it is one table, built from the flags, of the
file's keys, their shapes and the diffusers tensors each becomes, so that a missing, extra or
mis-shaped key is refused in one line before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SmoothcertError
from ..io import check_not_input, file_sha256
from ..models.checkpoint import check_finite
from .ddpm import DiffusionModel, require_diffusers
from .openai_unet import (
    TIMESTEP_SCALE_KEY,
    attention_levels,
    diffusers_unet_config,
    head_width,
    resolve_flags,
    scheduler_config,
    timestep_scale,
)

# Sub-modules of a ResBlock (their name → diffusers ResnetBlock2D's); in_layers.1 and
# out_layers.1-2 are SiLU and Dropout, without weights.
_RESBLOCK = {"in_layers.0": "norm1", "in_layers.2": "conv1", "emb_layers.1": "time_emb_proj",
             "out_layers.0": "norm2", "out_layers.3": "conv2", "skip_connection": "conv_shortcut"}


@dataclass(frozen=True)
class _Entry:
    """One tensor of the file: its key and shape, and the diffusers tensors it becomes."""

    key: str
    shape: tuple[int, ...]
    convert: Callable[[torch.Tensor], dict[str, torch.Tensor]]


def module_pairs(flags: Mapping) -> list[tuple[str, str, str]]:
    """(their module, diffusers module, kind) for every module with weights, in the order of
    ``UNetModel.__init__``; kind is "plain" (weight and bias renamed), "resblock", "attention",
    "down" (Downsample's ``op``) or "up" (Upsample's ``conv``)."""
    attends, blocks = attention_levels(flags), flags["num_res_blocks"]
    resample = "resblock" if flags["resblock_updown"] else None
    pairs = [("time_embed.0", "time_embedding.linear_1", "plain"),
             ("time_embed.2", "time_embedding.linear_2", "plain"),
             ("input_blocks.0.0", "conv_in", "plain")]
    k, last = 1, len(attends) - 1
    for level, attends_here in enumerate(attends):
        for i in range(blocks):
            pairs.append((f"input_blocks.{k}.0", f"down_blocks.{level}.resnets.{i}", "resblock"))
            if attends_here:
                pairs.append((f"input_blocks.{k}.1", f"down_blocks.{level}.attentions.{i}",
                              "attention"))
            k += 1
        if level != last:
            pairs.append((f"input_blocks.{k}.0", f"down_blocks.{level}.downsamplers.0",
                          resample or "down"))
            k += 1
    pairs += [("middle_block.0", "mid_block.resnets.0", "resblock"),
              ("middle_block.1", "mid_block.attentions.0", "attention"),
              ("middle_block.2", "mid_block.resnets.1", "resblock")]
    m = 0
    for up, level in enumerate(reversed(range(len(attends)))):
        for j in range(blocks + 1):  # one block more on the way up, as in UNetModel
            pairs.append((f"output_blocks.{m}.0", f"up_blocks.{up}.resnets.{j}", "resblock"))
            layer = 1
            if attends[level]:
                pairs.append((f"output_blocks.{m}.1", f"up_blocks.{up}.attentions.{j}",
                              "attention"))
                layer = 2
            if level and j == blocks:
                pairs.append((f"output_blocks.{m}.{layer}", f"up_blocks.{up}.upsamplers.0",
                              resample or "up"))
            m += 1
    return pairs + [("out.0", "conv_norm_out", "plain"), ("out.2", "conv_out", "plain")]


def _renamed(target: str) -> Callable[[torch.Tensor], dict[str, torch.Tensor]]:
    return lambda t: {target: t}


def _squeezed(target: str) -> Callable[[torch.Tensor], dict[str, torch.Tensor]]:
    return lambda t: {target: t.reshape(t.shape[0], -1)}  # 1×1 Conv1d → Linear


def _split_qkv(dst: str, heads: int, legacy: bool):
    """The packed qkv convolution (3C, C, 1) or bias (3C,) as to_q, to_k, to_v. Legacy order
    (QKVAttentionLegacy; improved-diffusion's QKVAttention): rows are [q, k, v] per head, heads
    outermost; the new order (guided-diffusion's use_new_attention_order): [q; k; v], each
    [head 0; head 1; …]. diffusers keeps each of q, k, v as [head 0; head 1; …]."""
    def convert(t: torch.Tensor) -> dict[str, torch.Tensor]:
        rest = t.shape[1:2]  # (C,) for the weight, () for the bias
        flat = t.reshape(t.shape[0], *rest)
        per = (flat.reshape(heads, 3, -1, *rest).transpose(0, 1) if legacy
               else flat.reshape(3, heads, -1, *rest))
        return {f"{dst}.to_{n}.{_last(flat)}": per[i].reshape(-1, *rest).contiguous()
                for i, n in enumerate("qkv")}
    return convert


def _last(flat: torch.Tensor) -> str:
    return "weight" if flat.dim() == 2 else "bias"


def _module_entries(src: str, dst: str, kind: str, expected: Mapping, flags) -> list[_Entry]:
    """The file entries of one module, with the shapes the flags give it (from ``expected``,
    the diffusers model's state dict)."""
    out: list[_Entry] = []
    if kind == "attention":
        channels = expected[f"{dst}.group_norm.weight"].shape[0]
        split = _split_qkv(dst, channels // head_width(flags),
                           legacy=not flags["use_new_attention_order"])
        out += [_Entry(f"{src}.norm.{p}", tuple(expected[f"{dst}.group_norm.{p}"].shape),
                       _renamed(f"{dst}.group_norm.{p}")) for p in ("weight", "bias")]
        out += [_Entry(f"{src}.qkv.weight", (3 * channels, channels, 1), split),
                _Entry(f"{src}.qkv.bias", (3 * channels,), split),
                _Entry(f"{src}.proj_out.weight", (channels, channels, 1),
                       _squeezed(f"{dst}.to_out.0.weight")),
                _Entry(f"{src}.proj_out.bias", (channels,), _renamed(f"{dst}.to_out.0.bias"))]
        return out
    names = {"plain": {"": ""}, "resblock": _RESBLOCK, "down": {"op": "conv"},
             "up": {"conv": "conv"}}[kind]
    for theirs, ours in names.items():
        for p in ("weight", "bias"):
            target = ".".join(filter(None, (dst, ours, p)))
            if target in expected:  # a ResBlock has a conv_shortcut only when channels change
                out.append(_Entry(".".join(filter(None, (src, theirs, p))),
                                  tuple(expected[target].shape), _renamed(target)))
    return out


def layout(flags: Mapping, expected: Mapping[str, torch.Tensor]) -> dict[str, _Entry]:
    """Every key of the repositories' ``UNetModel(flags).state_dict()``, with its shape and its
    conversion; ``expected`` is the diffusers model's state dict (for the shapes)."""
    entries = [e for src, dst, kind in module_pairs(flags)
               for e in _module_entries(src, dst, kind, expected, flags)]
    return {e.key: e for e in entries}


def convert_state_dict(state: Mapping[str, torch.Tensor], flags: Mapping,
                       expected: Mapping[str, torch.Tensor], where="the file") -> dict:
    """``state`` (the repositories' UNetModel keys) as the diffusers model's state dict, in
    float32. Missing or unexpected keys, shapes that disagree with the flags and non-finite
    values raise one SmoothcertError naming them."""
    entries = layout(flags, expected)
    _check_fit(state, entries, where)
    check_finite(state, where)  # as loading a checkpoint refuses them
    converted: dict[str, torch.Tensor] = {}
    for key, entry in entries.items():
        converted.update(entry.convert(state[key].detach().to(torch.float32)))
    if set(converted) != set(expected):  # the table covers the model: a bug otherwise
        raise AssertionError(sorted(set(expected) ^ set(converted))[:5])
    return converted


def _check_fit(state: Mapping, entries: Mapping[str, _Entry], where) -> None:
    bad_type = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    missing = [k for k in entries if k not in state]
    unexpected = [k for k in state if k not in entries]
    shapes = [f"{k} {tuple(state[k].shape)} vs {e.shape}" for k, e in entries.items()
              if k in state and isinstance(state[k], torch.Tensor)
              and tuple(state[k].shape) != e.shape]
    parts = [f"{len(keys)} {what} ({_few(keys)})" for what, keys in (
        ("missing keys", missing), ("unexpected keys", unexpected),
        ("shape mismatches (file vs flags)", shapes), ("entries that are not tensors", bad_type))
        if keys]
    if parts:
        raise SmoothcertError(
            f"{where} does not fit the UNet of these flags: {', '.join(parts)}; check --format, "
            "--preset and --param (image_size, num_channels, num_res_blocks, channel_mult, "
            "attention_resolutions, learn_sigma, resblock_updown)")


def _few(keys: list[str], count: int = 3) -> str:
    return ", ".join(keys[:count]) + (", …" if len(keys) > count else "")


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The bare state dict saved by improved/guided-diffusion (``torch.save(model.state_dict())``),
    loaded weights-only on CPU; anything else is refused in one line."""
    from ..models.importers import read_reference

    obj = read_reference(path)
    if not isinstance(obj, Mapping) or not obj:
        raise SmoothcertError(f"{path} is not a bare UNetModel state dict (it holds "
                              f"{type(obj).__name__}); check --format")
    return dict(obj)


def build_unet(flags: Mapping, state: Mapping[str, torch.Tensor] | None = None, where="the file"):
    """The diffusers ``UNet2DModel`` of ``flags`` in eval mode, holding ``state`` (converted by
    :func:`convert_state_dict`) when given."""
    diffusers = require_diffusers("importing an improved/guided-diffusion checkpoint")
    unet = diffusers.UNet2DModel(**diffusers_unet_config(flags))
    if state is not None:
        unet.load_state_dict(convert_state_dict(state, flags, unet.state_dict(), where),
                             strict=True)
    return unet.eval()


def import_openai_unet(path: str | os.PathLike, fmt: str, *, out: str | os.PathLike,
                       params: Mapping | None = None, preset: str | None = None,
                       overwrite: bool = False) -> Path:
    """Convert the improved/guided-diffusion checkpoint at ``path`` (``fmt``; flags from
    :func:`~smoothcert.denoisers.openai_unet.resolve_flags`) into the diffusers folder ``out``;
    returns ``out``. Everything is checked (flags, keys, shapes, finite values) before ``out``
    is written, and the folder is written beside it and renamed into place, so a refused or
    failed import leaves no ``out``. ``unet/config.json`` records the format, flags and the
    file's SHA-256 (``_smoothcert_imported_from``); ``scheduler/scheduler_config.json`` the
    timestep scale (``_smoothcert_timestep_scale``), both ignored by diffusers itself."""
    flags = resolve_flags(fmt, params, preset)
    out = Path(out)
    check_not_input(out, [path])
    if out.exists() and not overwrite:
        raise SmoothcertError(f"{out} already exists; choose another --out or pass --force")
    unet = build_unet(flags, read_state_dict(path), path)
    diffusers = require_diffusers("importing an improved/guided-diffusion checkpoint")
    scheduler = diffusers.DDPMScheduler(**scheduler_config(flags))
    scheduler.register_to_config(**{TIMESTEP_SCALE_KEY: timestep_scale(flags)})
    unet.register_to_config(_smoothcert_imported_from={
        "format": fmt, "preset": preset, "file": os.path.basename(os.fspath(path)),
        "sha256": file_sha256(path), "flags": flags})
    return DiffusionModel(unet, scheduler).save_pretrained(out)


__all__ = ["build_unet", "convert_state_dict", "import_openai_unet", "layout",
           "module_pairs", "read_state_dict"]
