#!/usr/bin/env bash
# The GPU suite as a session with a lent GPU runs it (see docs/BENCHMARKS.md, "GPU suite"), in
# two parts of a few minutes each, so that each fits one call of a lent machine:
#   PART=main (the default): CERTIFY seconds per image (n0 = 100, n = 100,000, α = 0.001) of
#     cifar_resnet110 and resnet50, reference vs engine per setting vs forward ceiling, at
#     `default` (what `smoothcert certify` now runs with on CUDA, no flag given: channels-last
#     and compile with CUDA graphs, float32) beside fp32, channels_last, bf16+channels_last and
#     the best setting measured so far, bf16+channels_last+compile_cudagraphs (4.30 s/image on
#     an H200), at batches up to 4000; each model's summary line gives default and the best
#     setting in seconds per image and their ratio; then the denoised rows:
#     google/ddpm-cifar10-32's UNet (random weights) + cifar_resnet110, fixed-n and sequential
#     on the 2σ grid, fp32 and bf16+channels_last. About 5 minutes of an H100 (estimated from
#     the 4 measured 2026-11-25).
#   PART=forward: the forward itself, for the goals ResNet-110 ≤ 0.6 s/image and ResNet-50
#     ≤ 3 s/image: bf16+channels_last eager at batches 1000-8000 (a batch that does not fit is
#     skipped), then compiled in torch.compile's modes default, reduce-overhead (CUDA graphs)
#     and max-autotune at the eager setting's best batch. Not yet measured: max-autotune
#     compiles for minutes; rows are written as they finish, so a cut run keeps what it measured.
#   PART=dds: diffusion denoised smoothing like for like (benchmarks/dds_like_for_like.py):
#     Carlini et al.'s CIFAR-10 setting (improved-diffusion's 52.5M UNet + ViT-B/16 at 224,
#     random weights), their loop against the engine (fp32, bf16+channels_last) at their n0 =
#     100, n = 100,000 and batch 200, one image; writes dds_like_for_like.*. On an H200
#     (measured): the reference 108 s, the engine 108 s at fp32 and 35 s at bf16+channels_last,
#     plus about 30 s of setup: over 4.5 minutes, so one call may need --settings split.
#   PART=ablation: ablation certification (benchmarks/ablation_certify.py): seconds per image of
#     column (28 passes), block (784) and pixels (n0 = 1,000 + n = 10,000, the AAAI paper's)
#     with lenet at 1x28x28, engine vs the authors' one-position-at-a-time loop, 100 images;
#     writes ablation_certify.*. Under a minute of an H200 (measured 2026-11-27).
#   PART=noises: every registered noise against Gaussian (benchmarks/lp_noises.py): CERTIFY
#     seconds per image (n0 = 100, n = 10,000, batch 1000, lenet at 1x28x28, 20 images), the
#     noise's draws alone, and its radius tables at d = 784 built and read; writes lp_noises.*.
#     About a minute of an H200 (measured 2026-11-27, with the dds part in the same call).
#   PART=tss: semantic transformations (benchmarks/tss_cost.py): CERTIFY with Gaussian noise
#     against TSS per transformation (brightness, contrast, blur with the exact and the OpenCV
#     kernel, translation; the paper's MNIST settings), seconds per image (n0 = 100,
#     n = 10,000, batch 1000, lenet at 1x28x28, 20 images) and the drawing alone (perturb_);
#     no authors' rows (their clone is not on the lent machine); writes tss_cost.*. Estimated
#     under a minute of an H200 (the noises part's size, 6 rows instead of 9; not measured).
#     Then rotation certified by sampling (benchmarks/tss_sampling.py: the interpolation bound
#     per image, and 100 samples at n = 10,000 against CERTIFY, 5 images, 2 rounds); writes
#     tss_sampling.*. Estimated 2-3 minutes (5.5M forwards of lenet per round; not measured).
# Results land in $OUT (default /tmp/gpu_suite): gpu_suite.md (the table), gpu_suite.json,
# gpu_suite.log (stderr); PART=forward writes gpu_suite_forward.*. Extra arguments go to
# gpu_suite.py, e.g. --peak-tflops 989 494.
#     bash benchmarks/gpu_suite.sh && PART=forward bash benchmarks/gpu_suite.sh
#     PART=dds bash benchmarks/gpu_suite.sh; PART=ablation bash benchmarks/gpu_suite.sh
#     PART=noises bash benchmarks/gpu_suite.sh; PART=tss bash benchmarks/gpu_suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_suite}
mkdir -p "$out"
python=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
case "${PART:-main}" in
main)
    name=gpu_suite
    part=(--models cifar_resnet110 resnet50 ddpm_cifar10+cifar_resnet110
          --batches 256 512 1000 2000 4000
          --settings fp32 channels_last default bf16+channels_last
          bf16+channels_last+compile_cudagraphs
          --denoised-settings fp32 bf16+channels_last --denoised-batches 500 1000
          --denoised-sweep-n 2000 --denoised-reference-n 1000 --denoised-images 1
          --sequential-images 10 --sequential-tests union targeted) ;;
forward)
    name=gpu_suite_forward
    part=(--models cifar_resnet110 resnet50 --batches 1000 2000 4000 8000
          --settings bf16+channels_last bf16+channels_last+compile
          bf16+channels_last+compile_cudagraphs bf16+channels_last+compile_autotune) ;;
dds)
    "$python" benchmarks/dds_like_for_like.py --device cuda --n 100000 --n0 100 --batch 200 \
        --images 1 --rounds 1 --settings fp32 bf16+channels_last \
        --json "$out/dds_like_for_like.json" "$@" 2> >(tee "$out/dds_like_for_like.log" >&2) \
        | tee "$out/dds_like_for_like.md"
    exit 0 ;;
ablation)
    "$python" benchmarks/ablation_certify.py --device cuda --images 100 --batch 4000 \
        --n0 1000 --n 10000 --rounds 3 "$@" 2> >(tee "$out/ablation_certify.log" >&2) \
        | tee "$out/ablation_certify.md"
    exit 0 ;;
noises)
    "$python" benchmarks/lp_noises.py --device cuda --images 20 --n0 100 --n 10000 \
        --batch 1000 --rounds 3 "$@" 2> >(tee "$out/lp_noises.log" >&2) \
        | tee "$out/lp_noises.md"
    exit 0 ;;
tss)
    "$python" benchmarks/tss_cost.py --device cuda --images 20 --n0 100 --n 10000 \
        --batch 1000 --rounds 3 "$@" 2> >(tee "$out/tss_cost.log" >&2) \
        | tee "$out/tss_cost.md"
    "$python" benchmarks/tss_sampling.py --device cuda --images 5 --n0 100 --n 10000 \
        --batch 2000 --rounds 2 2> >(tee "$out/tss_sampling.log" >&2) \
        | tee "$out/tss_sampling.md"
    exit 0 ;;
*)
    echo "PART must be main or forward (or dds, ablation, noises, tss), got ${PART}" >&2
    exit 2 ;;
esac
"$python" benchmarks/gpu_suite.py --device cuda "${part[@]}" \
    --n 100000 --n0 100 --images 1 --rounds 1 --sweep-n 10000 --reference-n 10000 \
    --json "$out/$name.json" "$@" 2> >(tee "$out/$name.log" >&2) | tee "$out/$name.md"
