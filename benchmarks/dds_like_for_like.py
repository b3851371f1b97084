"""Diffusion denoised smoothing like for like: smoothcert's engine against Carlini et al.'s loop on
their CIFAR-10 setting, on one device, with the same modules, in one run.

**Their setting** (ethz-spylab/diffusion_denoised_smoothing, ``cifar10/``): improved-diffusion's
unconditional CIFAR-10 UNet ``cifar10_uncond_50M_500K.pt`` (the flags of ``Args`` in ``DRM.py``:
128 channels, 3 residual blocks per level, attention at 16×16 and 8×8 with 4 heads, dropout 0.3,
cosine schedule over 4,000 steps, learned variance, timestep rescale; 52.5M parameters), whose
denoised 32×32 image is resized (bicubic, antialiased) to 224×224 for a ViT-B/16 with 10 classes
(theirs is HF's ``aaraki/vit-base-patch16-224-in21k-finetuned-cifar10``; here timm's
``vit_base_patch16_224``, the same architecture, fed the same [−1, 1] images: both normalise
with mean 0.5 and std 0.5). Random weights for both (a forward pass costs the same whatever
they are): the UNet is written as a bare improved-diffusion state dict, in their key layout, and
imported as a user would (``import_openai_unet``, i.e. ``smoothcert import-checkpoint --format
improved-diffusion --preset carlini-cifar10``), then loaded from that diffusers folder.

**Two loops** over the same images, with the same UNet and ViT module objects:

* ``reference``: Carlini et al.'s loop, rewritten from reading their code (not copied):
  ``certify.py``'s t (the first t ≥ 1 with √(1 − ᾱ_t)/√ᾱ_t ≥ 2σ) and its loop, one image at a
  time; ``core.py``'s ``Smooth.certify`` (n0 draws, then n, in batches of ``--batch``;
  predictions moved to the host and counted in a Python loop per batch; Clopper–Pearson);
  ``DRM.py``'s forward: x ↦ 2x − 1, ``q_sample`` at t with fresh ``randn_like`` noise, then
  ``p_sample``'s ``p_mean_variance`` (learned-range variance, ε → x̂₀ with clipping, posterior
  mean, a sample's noise) keeping ``pred_xstart``, bicubic antialiased resize to 224, the ViT.
  improved-diffusion's float64 numpy tables are read as it reads them (``_extract_into_tensor``
  copies the table to the device at every call) and the UNet is called at t·1000/4000 through
  ``_WrappedModel``'s timestep map. Float32, eager, as their code runs.
* ``engine`` (one row per ``--settings`` entry): ``certify_dataset(Denoised(DiffusionDenoiser,
  classifier), images, sigma=σ, n0, n, batch, ...)``, records written to a temporary file, as a
  user calls it; its time includes the run's setup (fingerprinting the two networks' weights,
  the manifest).

The two compute the same function: the script checks (and ``tests/test_dds_reference.py``
asserts) that for the same standard normal draws ε the reference's denoised images and logits
equal the library's on x + σ_t·ε, where σ_t = √((1 − ᾱ_t)/ᾱ_t)/2 is the pixel σ of their noise
at t. They differ in two details of the certified procedure, neither of which changes the
cost: the library adds pixel noise of exactly σ and denoises at t* = argmin |(1 − ᾱ_t)/ᾱ_t − 4σ²|
(``one_shot_timestep``), their code adds √(1 − ᾱ_t)·ε at their t (noise a little above 2σ).

Per round every loop runs once over all ``--images`` images (order reversed every other round),
after an untimed warm-up of each; seconds per image is a loop's wall time over the images, and on
a CPU also this process's CPU time (``time.process_time``), which other processes on a shared
machine do not stretch; "× reference" is the reference's time over the loop's in the same round
(median over rounds, per-round values in brackets). Defaults: on CUDA their README's workload
(n0 = 100, n = 100,000, batch 200) on one image; on a CPU n0 = 8, n = 32, batch 200, two images.

    OMP_NUM_THREADS=1 python benchmarks/dds_like_for_like.py --device cpu --rounds 2
    python benchmarks/dds_like_for_like.py --device cuda --settings fp32 bf16+channels_last
    PART=dds bash benchmarks/gpu_suite.sh     # the GPU suite's part: the line above, n = 100,000
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import flops_per_image, package_versions, print_environment
from scipy.stats import beta, norm
from torch import nn

from smoothcert.denoisers import Denoised, DiffusionDenoiser
from smoothcert.denoisers.openai_import import build_unet, import_openai_unet, layout
from smoothcert.denoisers.openai_unet import resolve_flags
from smoothcert.models import build_model
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import manifest_path

PRESET, FORMAT = "carlini-cifar10", "improved-diffusion"
CLASSIFIER, NUM_CLASSES, SIZE = "timm:vit_base_patch16_224", 10, 224
VIT_MEAN = VIT_STD = (0.5, 0.5, 0.5)  # timm's and HF's ViT-B/16: [0, 1] → [−1, 1]
SIGMA, ALPHA = 0.25, 0.001
# The README's CIFAR-10 command: --N0 100 --N 100000 --batch_size 200 (certify.py's default
# batch is 1000); on a CPU a small workload.
WORKLOADS = {"cuda": {"n0": 100, "n": 100_000, "batch": 200, "images": 1},
             "cpu": {"n0": 8, "n": 32, "batch": 200, "images": 2}}
ACCELERATIONS = {"channels_last": {"channels_last": True}, "compile": {"compile": True},
                 "bf16": {"precision": "bf16"}, "fp16": {"precision": "fp16"}}


# ---- the reference: Carlini et al.'s arithmetic (DRM.py, core.py, certify.py) on ----------
# ---- improved-diffusion's GaussianDiffusion (gaussian_diffusion.py, respace.py) ------------


def named_betas(schedule: str, steps: int) -> np.ndarray:
    """improved-diffusion's ``get_named_beta_schedule``, float64: Ho et al.'s linear β scaled by
    1000/T, or the cosine ᾱ(t) = cos²((t/T + 0.008)/1.008 · π/2) discretised, β capped at
    0.999."""
    if schedule == "linear":
        scale = 1000 / steps
        return np.linspace(scale * 1e-4, scale * 0.02, steps, dtype=np.float64)

    def alpha_bar(t):
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    return np.array([min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), 0.999)
                     for i in range(steps)])


def extract(table: np.ndarray, t: torch.Tensor, shape) -> torch.Tensor:
    """``_extract_into_tensor``: the whole float64 table to t's device, indexed, as float32,
    broadcast to ``shape`` (a host-to-device copy per call, as theirs)."""
    out = torch.from_numpy(table).to(device=t.device)[t].float()
    return out.view(-1, *[1] * (len(shape) - 1)).expand(shape)


class ReferenceDiffusion:
    """The ``SpacedDiffusion`` that ``create_gaussian_diffusion`` builds from the flags (every
    step kept, so β is recomputed from ᾱ as respace.py does), with the tables one-shot
    denoising reads, ``q_sample`` and ``p_sample``. Learned-range variance and ε prediction
    only: the flags of Carlini et al.'s CIFAR-10 model."""

    def __init__(self, flags: dict):
        if not flags["learn_sigma"] or flags["predict_xstart"]:
            raise ValueError("the reference covers learn_sigma=True, predict_xstart=False")
        base = np.cumprod(1.0 - named_betas(flags["noise_schedule"], flags["diffusion_steps"]))
        betas = 1 - base / np.append(1.0, base[:-1])
        self.betas, self.original_num_steps = betas, len(betas)
        self.timestep_map = list(range(len(betas)))
        self.rescale_timesteps = flags["rescale_timesteps"]
        a = np.cumprod(1.0 - betas)
        prev = np.append(1.0, a[:-1])
        self.alphas_cumprod = a
        self.sqrt_alphas_cumprod, self.sqrt_one_minus_alphas_cumprod = np.sqrt(a), np.sqrt(1 - a)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / a)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / a - 1)
        self.posterior_variance = betas * (1.0 - prev) / (1.0 - a)
        self.posterior_log_variance_clipped = np.log(
            np.append(self.posterior_variance[1], self.posterior_variance[1:]))
        self.posterior_mean_coef1 = betas * np.sqrt(prev) / (1.0 - a)
        self.posterior_mean_coef2 = (1.0 - prev) * np.sqrt(1.0 - betas) / (1.0 - a)

    def timestep(self, sigma: float) -> int:
        """certify.py's t: the first t ≥ 1 whose √(1 − ᾱ_t)/√ᾱ_t reaches 2σ."""
        t, real_sigma = 0, 0.0
        while real_sigma < 2 * sigma:
            t += 1
            if t >= len(self.betas):
                raise ValueError(f"no step of the schedule reaches noise 2σ = {2 * sigma}")
            real_sigma = self.sqrt_one_minus_alphas_cumprod[t] / self.sqrt_alphas_cumprod[t]
        return t

    def q_sample(self, x_start, t, noise):
        return (extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
                + extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise)

    def wrapped_model(self, unet, x, ts):
        """``_WrappedModel``: the timestep map (a fresh tensor per call), t·1000/T when
        rescaling; a diffusers UNet returns ``.sample``."""
        new_ts = torch.tensor(self.timestep_map, device=ts.device, dtype=ts.dtype)[ts]
        if self.rescale_timesteps:
            new_ts = new_ts.float() * (1000.0 / self.original_num_steps)
        return unet(x, new_ts).sample

    def p_sample(self, unet, x, t) -> dict:
        """``p_sample`` with ``clip_denoised=True``: ``p_mean_variance`` (learned range), then
        the sample's noise; returns ``sample`` and ``pred_xstart``."""
        eps, var_values = torch.split(self.wrapped_model(unet, x, t), x.shape[1], dim=1)
        min_log = extract(self.posterior_log_variance_clipped, t, x.shape)
        max_log = extract(np.log(self.betas), t, x.shape)
        frac = (var_values + 1) / 2
        log_variance = frac * max_log + (1 - frac) * min_log
        torch.exp(log_variance)  # model_variance: computed there, unused by one-shot denoising
        pred_xstart = (extract(self.sqrt_recip_alphas_cumprod, t, x.shape) * x
                       - extract(self.sqrt_recipm1_alphas_cumprod, t, x.shape) * eps).clamp(-1, 1)
        mean = (extract(self.posterior_mean_coef1, t, x.shape) * pred_xstart
                + extract(self.posterior_mean_coef2, t, x.shape) * x)
        extract(self.posterior_variance, t, x.shape)  # q_posterior_mean_variance reads both
        extract(self.posterior_log_variance_clipped, t, x.shape)
        nonzero = (t != 0).float().view(-1, *([1] * (x.dim() - 1)))
        sample = mean + nonzero * torch.exp(0.5 * log_variance) * torch.randn_like(x)
        return {"sample": sample, "pred_xstart": pred_xstart}


