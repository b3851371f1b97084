#!/usr/bin/env bash
# Step 3 study: fixed-σ CERTIFY vs data-dependent certification (Alfarra et al.) of a Fashion-MNIST
# LeNet trained with Gaussian noise at σ = 0.25 (the full recipe), on the same 200 test images
# (every 50th), n = 10,000, α = 0.001. Records land in results/step3/; the checkpoint stays in
# runs/ (out of git; rerun this script to rebuild it). Usage: results/step3_dd_fmnist.sh [DEVICE]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"  # the make-installed smoothcert, when there is one
device=${1:-auto}
data=${DATA_ROOT:+--data-root $DATA_ROOT}
out=results/step3
mkdir -p "$out"
smoothcert train --config configs/fashion-mnist/gaussian_s025.yaml --out runs/step3-gaussian-s025 \
    --device "$device" --no-progress --resume $data
ckpt=runs/step3-gaussian-s025/checkpoint.pt
common=(--sigma 0.25 --n0 100 --n 10000 --alpha 0.001 --batch 10000 --skip 50 --max 200
        --device "$device" --no-progress $data)
smoothcert certify "$ckpt" "${common[@]}" --out "$out/fixed_sigma.tsv"
smoothcert certify "$ckpt" "${common[@]}" --certifier data-dependent \
    --out "$out/data_dependent.tsv"
smoothcert report "$out/fixed_sigma.tsv" "$out/data_dependent.tsv" --radii 0:1.25:0.25 \
    --plot "$out/certified_accuracy.png"
cp runs/step3-gaussian-s025/log.tsv "$out/train_log.tsv"
