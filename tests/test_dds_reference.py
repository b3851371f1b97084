"""benchmarks/dds_like_for_like.py: its rewrite of Carlini et al.'s one-shot denoising loop
computes what smoothcert's DiffusionDenoiser computes, so that the benchmark's ratio compares two
loops around one function.

A tiny improved-diffusion UNet (Carlini et al.'s CIFAR-10 flags but 32 channels, two levels, one
block each; random weights in their key layout) goes through the importer into a diffusers folder
and is loaded from it, as the benchmark does; a tiny classifier takes 40×40 images, so that the
bicubic resize runs too."""

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from conftest import benchmark_module, gpu_suite_argv
from smoothcert.denoisers import Denoised, DiffusionDenoiser  # noqa: E402
from smoothcert.models.archs import NormalizeLayer  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TINY = {"num_channels": "32", "channel_mult": "1,2", "num_res_blocks": "1",
        "attention_resolutions": "16"}


@pytest.fixture(scope="module")
def dds():
    with benchmark_module("dds_like_for_like") as module:
        yield module


@pytest.fixture(scope="module")
def setting(dds, tmp_path_factory):
    denoiser, flags = dds.imported_denoiser(tmp_path_factory.mktemp("dds"), 0.25, "cpu", TINY)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 5, stride=2), nn.SiLU(), nn.AdaptiveAvgPool2d(2),
                        nn.Flatten(), nn.Linear(32, 10))
    classifier = nn.Sequential(NormalizeLayer(dds.VIT_MEAN, dds.VIT_STD), net).eval()
    classifier.input_shape, classifier.num_classes = (3, 40, 40), 10
    return denoiser, classifier, dds.reference_drm(denoiser, classifier, flags, 40)


def test_reference_timestep_is_certify_pys(setting):
    """certify.py's t for the 4,000-step cosine schedule, from running their code (the mirror of
    ethz-spylab/diffusion_denoised_smoothing, cifar10/): 1158, 1984, 2809 at σ = 0.25, 0.5, 1."""
    denoiser, _, drm = setting
    assert [drm.diffusion.timestep(s) for s in (0.25, 0.5, 1.0)] == [1158, 1984, 2809]
    # the same schedule as the imported scheduler's ᾱ (diffusers keeps float32)
    ours = denoiser.scheduler.alphas_cumprod.double().numpy()
    assert abs(ours - drm.diffusion.alphas_cumprod).max() < 1e-6
    assert denoiser.timestep_scale == 1000 / 4000


def test_reference_denoises_as_the_library_for_the_same_noise(dds, setting):
    denoiser, classifier, drm = setting
    x = torch.rand((3, 32, 32), generator=torch.Generator().manual_seed(1))
    check = dds.same_function(denoiser, classifier, drm, 1158, x, draws=3)
    assert check["library_timestep"] == 1158
    assert check["image_max_abs_diff"] < 1e-5
    assert check["logit_max_abs_diff"] < 1e-5 * max(1.0, check["logit_scale"])
    assert check["same_argmax"] == 3
    # the check can fail: the library's denoiser without the improved-diffusion timestep
    # rescale (the UNet called at t instead of t·1000/4000) denoises to other images
    unscaled = DiffusionDenoiser(denoiser.unet, denoiser.scheduler, denoiser.sigma)
    wrong = dds.same_function(unscaled, classifier, drm, 1158, x, draws=3)
    assert wrong["image_max_abs_diff"] > 1e-2


def test_reference_certify_agrees_with_the_engine_on_a_constant_classifier(dds, setting):
    """With a classifier that always says class 3, both loops certify class 3 with n_A = n and
    Cohen's radius σ·Φ⁻¹(α^(1/n))."""
    denoiser, classifier, drm = setting
    classifier = copy.deepcopy(classifier)  # the fixture's stays as it is
    with torch.no_grad():
        classifier[1][-1].weight.zero_()
        classifier[1][-1].bias.copy_(torch.arange(10) == 3)
    drm = dds.ReferenceDRM(denoiser.unet, classifier[1], drm.diffusion, 40)
    smooth = dds.ReferenceSmooth(drm, 10, 0.25, 1158)
    x = torch.rand((3, 32, 32), generator=torch.Generator().manual_seed(2))
    theirs = smooth.certify(x, 2, 12, 0.001, 5)
    from scipy.stats import norm

    from smoothcert.runs import certify_dataset
    (ours,) = certify_dataset(Denoised(denoiser, classifier), [(x, 3)], sigma=0.25, n0=2, n=12,
                              alpha=0.001, batch=5)
    radius = 0.25 * norm.ppf(0.001 ** (1 / 12))
    assert theirs["predict"] == ours["predict"] == 3 and theirs["count"] == ours["nA"] == 12
    assert theirs["radius"] == pytest.approx(radius) and ours["radius"] == pytest.approx(radius)


def test_gpu_suite_part_runs_the_paper_workload(dds, tmp_path):
    """``PART=dds bash benchmarks/gpu_suite.sh``, with a stand-in for Python that records its
    arguments: arguments the benchmark accepts, at Carlini et al.'s n0, n and batch on CUDA."""
    argv = gpu_suite_argv("dds", "dds_like_for_like.md", tmp_path)
    assert argv[0] == "benchmarks/dds_like_for_like.py"
    args = dds.parse_args(argv[1:])
    assert args.device == "cuda" and args.json == tmp_path / "dds_like_for_like.json"
    assert (args.n0, args.n, args.batch) == (100, 100_000, 200) and "fp32" in args.settings