class ReferenceDRM(nn.Module):
    """``DiffusionRobustModel``: (x in [0, 1], t) ↦ logits of the classifier on the resized
    one-shot denoising of x at step t. ``classifier``: the network that takes [−1, 1] images
    (their HF ViT takes them so; here the ViT behind smoothcert's ``NormalizeLayer``)."""

    def __init__(self, unet, classifier, diffusion: ReferenceDiffusion, size: int):
        super().__init__()
        self.unet, self.classifier, self.diffusion, self.size = unet, classifier, diffusion, size

    def forward(self, x, t, noise=None):
        imgs = self.denoise(x * 2 - 1, t, noise)
        imgs = F.interpolate(imgs, (self.size, self.size), mode="bicubic", antialias=True)
        with torch.no_grad():
            return self.classifier(imgs)

    def denoise(self, x_start, t, noise=None):
        t_batch = torch.tensor([t] * len(x_start)).to(x_start.device)
        noise = torch.randn_like(x_start) if noise is None else noise  # ``noise``: for checks
        x_t = self.diffusion.q_sample(x_start, t_batch, noise)
        with torch.no_grad():
            return self.diffusion.p_sample(self.unet, x_t, t_batch)["pred_xstart"]


class ReferenceSmooth:
    """core.py's ``Smooth``: CERTIFY of one image, n0 then n draws in batches."""

    def __init__(self, drm: ReferenceDRM, num_classes: int, sigma: float, t: int):
        self.drm, self.num_classes, self.sigma, self.t = drm, num_classes, sigma, t

    def certify(self, x, n0: int, n: int, alpha: float, batch_size: int) -> dict:
        """``{"predict", "radius", "count"}``: predict −1 (abstain) and radius 0 when the
        Clopper–Pearson bound on p_A at level α is below ½."""
        self.drm.eval()
        c_hat = int(self._sample_noise(x, n0, batch_size).argmax())
        n_a = int(self._sample_noise(x, n, batch_size)[c_hat])
        p_lower = beta.ppf(alpha, n_a, n - n_a + 1) if n_a > 0 else 0.0  # proportion_confint
        if p_lower < 0.5:
            return {"predict": -1, "radius": 0.0, "count": n_a}
        return {"predict": c_hat, "radius": self.sigma * norm.ppf(p_lower), "count": n_a}

    def _sample_noise(self, x, num: int, batch_size: int) -> np.ndarray:
        with torch.no_grad():
            counts = np.zeros(self.num_classes, dtype=int)
            for _ in range(math.ceil(num / batch_size)):
                this_batch_size = min(batch_size, num)
                num -= this_batch_size
                batch = x.repeat((this_batch_size, 1, 1, 1))
                predictions = self.drm(batch, self.t).argmax(1)
                for idx in predictions.cpu().numpy():  # core.py's _count_arr
                    counts[idx] += 1
            return counts


