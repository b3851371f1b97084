"""OpenAI's diffusion UNets (improved-diffusion, guided-diffusion) as diffusers ``UNet2DModel``s.

Carlini et al. (ICLR 2023, ethz-spylab/diffusion_denoised_smoothing) denoise with two released
checkpoints: improved-diffusion's ``cifar10_uncond_50M_500K.pt`` (``cifar10/DRM.py``) and
guided-diffusion's ``256x256_diffusion_uncond.pt`` (``imagenet/DRM.py``). Each file is a bare
``state_dict()`` of the repository's ``UNetModel``; the model's settings are not in it but in the
command-line flags the model was created with (``script_util.create_model_and_diffusion``). This
module turns those flags into a diffusers configuration:

- :func:`resolve_flags`: the repository's defaults (``model_and_diffusion_defaults()``), then a
  preset, then the user's ``KEY=VALUE`` flags; a complete dict of :data:`FLAG_TYPES`.
- :func:`diffusers_unet_config`: the ``UNet2DModel(**kwargs)`` whose forward equals
  ``UNetModel(x, t)`` once the weights are converted
  (:func:`~smoothcert.denoisers.openai_import.convert_state_dict`); with ``learn_sigma`` it
  returns 2C channels, ε̂ then the variance, and the one-shot denoiser uses the first C.
- :func:`scheduler_config`: the ``DDPMScheduler(**kwargs)`` of the flags' noise schedule;
  :func:`timestep_scale`: 1000/T when ``rescale_timesteps`` (improved-diffusion then feeds the
  UNet t·1000/T, a float), else 1.
- :data:`PRESETS`: the complete flags of Carlini et al.'s two denoisers (:data:`PRESET_FORMATS`
  names each one's repository).

Carlini et al.'s CIFAR-10 denoiser with random weights, for instance (this module imports
neither torch nor diffusers)::

    flags = PRESETS["carlini-cifar10"]
    unet = diffusers.UNet2DModel(**diffusers_unet_config(flags))
    scheduler = diffusers.DDPMScheduler(**scheduler_config(flags))
    denoiser = DiffusionDenoiser(unet, scheduler, sigma, timestep_scale(flags))

How the two UNets map onto diffusers' (read in openai/improved-diffusion ``improved_diffusion/
unet.py``, ``nn.py``, ``script_util.py`` and openai/guided-diffusion ``guided_diffusion/``, same
files): the same sinusoidal embedding (cos first, frequencies 10000^(−i/half): diffusers'
``flip_sin_to_cos=True, freq_shift=0``) into a two-layer MLP of 4·num_channels; GroupNorm32 (32
groups, eps 1e-5, computed in float32: equal to diffusers' GroupNorm on float32 inputs);
``ResBlock`` = diffusers' ``ResnetBlock2D`` (``in_layers`` → norm1, conv1; ``emb_layers`` →
time_emb_proj; ``out_layers`` → norm2, conv2; ``skip_connection`` → conv_shortcut), with
``use_scale_shift_norm`` = ``resnet_time_scale_shift="scale_shift"`` (scale first, then shift);
``AttentionBlock``'s packed 1×1 ``qkv`` convolution, split per head into [q, k, v] ("legacy"
order, always in improved-diffusion; guided-diffusion unless ``use_new_attention_order``, which
splits q, k, v first) → ``to_q``, ``to_k``, ``to_v``; its q·k scaling 1/√(head channels) is
diffusers'; strided-conv ``Downsample`` and nearest-×2 + conv ``Upsample`` (or, with
guided-diffusion's ``resblock_updown``, a ResBlock with average pooling / nearest upsampling:
``downsample_type="resnet"``); num_res_blocks + 1 blocks per level on the way up, each taking
one skip connection, as diffusers' up blocks do. diffusers has one head width for every
attention block (``attention_head_dim``), so flags whose blocks have different head widths are
refused.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

from ..errors import SmoothcertError, unknown_name

OPENAI_FORMATS = ("improved-diffusion", "guided-diffusion")

# The flags of both repositories' create_model_and_diffusion and their Python types.
FLAG_TYPES: dict[str, type] = {
    "image_size": int, "num_channels": int, "num_res_blocks": int, "num_heads": int,
    "num_heads_upsample": int, "num_head_channels": int, "attention_resolutions": str,
    "channel_mult": str, "dropout": float, "learn_sigma": bool, "sigma_small": bool,
    "class_cond": bool, "diffusion_steps": int, "noise_schedule": str, "timestep_respacing": str,
    "use_kl": bool, "predict_xstart": bool, "rescale_timesteps": bool,
    "rescale_learned_sigmas": bool, "use_checkpoint": bool, "use_scale_shift_norm": bool,
    "resblock_updown": bool, "use_fp16": bool, "use_new_attention_order": bool,
}

# model_and_diffusion_defaults() of improved_diffusion/script_util.py. Its UNet has no
# num_head_channels, resblock_updown or new attention order (fixed here at their "off" values);
# its channel multipliers come from the image size (create_model), which "channel_mult" may
# override for a UNetModel built directly (not a flag of that repository).
_IMPROVED = {
    "image_size": 64, "num_channels": 128, "num_res_blocks": 2, "num_heads": 4,
    "num_heads_upsample": -1, "num_head_channels": -1, "attention_resolutions": "16,8",
    "channel_mult": "", "dropout": 0.0, "learn_sigma": False, "sigma_small": False,
    "class_cond": False, "diffusion_steps": 1000, "noise_schedule": "linear",
    "timestep_respacing": "", "use_kl": False, "predict_xstart": False,
    "rescale_timesteps": True, "rescale_learned_sigmas": True, "use_checkpoint": False,
    "use_scale_shift_norm": True, "resblock_updown": False, "use_fp16": False,
    "use_new_attention_order": False,
}
# model_and_diffusion_defaults() and diffusion_defaults() of guided_diffusion/script_util.py.
_GUIDED = {**_IMPROVED, "num_heads_upsample": -1, "rescale_timesteps": False,
           "rescale_learned_sigmas": False, "sigma_small": False}
DEFAULT_FLAGS: dict[str, dict] = {"improved-diffusion": _IMPROVED, "guided-diffusion": _GUIDED}
# Flags the improved-diffusion UNet does not have: only their defaults are accepted there.
_GUIDED_ONLY = ("num_head_channels", "resblock_updown", "use_new_attention_order")

# create_model's channel multipliers by image size, per repository (channel_mult "" means these).
_CHANNEL_MULTS = {
    "improved-diffusion": {256: (1, 1, 2, 2, 4, 4), 64: (1, 2, 3, 4), 32: (1, 2, 2, 2)},
    "guided-diffusion": {512: (0.5, 1, 1, 2, 2, 4, 4), 256: (1, 1, 2, 2, 4, 4),
                         128: (1, 1, 2, 3, 4), 64: (1, 2, 3, 4)},
}

# Carlini et al.'s two denoisers: the flags of class Args in ethz-spylab/diffusion_denoised_
# smoothing cifar10/DRM.py (improved-diffusion's README row "Unconditional CIFAR-10 with our
# L_hybrid objective and cosine noise schedule", cifar10_uncond_50M_500K.pt) and imagenet/DRM.py
# (guided-diffusion's README row "256x256 model (unconditional)", 256x256_diffusion_uncond.pt;
# DRM.py runs it in float32: use_fp16 False).
PRESETS: dict[str, dict] = {
    "carlini-cifar10": {
        **_IMPROVED, "image_size": 32, "num_channels": 128, "num_res_blocks": 3,
        "num_heads": 4, "attention_resolutions": "16,8", "channel_mult": "1,2,2,2",
        "dropout": 0.3, "learn_sigma": True, "diffusion_steps": 4000,
        "noise_schedule": "cosine", "rescale_timesteps": True, "use_scale_shift_norm": True,
    },
    "carlini-imagenet": {
        **_GUIDED, "image_size": 256, "num_channels": 256, "num_res_blocks": 2,
        "num_heads": 4, "num_head_channels": 64, "attention_resolutions": "32,16,8",
        "channel_mult": "1,1,2,2,4,4", "dropout": 0.0, "learn_sigma": True,
        "diffusion_steps": 1000, "noise_schedule": "linear", "rescale_timesteps": False,
        "use_scale_shift_norm": True, "resblock_updown": True,
    },
}
PRESET_FORMATS = {"carlini-cifar10": "improved-diffusion", "carlini-imagenet": "guided-diffusion"}

TIMESTEP_SCALE_KEY = "_smoothcert_timestep_scale"


def parse_flag(key: str, value) -> object:
    """``value`` (text from ``--param KEY=VALUE``, or a Python value) as flag ``key``'s type;
    booleans as the repositories' ``str2bool`` reads them (yes/true/t/y/1, no/false/f/n/0)."""
    if key not in FLAG_TYPES:
        raise unknown_name("improved/guided-diffusion flag", key, sorted(FLAG_TYPES))
    kind = FLAG_TYPES[key]
    if kind is str and (value is None or isinstance(value, (int, float))) \
            and not isinstance(value, bool):
        return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, str) and kind is not str:
        return _parse_text(key, kind, value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SmoothcertError(f"flag {key} must be a {kind.__name__}, got {value!r}")
    return value


def _parse_text(key: str, kind: type, text: str):
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("yes", "true", "t", "y", "1"):
            return True
        if lowered in ("no", "false", "f", "n", "0"):
            return False
        raise SmoothcertError(f"flag {key}={text} is not a boolean; use True or False")
    try:
        return kind(text)
    except ValueError:
        raise SmoothcertError(f"flag {key}={text} is not a {kind.__name__}") from None


def resolve_flags(fmt: str, params: Mapping | None = None, preset: str | None = None) -> dict:
    """The complete flags of a ``fmt`` model (a key of :data:`DEFAULT_FLAGS`): the repository's
    defaults, updated by ``PRESETS[preset]`` (whose format must be ``fmt``), then by ``params``
    (flag names → values or ``KEY=VALUE`` text). ``channel_mult`` "" becomes the repository's
    multipliers for the image size. Unknown flags, values of the wrong type and flags the
    format's UNet does not have raise one SmoothcertError."""
    if fmt not in DEFAULT_FLAGS:
        raise unknown_name("format", fmt, OPENAI_FORMATS)
    flags = dict(DEFAULT_FLAGS[fmt])
    if preset is not None:
        if preset not in PRESETS:
            raise unknown_name("preset", preset, sorted(PRESETS))
        if PRESET_FORMATS[preset] != fmt:
            raise SmoothcertError(f"preset {preset} is a {PRESET_FORMATS[preset]} model; pass "
                                  f"--format {PRESET_FORMATS[preset]}")
        flags.update(PRESETS[preset])
    for key, value in (params or {}).items():
        flags[key] = parse_flag(key, value)
    if fmt == "improved-diffusion":
        for key in _GUIDED_ONLY:
            if flags[key] != _IMPROVED[key]:
                raise SmoothcertError(f"improved-diffusion's UNet has no {key}; it is a "
                                      "guided-diffusion flag (pass --format guided-diffusion)")
    if flags["timestep_respacing"] in (None, "None"):
        flags["timestep_respacing"] = ""
    if flags["channel_mult"] == "":
        flags["channel_mult"] = _default_mult(fmt, flags["image_size"])
    return flags


def _default_mult(fmt: str, image_size: int) -> str:
    mults = _CHANNEL_MULTS[fmt].get(image_size)
    if mults is None:
        sizes = ", ".join(map(str, sorted(_CHANNEL_MULTS[fmt])))
        raise SmoothcertError(f"{fmt} has channel multipliers only for image_size {sizes}; pass "
                              f"channel_mult=... (e.g. 1,2,2) for image_size {image_size}")
    return ",".join(f"{m:g}" for m in mults)


def channel_mults(flags: Mapping) -> tuple[int, ...]:
    """The UNet's per-level channel multipliers; the first must be 1 (diffusers' timestep
    embedding is as wide as the first level, the repositories' as num_channels)."""
    try:
        mults = tuple(float(m) for m in str(flags["channel_mult"]).split(","))
    except ValueError:
        raise SmoothcertError(f"channel_mult {flags['channel_mult']!r} is not a comma-separated "
                              "list of numbers, e.g. 1,2,2,2") from None
    if mults[0] != 1 or any(m <= 0 or m * flags["num_channels"] % 1 for m in mults):
        raise SmoothcertError(f"channel_mult {flags['channel_mult']} cannot be converted: the "
                              "first multiplier must be 1 and every level a whole channel count")
    return tuple(int(m) if m == int(m) else m for m in mults)


def attention_levels(flags: Mapping) -> tuple[bool, ...]:
    """Per level, whether its blocks attend: create_model turns each resolution r of
    ``attention_resolutions`` into the downsampling rate image_size // r, and level l has rate
    2^l."""
    try:
        rates = {flags["image_size"] // int(r) for r in str(flags["attention_resolutions"])
                 .split(",") if r.strip()}
    except (ValueError, ZeroDivisionError):
        raise SmoothcertError(f"attention_resolutions {flags['attention_resolutions']!r} is not "
                              "a comma-separated list of resolutions, e.g. 16,8") from None
    return tuple(2**level in rates for level in range(len(channel_mults(flags))))


def head_width(flags: Mapping) -> int:
    """The one head width (channels per head) of every attention block: num_head_channels, or
    a block's channels / num_heads (num_heads_upsample on the way up), which must agree."""
    mults, attends = channel_mults(flags), attention_levels(flags)
    width = int(mults[-1] * flags["num_channels"])  # the middle block always attends
    blocks = [(width, flags["num_heads"])]
    up_heads = flags["num_heads_upsample"]
    up_heads = flags["num_heads"] if up_heads == -1 else up_heads
    for mult, attends_here in zip(mults, attends):
        if attends_here:
            channels = int(mult * flags["num_channels"])
            blocks += [(channels, flags["num_heads"]), (channels, up_heads)]
    if flags["num_head_channels"] != -1:
        widths = {flags["num_head_channels"]}  # guided-diffusion: it overrides num_heads
        bad = [c for c, _ in blocks if c % flags["num_head_channels"]]
    else:
        widths = {c // h for c, h in blocks}
        bad = [c for c, h in blocks if h <= 0 or c % h]
    if bad or len(widths) != 1:
        raise SmoothcertError(
            "these flags give attention blocks of different head widths ("
            + ", ".join(f"{c} channels / {h} heads" for c, h in blocks)
            + "); diffusers' UNet2DModel has one attention_head_dim, so it cannot hold them")
    return widths.pop()


def check_supported(flags: Mapping) -> None:
    """Refuse, in one line, flags whose model the one-shot denoiser cannot use."""
    if flags["class_cond"]:
        raise SmoothcertError("class_cond True: a class-conditional UNet needs a label at every "
                              "call; denoised smoothing uses unconditional models")
    if flags["timestep_respacing"]:
        raise SmoothcertError("timestep_respacing is a sampling setting; leave it empty: the "
                              "denoiser uses the model's full schedule")
    if flags["noise_schedule"] not in ("linear", "cosine"):
        raise unknown_name("noise_schedule", flags["noise_schedule"], ("linear", "cosine"))
    for key in ("image_size", "num_channels", "num_res_blocks", "diffusion_steps"):
        if flags[key] < 1:
            raise SmoothcertError(f"flag {key} must be at least 1, got {flags[key]}")
    if not 0 <= flags["dropout"] < 1:
        raise SmoothcertError(f"flag dropout must be in [0, 1), got {flags['dropout']}")
    if flags["image_size"] % 2 ** (len(channel_mults(flags)) - 1):
        raise SmoothcertError(f"image_size {flags['image_size']} does not halve "
                              f"{len(channel_mults(flags)) - 1} times (channel_mult "
                              f"{flags['channel_mult']})")


def diffusers_unet_config(flags: Mapping) -> dict:
    """``UNet2DModel(**diffusers_unet_config(flags))`` computes what the repositories'
    ``UNetModel`` built from ``flags`` (complete, as :func:`resolve_flags` returns them, e.g. a
    :data:`PRESETS` entry) computes, once its weights go through :func:`convert_state_dict`:
    3 input channels, 6 outputs with ``learn_sigma`` (ε̂ then the variance interpolation), else
    3. Flags it cannot hold raise one SmoothcertError (:func:`check_supported`,
    :func:`head_width`)."""
    check_supported(flags)
    mults, attends = channel_mults(flags), attention_levels(flags)
    updown = bool(flags["resblock_updown"])
    down = tuple("AttnDownBlock2D" if a else ("ResnetDownsampleBlock2D" if updown
                                              else "DownBlock2D") for a in attends)
    up = tuple("AttnUpBlock2D" if a else ("ResnetUpsampleBlock2D" if updown else "UpBlock2D")
               for a in reversed(attends))
    return {
        "sample_size": flags["image_size"], "in_channels": 3,
        "out_channels": 6 if flags["learn_sigma"] else 3,
        "time_embedding_type": "positional", "flip_sin_to_cos": True, "freq_shift": 0,
        "down_block_types": down, "up_block_types": up,
        "block_out_channels": tuple(int(m * flags["num_channels"]) for m in mults),
        "layers_per_block": flags["num_res_blocks"], "mid_block_scale_factor": 1,
        "downsample_padding": 1, "downsample_type": "resnet" if updown else "conv",
        "upsample_type": "resnet" if updown else "conv", "dropout": float(flags["dropout"]),
        "act_fn": "silu", "attention_head_dim": head_width(flags), "norm_num_groups": 32,
        # Without it diffusers' middle block drops its attention GroupNorm under scale_shift.
        "attn_norm_num_groups": 32, "norm_eps": 1e-5,
        "resnet_time_scale_shift": "scale_shift" if flags["use_scale_shift_norm"] else "default",
        "add_attention": True,
    }


def scheduler_config(flags: Mapping) -> dict:
    """``DDPMScheduler(**scheduler_config(flags))`` has the ᾱ_t of the flags' schedule
    (gaussian_diffusion.get_named_beta_schedule): "linear" β from 1e-4·1000/T to 0.02·1000/T;
    "cosine" ᾱ(t) = cos²((t/T + 0.008)/1.008 · π/2), β capped at 0.999 (diffusers'
    "squaredcos_cap_v2" is that formula); ``learn_sigma`` → variance "learned_range";
    ``predict_xstart`` → prediction "sample", else "epsilon". The timestep the UNet is called
    at is not a scheduler setting: see :func:`timestep_scale`."""
    steps = flags["diffusion_steps"]
    config: dict = {"num_train_timesteps": steps, "clip_sample": True,
                    "prediction_type": "sample" if flags["predict_xstart"] else "epsilon",
                    "variance_type": "learned_range" if flags["learn_sigma"] else (
                        "fixed_small" if flags["sigma_small"] else "fixed_large")}
    if flags["noise_schedule"] == "linear":
        scale = 1000 / steps
        config.update(beta_schedule="linear", beta_start=scale * 0.0001, beta_end=scale * 0.02)
    elif flags["noise_schedule"] == "cosine":
        config.update(beta_schedule="squaredcos_cap_v2")
    else:
        raise unknown_name("noise_schedule", flags["noise_schedule"], ("linear", "cosine"))
    return config


def timestep_scale(flags: Mapping) -> float:
    """What the UNet's timestep is multiplied by: 1000/T with ``rescale_timesteps``
    (improved-diffusion's ``GaussianDiffusion._scale_timesteps`` calls the model at t·1000/T, a
    float), else 1. A converted folder stores it as ``_smoothcert_timestep_scale`` in
    ``scheduler_config.json`` (diffusers ignores keys that start with ``_``) and
    :class:`~smoothcert.denoisers.diffusion.DiffusionDenoiser` applies it."""
    return 1000 / flags["diffusion_steps"] if flags["rescale_timesteps"] else 1.0


def saved_timestep_scale(scheduler_dir: str | os.PathLike) -> float:
    """The ``_smoothcert_timestep_scale`` of a folder's ``scheduler_config.json`` (1 when absent,
    as in every folder not converted from improved-diffusion)."""
    try:
        config = json.loads((Path(scheduler_dir) / "scheduler_config.json").read_text())
    except (OSError, ValueError) as err:
        raise SmoothcertError(f"{scheduler_dir}/scheduler_config.json cannot be read "
                              f"({type(err).__name__}); check the folder") from err
    scale = config.get(TIMESTEP_SCALE_KEY, 1.0) if isinstance(config, dict) else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0 \
            or not math.isfinite(scale):
        raise SmoothcertError(f"{scheduler_dir}/scheduler_config.json: {TIMESTEP_SCALE_KEY} "
                              f"must be a positive number, got {scale!r}")
    return float(scale)
