"""benchmarks/lp_noises.py: a tiny CPU run in process, its cache isolation, its GPU suite part."""

from pathlib import Path

import pytest

from conftest import benchmark_module, gpu_suite_argv
from smoothcert.noise import tables
from smoothcert.noise.base import noise_examples
from smoothcert.noise.laplace import Laplace

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def lp():
    with benchmark_module("lp_noises") as module:
        yield module


def test_every_registered_noise_is_benchmarked_by_default(lp):
    args = lp.parse_args([])
    assert args.noises[0] == "gaussian" and sorted(args.noises) == sorted(noise_examples())
    assert lp.parse_args(["--noises", "laplace"]).noises == ["gaussian", "laplace"]


def test_tiny_run_prints_one_row_per_noise(lp, capsys):
    """Gaussian against itself is 1.00; the tables' memo is as it was before the run."""
    memo = dict(tables._MEMO)
    lp.main(["--device", "cpu", "--noises", "laplace", "pareto", "--images", "1", "--n0",
             "10", "--n", "40", "--batch", "25", "--rounds", "1"])
    text = capsys.readouterr().out
    assert "| noise | norms certified directly | certify s/image | × Gaussian |" in text
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| noise", "| ---"))}
    assert list(rows) == ["gaussian", "laplace", "pareto"]
    assert rows["gaussian"][3] == "1.00" and rows["gaussian"][5] == "1.00"
    assert rows["laplace"][1] == "l1, linf"
    assert "n0 = 10, n = 40, batch 25" in text and "load average" in text
    assert "radii, first call (ms) | radii, memoized (ms) |" in text
    assert memo == tables._MEMO


def test_fresh_tables_builds_the_table_then_restores_the_memo(lp):
    memo = dict(tables._MEMO)
    with lp.fresh_tables():
        assert tables._MEMO == {}
        Laplace(0.5).radii(0.9, 784)
        assert [k for k in tables._MEMO if '"dim": 784' in k and '"laplace"' in k]
    assert memo == tables._MEMO


def test_gpu_suite_part_runs_the_benchmark(lp, tmp_path):
    """``PART=noises bash benchmarks/gpu_suite.sh`` with a stand-in for Python that records its
    arguments: arguments the benchmark accepts, at n0 = 100, n = 10,000, batch 1000 on CUDA."""
    argv = gpu_suite_argv("noises", "lp_noises.md", tmp_path)
    assert argv[0] == "benchmarks/lp_noises.py"
    args = lp.parse_args(argv[1:])
    assert args.device == "cuda" and (args.n0, args.n, args.batch) == (100, 10_000, 1000)
    assert sorted(args.noises) == sorted(noise_examples())