# ---- the setting: the UNet through the importer, the ViT, both loops ----------------------


def random_openai_state(flags: dict, seed: int = 0) -> dict:
    """A bare improved-diffusion ``UNetModel`` state dict for ``flags`` (their keys and
    shapes, from the importer's layout), random: norm weights 1 + N(0, 0.1²), biases N(0, 0.1²),
    other weights N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for key, entry in layout(flags, build_unet(flags).state_dict()).items():
        shape, noise = entry.shape, torch.randn(entry.shape, generator=g)
        if key.endswith(".bias"):
            state[key] = 0.1 * noise
        elif len(shape) == 1:  # a GroupNorm's weight
            state[key] = 1 + 0.1 * noise
        else:
            state[key] = noise / math.sqrt(math.prod(shape[1:]))
    return state


def imported_denoiser(folder: Path, sigma: float, device, flags_params=None,
                      seed: int = 0) -> tuple[DiffusionDenoiser, dict]:
    """(the one-shot denoiser of a random improved-diffusion checkpoint of the preset's flags,
    updated by ``flags_params``, imported into ``folder``/diffusers and loaded from there, on
    ``device``; the flags)."""
    flags = resolve_flags(FORMAT, flags_params, PRESET)
    torch.save(random_openai_state(flags, seed), folder / "unet.pt")
    import_openai_unet(folder / "unet.pt", FORMAT, out=folder / "diffusers", preset=PRESET,
                       params=flags_params)
    return DiffusionDenoiser.from_pretrained(folder / "diffusers", sigma, device), flags


def vit_classifier(arch: str, size: int, device, seed: int = 0) -> nn.Module:
    """``arch`` with 10 classes at size×size behind NormalizeLayer(0.5, 0.5), random weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(arch, NUM_CLASSES, (3, size, size), VIT_MEAN, VIT_STD)
    return model.to(device).eval()


