"""benchmarks/tss_cost.py: a tiny CPU run in process, the authors' code loaded from a stand-in
clone (and sys.modules as it was after), its GPU suite part."""

import importlib.util
import sys

import pytest

from conftest import benchmark_module, gpu_suite_argv
from smoothcert.errors import SmoothcertError

TINY = ["--device", "cpu", "--images", "1", "--n0", "10", "--n", "40", "--batch", "25",
        "--rounds", "1"]

# A stand-in for a clone of the authors' repository: their layout (semantic/transformers.py
# importing semantic/transforms.py, which imports cv2 and numba at the top) and the
# transformers' names and constructors that the benchmark calls, each process a plain batch op.
FAKE_TRANSFORMS = """
import cv2
import numba
import torch
print("Fast kernel not available, use PyTorch Kernel")
"""
FAKE_TRANSFORMERS = """
import torch
import semantic.transforms as transforms

class NoiseTransformer:
    def __init__(self, sigma):
        self.sigma = sigma
    def process(self, inputs):
        return inputs + torch.randn_like(inputs) * self.sigma

class BrightnessTransformer(NoiseTransformer):
    def __init__(self, sigma_k, sigma_b):
        self.sigma = sigma_b

class ContrastTransformer(BrightnessTransformer):
    pass

class TranslationTransformer:
    def __init__(self, sigma, canopy):
        self.shape = canopy.shape
    def process(self, inputs):
        return torch.roll(inputs, 1, dims=2)

class ExpGaussianTransformer(NoiseTransformer):
    def process(self, inputs):
        transforms.cv2.GaussianBlur(None, (0, 0), 1.0)
        return inputs
GaussianTransformer = FoldGaussianTransformer = ExpGaussianTransformer
"""


@pytest.fixture(scope="module")
def tss():
    with benchmark_module("tss_cost") as module:
        yield module


