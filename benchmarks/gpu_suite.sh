#!/usr/bin/env bash
# The GPU suite as a session with a lent GPU runs it: CERTIFY seconds per image (n0 = 100,
# n = 100,000, α = 0.001) of cifar_resnet110 and resnet50, reference vs engine per setting vs
# forward ceiling, then the denoised rows: google/ddpm-cifar10-32's UNet (random weights) +
# cifar_resnet110, fixed-n and sequential on the 2σ grid, fp32 and bf16+channels_last (see
# docs/BENCHMARKS.md, "GPU suite"). About 4 minutes of an H100, compilation included
# (measured 2026-11-25; compiled settings run at one batch only). Results land in
# $OUT (default /tmp/gpu_suite): gpu_suite.md (the table), gpu_suite.json, gpu_suite.log
# (stderr). Extra arguments go to gpu_suite.py, e.g. --peak-tflops 989 494.
#     bash benchmarks/gpu_suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_suite}
mkdir -p "$out"
python=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$python" benchmarks/gpu_suite.py --device cuda \
    --models cifar_resnet110 resnet50 ddpm_cifar10+cifar_resnet110 \
    --n 100000 --n0 100 --images 1 --rounds 1 --sweep-n 10000 --reference-n 10000 \
    --batches 256 512 1000 2000 \
    --settings fp32 channels_last bf16 bf16+channels_last compile bf16+channels_last+compile \
    --denoised-settings fp32 bf16+channels_last --denoised-batches 500 1000 \
    --denoised-sweep-n 2000 --denoised-reference-n 1000 --denoised-images 1 \
    --sequential-images 10 --sequential-tests union targeted \
    --json "$out/gpu_suite.json" "$@" 2> >(tee "$out/gpu_suite.log" >&2) | tee "$out/gpu_suite.md"