def reference_drm(denoiser: DiffusionDenoiser, classifier: nn.Module, flags: dict,
                  size: int) -> ReferenceDRM:
    """Their model around our modules: the denoiser's UNet, the classifier's network (behind
    its NormalizeLayer(0.5, 0.5), it takes the [−1, 1] images their ViT takes)."""
    norm_layer, net = classifier[0], classifier[1]
    assert torch.allclose(norm_layer.mean, torch.tensor(0.5)) and \
        torch.allclose(norm_layer.std, torch.tensor(0.5)), "the ViT must normalise 0.5/0.5"
    return ReferenceDRM(denoiser.unet, net, ReferenceDiffusion(flags), size).eval()


def same_function(denoiser: DiffusionDenoiser, classifier: nn.Module, drm: ReferenceDRM,
                  t: int, x: torch.Tensor, draws: int = 4, seed: int = 0) -> dict:
    """For the same draws ε: the reference's denoised images and logits at step t against the
    library's on x + σ_t·ε (σ_t: the pixel σ of their noise at t), as max |difference|."""
    a = drm.diffusion.alphas_cumprod[t]
    sigma_t = math.sqrt((1 - a) / a) / 2
    ours = denoiser.with_sigma(sigma_t)
    g = torch.Generator(x.device).manual_seed(seed)
    eps = torch.randn((draws, *x.shape), generator=g, device=x.device)
    batch = x.repeat((draws, 1, 1, 1))
    with torch.no_grad():
        theirs_img = (drm.denoise(2 * batch - 1, t, eps) + 1) / 2
        theirs_logits = drm(batch, t, eps)
        ours_img = ours(batch + sigma_t * eps)
        ours_logits = Denoised(ours, classifier)(batch + sigma_t * eps)
    return {"sigma_t": sigma_t, "timestep": t, "library_timestep": ours.timestep,
            "image_max_abs_diff": float((theirs_img - ours_img).abs().max()),
            "logit_max_abs_diff": float((theirs_logits - ours_logits).abs().max()),
            "logit_scale": float(theirs_logits.abs().max()),
            "same_argmax": int((theirs_logits.argmax(1) == ours_logits.argmax(1)).sum()),
            "draws": draws}