def rows_of(text: str) -> dict:
    """Table row label -> its cells (the label first)."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in
             text.splitlines() if line.startswith("| ") and
             not line.startswith(("| smoothing", "| ---"))]
    return {row[0]: row for row in cells}


def test_default_transformations_and_bad_names(tss):
    args = tss.parse_args([])
    assert args.transforms == list(tss.TRANSFORMS)
    families = [t.split(":")[0] for t in args.transforms]
    assert families == ["brightness", "contrast", "blur", "blur", "translation"]
    assert {t.split("kernel=")[1] for t in args.transforms if "kernel=" in t} == {"exact",
                                                                                 "opencv"}
    assert args.authors is None
    with pytest.raises(SmoothcertError):
        tss.parse_args(["--transforms", "rotate:sigma=3"])
    with pytest.raises(SmoothcertError, match="by sampling: benchmarks/tss_sampling.py"):
        tss.parse_args(["--transforms", "rotation:sigma=0.3"])


def test_tiny_run_prints_one_row_per_smoothing(tss, capsys):
    """Gaussian CERTIFY first and against itself 1.00; no --authors: their rows are skipped."""
    tss.main(TINY + ["--transforms", "translation:sigma=3", "brightness:sigma_b=0.3"])
    text = capsys.readouterr().out
    assert ("| smoothing | certify s/image | × Gaussian | draws/s (perturb_) | × Gaussian "
            "(time) | authors' draws/s (process, host) | authors ÷ ours (time) |") in text
    rows = rows_of(text)
    assert list(rows) == ["gaussian (σ = 0.5, CERTIFY)", "translation:sigma=3",
                          "brightness:sigma_b=0.3"]
    assert all(len(cells) == 7 for cells in rows.values())
    gaussian = rows["gaussian (σ = 0.5, CERTIFY)"]
    assert gaussian[2] == "1.00" and gaussian[4] == "1.00"
    assert all(float(cells[1]) > 0 and float(cells[2]) > 0 for cells in rows.values())
    assert "authors' rows: skipped (no --authors PATH given)" in text
    assert "n0 = 10, n = 40, batch 25" in text and "load average at start" in text
    assert "per round, certify × Gaussian: translation:sigma=3 " in text
    assert "per round, authors" not in text


def test_authors_code_from_a_clone_leaves_sys_modules_as_it_was(tss, tmp_path, capsys):
    """Their transformers are imported with stand-ins for cv2 and numba where those do not
    import; their process is timed for each row with a counterpart; afterwards sys.modules
    and sys.path are as before."""
    (tmp_path / "semantic").mkdir()
    (tmp_path / "semantic" / "__init__.py").write_text("")
    (tmp_path / "semantic" / "transforms.py").write_text(FAKE_TRANSFORMS)
    (tmp_path / "semantic" / "transformers.py").write_text(FAKE_TRANSFORMERS)
    names = ("cv2", "numba", "semantic", "semantic.transforms", "semantic.transformers")
    before = {name: sys.modules.get(name) for name in names}
    path = list(sys.path)
    has_cv2 = importlib.util.find_spec("cv2") is not None

    module, line, real_cv2 = tss.load_authors(str(tmp_path))
    assert module.NoiseTransformer and real_cv2 == has_cv2
    assert {name: sys.modules.get(name) for name in names} == before and sys.path == path
    assert str(tmp_path) in line and "no git" in line
    assert ("OpenCV" if has_cv2 else "cv2 stand-in: their blur skipped") in line

    tss.main(TINY + ["--authors", str(tmp_path), "--authors-batches", "1", "--transforms",
                     "brightness:sigma_b=0.3", "blur:kernel=exact", "blur:kernel=opencv",
                     "translation:sigma=3"])
    text = capsys.readouterr().out
    rows = rows_of(text)
    for label in ("gaussian (σ = 0.5, CERTIFY)", "brightness:sigma_b=0.3",
                  "translation:sigma=3"):
        assert float(rows[label][5].replace(",", "")) > 0 and float(rows[label][6]) > 0
    assert rows["blur:kernel=exact"][5] == "– (no counterpart: theirs is OpenCV's kernel)"
    if not has_cv2:
        assert rows["blur:kernel=opencv"][5] == "– (skipped: no OpenCV)"
    assert "per round, authors ÷ ours (time per draw): gaussian " in text
    assert {name: sys.modules.get(name) for name in names} == before

    missing = tss.load_authors(str(tmp_path / "nowhere"))
    assert missing[0] is None and "not found" in missing[1]


def test_gpu_suite_part_runs_the_benchmark(tss, tmp_path):
    """``PART=tss bash benchmarks/gpu_suite.sh`` with a stand-in for Python that records its
    arguments: arguments the benchmark accepts, at n0 = 100, n = 10,000, batch 1000 on CUDA,
    every default transformation."""
    argv = gpu_suite_argv("tss", "tss_cost.md", tmp_path)
    assert argv[0] == "benchmarks/tss_cost.py"
    args = tss.parse_args(argv[1:])
    assert args.device == "cuda" and (args.n0, args.n, args.batch) == (100, 10_000, 1000)
    assert args.images == 20 and args.transforms == list(tss.TRANSFORMS)


@pytest.fixture(scope="module")
def sampling():
    with benchmark_module("tss_sampling") as module:
        yield module


def test_sampling_tiny_run_times_the_bound_and_every_sample(sampling, capsys):
    """No --authors: one row for the bound, one for certification against CERTIFY; every
    sample visited (the bound set to 0 in the certify job, and only there)."""
    t = "rotation:sigma=0.25,angle=10,slices=6,subslices=3"
    sampling.main(["--device", "cpu", "--images", "1", "--n0", "10", "--n", "20", "--batch",
                   "25", "--rounds", "1", "--transform", t])
    text = capsys.readouterr().out
    assert "| interpolation bound |" in text and "– (no --authors)" in text
    assert "| certification (S = 6 samples) |" in text and "per draw" in text
    assert "samples visited per image: 6.0" in text
    import torch

    from smoothcert.transforms import build_transformation
    rotation = build_transformation(t)
    assert float(rotation.slice_bounds(torch.rand(1, 28, 28)).min()) > 0  # restored


def test_sampling_refuses_another_transformation_and_the_gpu_part_parses(sampling, tmp_path):
    with pytest.raises(SmoothcertError, match="this benchmark times rotation and scaling"):
        sampling.parse_args(["--transform", "translation:sigma=3"])
    argv = gpu_suite_argv("tss", "tss_sampling.md", tmp_path)
    assert argv[0] == "benchmarks/tss_sampling.py"
    args = sampling.parse_args(argv[1:])
    assert args.device == "cuda" and (args.n, args.images) == (10_000, 5)