# ---- timing -----------------------------------------------------------------------------


def setting_kwargs(name: str) -> dict:
    """Engine settings of a name such as ``fp32`` or ``bf16+channels_last``."""
    kwargs = {"precision": "fp32", "channels_last": False, "compile": False}
    for part in name.split("+"):
        if part != "fp32" and part not in ACCELERATIONS:
            raise argparse.ArgumentTypeError(
                f"unknown setting part {part!r}; use fp32 or {', '.join(ACCELERATIONS)}")
        kwargs.update(ACCELERATIONS.get(part, {}))
    return kwargs


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> tuple[float, float, object]:
    """(wall seconds, this process's CPU seconds, ``fn()``), the device synchronised around.
    On a shared CPU the CPU seconds count this process's work only: other processes' load
    stretches the wall time, not them."""
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def run_reference(smooth: ReferenceSmooth, images, work: argparse.Namespace, device,
                  seed: int) -> tuple[float, float, list[dict]]:
    """(wall s, CPU s, rows) of certify.py's loop over ``images``: one image at a time,
    torch's global generator (seeded once; their code does not seed)."""
    torch.manual_seed(seed)
    return timed(lambda: [smooth.certify(x.to(device), work.n0, work.n, ALPHA, work.batch)
                          for x, _ in images], device)


def run_engine(model: Denoised, images, work: argparse.Namespace, setting: str, device,
               out: Path) -> tuple[float, float, list[dict]]:
    """(wall s, CPU s, rows) of ``certify_dataset`` over ``images``, records written to
    ``out``."""
    out.unlink(missing_ok=True)  # a fresh run, not a resumed one
    manifest_path(out).unlink(missing_ok=True)
    wall, cpu, rows = timed(lambda: certify_dataset(
        model, images, sigma=SIGMA, n0=work.n0, n=work.n, alpha=ALPHA, batch=work.batch,
        seed=0, out=out, engine=setting_kwargs(setting)), device)
    return wall, cpu, [{"predict": int(r["predict"]), "radius": float(r["radius"]),
                        "count": int(r["nA"])} for r in rows]


def warm_up(smooth, model, images, args, device, tmp: Path) -> None:
    """One short run of each loop (lazy initialisation, cuDNN plans, compilation) untimed: a
    full batch on a GPU, two draws on a CPU."""
    n = args.batch if device.type == "cuda" else 2
    short = argparse.Namespace(n0=1, n=n, batch=args.batch)
    run_reference(smooth, images[:1], short, device, args.seed)
    logging.disable(logging.WARNING)  # the note that n = 2 certifies nothing: it need not
    try:
        for setting in args.settings:
            run_engine(model, images[:1], short, setting, device, tmp / "warm.tsv")
    finally:
        logging.disable(logging.NOTSET)


def bench(smooth, model, images, args, device, tmp: Path) -> dict:
    """Per loop: seconds per image in each round and the last round's rows; rounds
    interleave the loops, in reverse order every other round."""
    names = ["reference"] + list(args.settings)
    wall, cpu, rows = ({name: [] for name in names} for _ in range(3))
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if name == "reference":
                w, c, rows[name] = run_reference(smooth, images, args, device, args.seed)
            else:
                w, c, rows[name] = run_engine(model, images, args, name, device,
                                              tmp / "engine.tsv")
            wall[name].append(w / len(images))
            cpu[name].append(c / len(images))
            print(f"# round {r + 1}: {name}: {w / len(images):.2f} s/image wall, "
                  f"{c / len(images):.2f} CPU s/image, load {os.getloadavg()[0]:.1f}",
                  flush=True)
    return {"seconds_per_image": wall, "cpu_seconds_per_image": cpu, "rows": rows}


# ---- output ------------------------------------------------------------------------------


def per_round(values) -> str:
    """The median, then every round's value in brackets."""
    return (f"{statistics.median(values):,.2f} ({' / '.join(f'{v:,.2f}' for v in values)})"
            if len(values) > 1 else f"{values[0]:,.2f}")


def table(result: dict, args, with_cpu: bool) -> list[str]:
    """One row per loop: seconds per image (wall, and CPU on a CPU device), noisy images/s,
    the reference's time over the loop's in each round, the certificates of the last round."""
    kinds = ["seconds_per_image"] + ["cpu_seconds_per_image"] * with_cpu
    heads = {"seconds_per_image": "wall", "cpu_seconds_per_image": "CPU"}
    lines = ["| loop | setting | " + " | ".join(f"{heads[k]} s / image" for k in kinds)
             + " | noisy images/s (wall) | " + " | ".join(f"× reference ({heads[k]})"
                                                        for k in kinds)
             + " | predict, nA, radius per image |",
             "| --- | --- | " + "---: | " * (2 * len(kinds) + 1) + "--- |"]
    for name in result["seconds_per_image"]:
        loop, setting = ("reference", "fp32 eager") if name == "reference" else ("engine", name)
        times = [per_round(result[k][name]) for k in kinds]
        ratios = [per_round([a / b for a, b in zip(result[k]["reference"], result[k][name])])
                  for k in kinds]
        rate = (args.n0 + args.n) / statistics.median(result["seconds_per_image"][name])
        certs = "; ".join(f"{r['predict']}, {r['count']}, {r['radius']:.3f}"
                          for r in result["rows"][name])
        lines.append(f"| {loop} | {setting} | {' | '.join(times)} | {rate:,.1f} | "
                     f"{' | '.join(ratios)} | {certs} |")
    return lines


def describe(denoiser, classifier, flags, t_ref, device, args) -> dict:
    """Parameters and GFLOP of the two networks, the two timesteps, the backend's tf32."""
    pipeline = Denoised(denoiser, classifier)
    unet_params = sum(p.numel() for p in denoiser.unet.parameters())
    vit_params = sum(p.numel() for p in classifier.parameters())
    return {"unet_parameters": unet_params, "classifier_parameters": vit_params,
            "gflop_per_draw": flops_per_image(pipeline, (3, 32, 32), device) / 1e9,
            "classifier_gflop": flops_per_image(classifier, (3, args.size, args.size),
                                                device) / 1e9,
            "reference_timestep": t_ref, "library_timestep": denoiser.timestep,
            "unet_timestep_scale": denoiser.timestep_scale,
            "flags": {k: flags[k] for k in ("image_size", "num_channels", "num_res_blocks",
                                            "attention_resolutions", "dropout", "learn_sigma",
                                            "diffusion_steps", "noise_schedule",
                                            "rescale_timesteps")},
            "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_tf32": torch.backends.cudnn.allow_tf32}


def print_header(info: dict, check: dict, args) -> None:
    print(f"UNet: {info['unet_parameters']:,} parameters (flags {info['flags']}); classifier "
          f"{args.classifier} at {args.size}×{args.size}, {info['classifier_parameters']:,} "
          f"parameters, {info['classifier_gflop']:.2f} GFLOP; {info['gflop_per_draw']:.2f} GFLOP "
          f"per draw together (FlopCounterMode)")
    print(f"σ = {SIGMA}: reference t = {info['reference_timestep']} (certify.py's rule), "
          f"engine t* = {info['library_timestep']} (argmin); the UNet is called at t × "
          f"{info['unet_timestep_scale']:g}; tf32: matmul {info['matmul_tf32']}, cuDNN "
          f"{info['cudnn_tf32']}")
    print(f"same function, {check['draws']} draws of one image at t = {check['timestep']} "
          f"(σ_t = {check['sigma_t']:.6f}, library t* = {check['library_timestep']}): denoised "
          f"images differ by at most {check['image_max_abs_diff']:.2e}, logits by "
          f"{check['logit_max_abs_diff']:.2e} (largest |logit| {check['logit_scale']:.2e}), "
          f"same argmax for {check['same_argmax']} of {check['draws']}")
    print(f"\nworkload: CERTIFY of {args.images} image(s), n0 = {args.n0}, n = {args.n}, "
          f"α = {ALPHA}, batch {args.batch}, {args.rounds} round(s); load average "
          f"{os.getloadavg()[0]:.1f}\n")


# ---- main --------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n0", type=int, help="selection draws (cuda: 100, cpu: 8)")
    p.add_argument("--n", type=int, help="estimation draws (cuda: 100,000, cpu: 32)")
    p.add_argument("--batch", type=int, help="both loops' batch (200, their README's)")
    p.add_argument("--images", type=int, help="images per loop and round (cuda: 1, cpu: 2)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--settings", nargs="+", default=["fp32"], type=str,
                   help="engine settings: fp32, or parts joined by + (bf16+channels_last)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--classifier", default=CLASSIFIER, help="a smaller one for smoke tests")
    p.add_argument("--size", type=int, default=SIZE, help="the classifier's input side")
    p.add_argument("--unet-param", nargs="*", default=[], metavar="KEY=VALUE",
                   help="flags over the preset's, for smoke tests (e.g. num_channels=32)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    try:
        for setting in args.settings:
            setting_kwargs(setting)
    except argparse.ArgumentTypeError as err:
        p.error(str(err))
    if any("=" not in kv for kv in args.unet_param):
        p.error("--unet-param takes KEY=VALUE pairs, e.g. num_channels=32")
    defaults = WORKLOADS["cuda" if args.device.startswith("cuda") else "cpu"]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    print_environment(device)
    for package, version in package_versions("diffusers", "timm", "scipy").items():
        print(f"{package}: {version}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        params = dict(kv.split("=", 1) for kv in args.unet_param)
        denoiser, flags = imported_denoiser(tmp, SIGMA, device, params, args.seed)
        classifier = vit_classifier(args.classifier, args.size, device, args.seed)
        drm = reference_drm(denoiser, classifier, flags, args.size)
        t_ref = drm.diffusion.timestep(SIGMA)
        smooth = ReferenceSmooth(drm, NUM_CLASSES, SIGMA, t_ref)
        model = Denoised(denoiser, classifier)
        g = torch.Generator().manual_seed(args.seed)
        images = [(torch.rand((3, 32, 32), generator=g), 0) for _ in range(args.images)]
        info = describe(denoiser, classifier, flags, t_ref, device, args)
        check = same_function(denoiser, classifier, drm, t_ref, images[0][0].to(device))
        print_header(info, check, args)
        warm_up(smooth, model, images, args, device, tmp)
        result = bench(smooth, model, images, args, device, tmp)
    print("\n".join(table(result, args, device.type == "cpu")))
    if args.json:
        args.json.write_text(json.dumps({"workload": {k: getattr(args, k) for k in (
            "n0", "n", "batch", "images", "rounds", "settings")}, "info": info, "check": check,
            **result}, indent=1, default=str))


if __name__ == "__main__":
    main()
