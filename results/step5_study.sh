#!/usr/bin/env bash
# Step 5 study (issue 6): the seeds' claims on Fashion-MNIST with LeNet, every run on the one
# schedule of configs/fashion-mnist/study/_schedule.yaml (18 epochs over a fixed class-balanced
# 10,000-example subset of the training split; its header says why). Runs (one recipe each in
# configs/fashion-mnist/study/): gaussian and consistency at σ = 0.25, 0.5, 1.0; at σ = 0.5
# stability, smoothadv, smoothadv+consistency, macer, easy_focus (all three parts, and discard /
# reweigh / attack alone), heat (fine-tuned from gaussian_s050) and gaussian with data-dependent
# training (gaussian_dd_s050).
#
# Every run certifies the same 500 test images (every 20th, --skip 20 --max 500), seed 0, α = 0.001:
#   certify.tsv         Cohen et al.'s CERTIFY, n0 = 100, n = 10,000
#   sequential.tsv      --certifier sequential --opt test=union-final (half of α at the last
#                       look, so a run to n_max loses little against CERTIFY) with the same
#                       budget, n_max = n = 10,000, on the
#                       grid 0, 0.25, … up to the largest radius CERTIFY with n = 10,000 can
#                       reach, σΦ⁻¹(α^(1/10⁴)) = 3.19σ: 0–0.75 (σ = 0.25), 0–1.5 (σ = 0.5),
#                       0–3.0 (σ = 1.0); so both certifiers answer the same question at every
#                       grid radius, with the same largest number of draws
#   sequential_nmax100k.tsv   gaussian_s025 and _s050: the default test (union), n_max = 100,000,
#                       i.e. room to spend more draws than CERTIFY on inputs near a grid radius
#   data_dependent.tsv  Alfarra et al.'s certification (OptimizeSigma, authors' defaults, memory)
#                       of gaussian_s050, consistency_s050 and the data-dependently trained
#                       gaussian_dd_s050; n0 = 100, n = 10,000
#   deterministic.tsv, lbound_heuristic.tsv   heat_s050 as the deterministic HeatSmoothing model
#                       (CERTIFY of the clean prediction, n = 10,000; the paper's L-bound)
# CERTIFY, the sequential and the data-dependent certifier run the torch.compile'd model
# (--compile: the same float32 classifier, ~1.7× faster on the CPU).
#
# Layout: runs/step5/NAME/ holds the checkpoint, log, config, wall_time.tsv and the records while
# they are produced (runs/ is out of git; it survives between calls on one machine). Once a run's
# records are complete they are copied, without the checkpoint, to results/step5/NAME/, and when
# all runs are there the report pieces are written to results/step5/*.md, *.png (from the
# copies in results/, so docs/RESULTS.md can cite them) and results/step5/train_time.tsv.
# A run complete in results/step5/NAME/ is skipped; delete that folder (and runs/step5/NAME/)
# to redo it. Everything resumes: rerun after an interruption.
#
# Usage: results/step5_study.sh [MODE [RUN...]]   (RUNs: a subset, default all)
#   all (default)  train, certify, report; with LANES=2 one lane trains while the other
#                  certifies the runs already trained, then both certify
#   train          train the runs, one at a time, in the order of RUNS
#   certify        certify every trained run's record files, each file claimed by one process
#                  (flock on FILE.claim), so several `certify` processes share the work; waits
#                  for runs still being trained by a `train` process; publishes each record
#                  file as soon as it is complete
#   report         write the report pieces whose record files are published, and splice them
#                  into the blocks <!-- report:step5.NAME --> of docs/RESULTS.md (or $DOC)
# Environment: DEVICE (auto, cpu or cuda; default auto), LANES (processes at once, default 1),
# DATA_ROOT (default .data when it holds the Fashion-MNIST IDX files, else the library's search),
# PYTHON (interpreter used when `smoothcert` is not installed), ONLY (record-file stems, e.g.
# "certify grad_norms": certify only these files of the runs this call, the rest later). On a 2-core CPU:
# `OMP_NUM_THREADS=1 LANES=2 results/step5_study.sh`; on one GPU, LANES=4.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"  # the make-installed smoothcert, when there is one
if command -v smoothcert >/dev/null 2>&1; then
    smoothcert=(smoothcert)
else  # e.g. the GPU machine: run from src/
    smoothcert=(env "PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -c
                'import sys; from smoothcert.cli import main; sys.exit(main())')
fi

mode=${1:-all}
device=${DEVICE:-auto}
lanes=${LANES:-1}
recipes=configs/fashion-mnist/study
work=runs/step5
out=results/step5
count=500  # test images certified per record file
data_root=${DATA_ROOT:-}
if [[ -z $data_root && -f .data/train-images-idx3-ubyte.gz ]]; then
    data_root=.data
fi
data=()
if [[ -n $data_root ]]; then
    data=(--data-root "$data_root")
fi

RUNS=(gaussian_s025 gaussian_s050 gaussian_s100 consistency_s025 consistency_s050 consistency_s100
      stability_s050 gaussian_dd_s050 heat_s050 macer_s050 easy_focus_discard_s050
      easy_focus_reweigh_s050 easy_focus_attack_s050 easy_focus_s050 smoothadv_s050
      smoothadv_consistency_s050
      clean heat_g0006_s050 heat_g001_s050 heat_g003_s050 heat_g01_s050 smoothmix_s050 catrs_s050
      gaussian_dd900_s050)  # cheapest first; each fine-tune after the run it starts from
sample=(--skip 20 --seed 0 --alpha 0.001 --batch 10000 --device "$device"
        --no-progress "${data[@]}")

records_of() {  # the record files (stems) of run $1
    local stems=(certify sequential)
    case $1 in
        gaussian_s025) stems+=(sequential_nmax100k) ;;
        gaussian_s050) stems+=(data_dependent sequential_nmax100k data_dependent_k300
                               data_dependent_k900 data_dependent_package grad_norms) ;;
        consistency_s050) stems+=(data_dependent data_dependent_k900 grad_norms) ;;
        gaussian_dd_s050) stems+=(data_dependent) ;;
        heat_s050) stems+=(deterministic lbound_heuristic) ;;
        # Step 9 (issue 16): the runs added then certify only what their claims need
        clean) stems=() ;;
        heat_g0006_s050) stems=(deterministic certify) ;;  # the ImageNet-equivalent γ
        heat_g*) stems=(deterministic) ;;
        smoothmix_s050 | catrs_s050) stems=(certify grad_norms) ;;
        gaussian_dd900_s050) stems=(certify data_dependent data_dependent_k900) ;;
        smoothadv_s050 | macer_s050 | easy_focus_s050) stems+=(grad_norms) ;;
    esac
    echo "${stems[@]}"
}

count_of() {  # rows of record file $1: the first 200 (K = 300, 900) or 20 (the package's 900
    case $1 in  # steps of 100 draws) of the 500 images, which the CPU can afford (~80 s/image)
        data_dependent_k*) echo 200 ;;
        data_dependent_package) echo 20 ;;
        *) echo "$count" ;;
    esac
}

grid_of() {  # sequential grid of run $1: 0.25 steps up to CERTIFY's n = 10,000 reach (3.19σ)
    case $1 in
        *_s025) echo 0,0.25,0.5,0.75 ;;
        *_s050) echo 0,0.25,0.5,0.75,1,1.25,1.5 ;;
        *_s100) echo 0,0.25,0.5,0.75,1,1.25,1.5,1.75,2,2.25,2.5,2.75,3 ;;
        *) echo "no σ suffix in run name $1" >&2; return 2 ;;
    esac
}

complete() {  # record file $1 holds all rows of its stem (plus its header)
    local stem
    stem=$(basename "$1" .tsv)
    [[ -f $1 ]] && (( $(wc -l <"$1") > $(count_of "$stem") ))
}

published() {  # run $1 is done: config, log and every complete record file in results/step5/$1
    local stem
    [[ -f $out/$1/config.yaml && -f $out/$1/log.tsv ]] || return 1
    for stem in $(records_of "$1"); do
        complete "$out/$1/$stem.tsv" || return 1
    done
}

epochs_logged() {  # completed epochs in the log of run folder $1
    if [[ -f $1/log.tsv ]]; then echo $(( $(wc -l <"$1/log.tsv") - 1 )); else echo 0; fi
}

hardware() {
    local gpu
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
    echo "${gpu:-$(uname -m) CPU}"
}

train_run() {  # train run $1 (resuming), appending this invocation's wall time to wall_time.tsv
    local name=$1 dir=$work/$1 started start before seconds
    if [[ -f $dir/trained ]]; then return; fi
    local init
    init=$(sed -n 's/^init_checkpoint: *//p' "$recipes/$name.yaml")
    if [[ -n $init && ! -f $init ]]; then
        echo "$name fine-tunes $init, which is missing: train $(basename "$(dirname "$init")")" \
             "first (delete its folder in $out if it was published)" >&2
        exit 2
    fi
    mkdir -p "$dir"
    before=$(epochs_logged "$dir") started=$(date -u +%FT%TZ) start=$(date +%s.%N)
    "${smoothcert[@]}" train --config "$recipes/$name.yaml" --out "$dir" --resume --device "$device" \
        --no-progress "${data[@]}"
    seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [[ ! -f $dir/wall_time.tsv ]]; then
        printf 'started\tseconds\tepochs_before\tepochs_after\tdevice\thardware\n' \
            >"$dir/wall_time.tsv"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$started" "$seconds" "$before" "$(epochs_logged "$dir")" \
        "$device" "$(hardware)" >>"$dir/wall_time.tsv"
    touch "$dir/trained"
}

certify_args() {  # the certify flags of record file $2 of run $1
    case $2 in
        certify) echo --n0 100 --n 10000 --compile ;;
        sequential) echo --certifier sequential --opt test=union-final --n0 100 --n 10000 \
                         --radii "$(grid_of "$1")" --compile ;;
        sequential_nmax100k) echo --certifier sequential --n0 100 --n 100000 \
                                  --radii "$(grid_of "$1")" --compile ;;
        data_dependent) echo --certifier data-dependent --n0 100 --n 10000 --compile ;;
        data_dependent_k*) echo --certifier data-dependent --opt "num_steps=${2#data_dependent_k}" \
                                --n0 100 --n 10000 --compile ;;
        data_dependent_package) echo --certifier data-dependent --opt preset=package --n0 100 \
                                     --n 10000 --compile ;;
        deterministic) echo --certifier deterministic --n 10000 ;;
        lbound_heuristic) echo --certifier lbound-heuristic ;;
    esac
}

certify_file() {  # certify_file RUN STEM: 0 when complete, 1 when another process holds it
    local name=$1 stem=$2 file=$work/$1/$2.tsv rc=0 args
    if complete "$file" || complete "$out/$name/$stem.tsv"; then return 0; fi
    same_training "$name"
    if [[ $stem == grad_norms ]]; then  # Sun et al.'s Table 1, on the certified test images
        flock -n -E 75 "$file.claim" "${smoothcert[@]}" analyze grad-norms \
            "$work/$name/checkpoint.pt" --split test --n 100 --skip 20 --max "$count" --seed 0 \
            --device "$device" --no-progress "${data[@]}" --out "$file" >/dev/null || rc=$?
    else
        read -ra args <<<"$(certify_args "$name" "$stem")"
        flock -n -E 75 "$file.claim" "${smoothcert[@]}" certify "$work/$name/checkpoint.pt" \
            "${args[@]}" "${sample[@]}" --max "$(count_of "$stem")" --out "$file" || rc=$?
    fi
    if (( rc == 75 )); then return 1; fi
    if (( rc != 0 )); then exit "$rc"; fi
    if ! complete "$file"; then echo "$file is incomplete after certify" >&2; exit 1; fi
}

same_training() {  # a retrained run $1 must match its published log (all but the timings)
    local new=$work/$1/log.tsv old=$out/$1/log.tsv
    [[ -f $old && -f $new ]] || return 0
    if ! cmp -s <(untimed "$old") <(untimed "$new"); then
        echo "$new differs from the published $old beyond its timings: the retrained model" \
             "is not the one whose records are published; delete $out/$1 to redo the run" >&2
        exit 1
    fi
}

untimed() {  # log file $1 without its seconds and peak_mem_mb columns
    awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) drop[i] = ($i == "seconds" ||
                                                               $i == "peak_mem_mb") }
                 { row = ""; for (i = 1; i <= NF; i++) if (!drop[i]) row = row $i "\t"
                   print row }' "$1"
}

publish() {  # copy run $1's small files (not the checkpoint) to results/step5/$1: its config
    local dir=$work/$1 file stem  # and logs, and each record file once it is complete; files
    mkdir -p "$out/$1"            # published before (a retrained run's log) are kept as they were
    for file in "$dir/config.yaml" "$dir/log.tsv" "$dir/wall_time.tsv"; do
        if [[ -f $file && ! -f $out/$1/$(basename "$file") ]]; then cp "$file" "$out/$1/"; fi
    done
    for stem in $(records_of "$1"); do
        if complete "$dir/$stem.tsv" && [[ ! -f $out/$1/$stem.tsv ]]; then
            cp "$dir/$stem.tsv.manifest.json" "$out/$1/"
            cp "$dir/$stem.tsv" "$out/$1/"  # last: a published .tsv always has its manifest
        fi
    done
}

training_now() {  # a `train` process of this study is alive
    [[ -f $work/train.pid ]] && kill -0 "$(cat "$work/train.pid")" 2>/dev/null
}

train_all() {
    local name
    for name in "${todo[@]}"; do train_run "$name"; done
}

certify_all() {  # certify and publish the trained runs, sharing the files with other processes
    local name stem busy waiting untrained
    while :; do
        busy=0 waiting=0 untrained=()
        for name in "${todo[@]}"; do
            if published "$name"; then continue; fi
            if [[ ! -f $work/$name/trained ]]; then waiting=1 untrained+=("$name"); continue; fi
            local all=1
            for stem in $(records_of "$name"); do
                if [[ -n ${ONLY:-} && " $ONLY " != *" $stem "* ]]; then continue; fi
                certify_file "$name" "$stem" || all=0
                publish "$name"  # each finished file at once, so the report can use it
            done
            publish "$name"  # its config and logs, also when ONLY skipped all its files
            if (( ! all )); then busy=1; fi
        done
        if (( !busy && !waiting )) || [[ -n ${ONLY:-} ]] && (( !busy )); then return 0; fi
        if (( waiting && !busy )) && ! training_now; then
            echo "not trained yet, and no train process is running: ${untrained[*]}" >&2
            return 1
        fi
        sleep 20
    done
}

# ---------------------------------------------------------------------------- which runs
if (( $# > 1 )); then selected=("${@:2}"); else selected=("${RUNS[@]}"); fi
todo=()
for name in "${selected[@]}"; do
    if [[ ! -f $recipes/$name.yaml ]]; then
        echo "unknown run $name; runs: ${RUNS[*]}" >&2
        exit 2
    fi
    if published "$name"; then echo "done: $name ($out/$name)"; else todo+=("$name"); fi
done
mkdir -p "$work"

case $mode in
    train)
        if training_now; then echo "a train process is running: $(cat "$work/train.pid")" >&2
                              exit 2; fi
        echo "$BASHPID" >"$work/train.pid"
        train_all
        exit 0 ;;
    certify)
        certify_all
        exit 0 ;;
    all)
        if (( lanes > 1 )); then  # one lane trains then certifies, the others certify
            lane_pids=()
            trap 'kill "${lane_pids[@]}" 2>/dev/null || true' EXIT
            (train_all && certify_all) &
            lane_pids+=($!)
            echo "$!" >"$work/train.pid"
            for (( lane = 1; lane < lanes; lane++ )); do
                certify_all &
                lane_pids+=($!)
            done
            for pid in "${lane_pids[@]}"; do wait "$pid"; done
            trap - EXIT
        else
            train_all
            certify_all
        fi ;;
    report) ;;
    *) echo "unknown mode $mode: all, train, certify or report" >&2; exit 2 ;;
esac

# ---------------------------------------------------------------------------- report
missing=()
for name in "${RUNS[@]}"; do
    if ! published "$name"; then missing+=("$name"); fi
done
if (( ${#missing[@]} )); then  # write what the published files allow; the rest waits
    echo "runs not finished: ${missing[*]}; the pieces that need them are not rewritten"
fi

device_of() {  # the device type recorded in the manifest of run $1's record file $2, or "?"
    local found
    found=$(sed -n 's/.*"device_type": *"\([a-z]*\)".*/\1/p' \
                "$out/$1/$2.tsv.manifest.json" 2>/dev/null | head -n 1 || true)
    echo "${found:-?}"
}
piece() {  # piece OUT.md COMMAND...: COMMAND's output into OUT.md, only when every .tsv it
    local md=$1 arg  # names is published (an unfinished run leaves the piece as it was)
    shift
    for arg in "$@"; do
        if [[ $arg == *.tsv && ! -f $arg ]]; then
            echo "not rewritten: $md ($arg is not published yet)"
            return 0
        fi
    done
    "$@" >"$md.tmp"
    mv "$md.tmp" "$md"
}
report() {  # report OUT.md ARGS...: one `smoothcert report` table
    local md=$1
    shift
    piece "$md" "${smoothcert[@]}" report "$@"
}
files() {  # files STEM RUN...: results/step5/RUN/STEM.tsv for each RUN
    local stem=$1 name
    shift
    for name in "$@"; do echo "$out/$name/$stem.tsv"; done
}
sigmas=(gaussian_s025 gaussian_s050 gaussian_s100 consistency_s025 consistency_s050
        consistency_s100)
s050=(gaussian_s050 consistency_s050 stability_s050 smoothadv_s050 smoothadv_consistency_s050
      macer_s050 easy_focus_s050 easy_focus_discard_s050 easy_focus_reweigh_s050
      easy_focus_attack_s050 heat_s050 gaussian_dd_s050)
easy=(gaussian_s050 easy_focus_s050 easy_focus_discard_s050 easy_focus_reweigh_s050
      easy_focus_attack_s050)

# Claim 1 (and the σ-envelopes): gaussian vs consistency at every σ.
report "$out/sigmas.md" $(files certify "${sigmas[@]}") --radii 0:3:0.25 \
    --plot "$out/sigmas.png" --ecdf "$out/sigmas_pa_ecdf.png"
report "$out/envelope_gaussian.md" $(files certify gaussian_s025 gaussian_s050 gaussian_s100) \
    --radii 0:3:0.25 --envelope --plot "$out/envelope_gaussian.png"
report "$out/envelope_consistency.md" \
    $(files certify consistency_s025 consistency_s050 consistency_s100) \
    --radii 0:3:0.25 --envelope --plot "$out/envelope_consistency.png"
# Claims 1, 2, 4: every method at σ = 0.5.
report "$out/methods_s050.md" $(files certify "${s050[@]}") --radii 0:2:0.25 \
    --plot "$out/methods_s050.png" --ecdf "$out/methods_s050_pa_ecdf.png"
# Claim 4: the easy-focus parts against their Gaussian baseline (Sun et al.'s Fig. 3 ECDF).
report "$out/easy_focus.md" $(files certify "${easy[@]}") --radii 0:2:0.25 \
    --plot "$out/easy_focus.png" --ecdf "$out/easy_focus_pa_ecdf.png"
# Claim 3: fixed σ vs data-dependent certification, and data-dependent training.
report "$out/data_dependent.md" \
    $(for name in gaussian_s050 consistency_s050 gaussian_dd_s050; do
          files certify "$name"; files data_dependent "$name"; done) \
    --radii 0:2:0.25 --plot "$out/data_dependent.png"
# Claim 5: the deterministic HeatSmoothing model against the stochastic Gaussian one.
report "$out/heat.md" "$out/gaussian_s050/certify.tsv" \
    $(files certify heat_s050) $(files deterministic heat_s050) \
    $(files lbound_heuristic heat_s050) --radii 0:2:0.25 --plot "$out/heat.png"
# Step 9 (issue 16). Sun et al.'s seven methods at σ = 0.5: certified accuracy (their Fig. 6),
# the p̂_A ECDFs (Fig. 3) and the easy/hard gradient norms with ACR (Table 1).
seven=(gaussian_s050 smoothadv_s050 macer_s050 consistency_s050 smoothmix_s050 catrs_s050
       easy_focus_s050)
report "$out/seven_s050.md" $(files certify "${seven[@]}") --radii 0:2:0.25 \
    --plot "$out/seven_s050.png" --ecdf "$out/seven_s050_pa_ecdf.png"
measured=()  # Table 1 grows as the runs' grad-norm files are published (the table names them)
for name in "${seven[@]}"; do
    if [[ -f $out/$name/grad_norms.tsv ]]; then measured+=("$name"); fi
done
if (( ${#measured[@]} )); then
    piece "$out/grad_norms.md" "${smoothcert[@]}" analyze easy-hard \
        $(files grad_norms "${measured[@]}") --acr $(files certify "${measured[@]}")
fi
# Claim 5 re-tested: one epoch of the authors' final HeatSmoothing from the clean model, γ swept.
heats=(heat_g0006_s050 heat_g001_s050 heat_g003_s050 heat_g01_s050)
certified=()  # the γ whose deterministic records are published so far (the table names them)
for name in "${heats[@]}"; do
    if [[ -f $out/$name/deterministic.tsv ]]; then certified+=("$name"); fi
done
report "$out/heat_faithful.md" "$out/gaussian_s050/certify.tsv" $(files certify heat_g0006_s050) \
    $(files deterministic "${certified[@]}") \
    --radii 0:2:0.25 --plot "$out/heat_faithful.png"
# Claim 3 re-tested: OptimizeSigma's budget K ∈ {100, 300, 900} at α_σ = 1e-4 and the package's
# option set, then data-dependent training with the authors' number of σ updates.
report "$out/dd_budgets.md" \
    $(for stem in certify data_dependent data_dependent_k300 data_dependent_k900; do
          files "$stem" gaussian_s050; done) \
    --radii 0:2.5:0.25 --common --plot "$out/dd_budgets.png" \
    --sigma-hist "$out/dd_sigma_hist.png"
report "$out/dd_package.md" $(for stem in certify data_dependent data_dependent_k900 \
                                  data_dependent_package; do files "$stem" gaussian_s050; done) \
    --radii 0:2.5:0.25 --common --sigma-hist "$out/dd_package_sigma_hist.png"
report "$out/dd_package_agreement.md" $(for stem in certify data_dependent_k900; do
                                            files "$stem" gaussian_s050
                                            files data_dependent_package gaussian_s050; done) \
    --agreement --common --radii 0:2.5:0.25
report "$out/dd_agreement.md" $(for stem in certify data_dependent; do
                                    files "$stem" gaussian_s050
                                    files data_dependent_k900 gaussian_s050; done) \
    --agreement --common --radii 0:2.5:0.25
# K = 900 on the consistency model and on the model trained with the authors' σ updates, next
# to the Gaussian model's (the baseline of "data-dependent training helps further")
report "$out/dd_models.md" \
    $(files certify gaussian_s050) $(files data_dependent_k900 gaussian_s050) \
    $(files certify consistency_s050) $(files data_dependent consistency_s050) \
    $(files data_dependent_k900 consistency_s050) \
    $(for stem in certify data_dependent data_dependent_k900; do
          files "$stem" gaussian_dd900_s050; done) \
    --radii 0:2.5:0.25 --common --plot "$out/dd_models.png"
report "$out/dd_models_agreement.md" \
    $(for stem in certify data_dependent_k900; do
          files "$stem" gaussian_s050; files "$stem" gaussian_dd900_s050; done) \
    $(files certify consistency_s050) $(files data_dependent_k900 consistency_s050) \
    --agreement --common --radii 0:2.5:0.25
{   # σ_x of the training examples at the end of data-dependent training (the logs' last rows)
    printf 'name\tdd_steps_per_epoch\tsigma_updates\tsigma_min\tsigma_mean\tsigma_max\n'
    for name in gaussian_dd_s050 gaussian_dd900_s050; do  # trained: its log is published
        if [[ ! -f $out/$name/log.tsv || ! -f $out/$name/config.yaml ]]; then continue; fi
        # config.yaml: the σ mode's K and first epoch, as sigma_mode_params (num_steps,
        # start_epoch) or, in configs written before that field, as dd_steps, dd_start_epoch
        awk -F'\t' -v name="$name" '
            FILENAME ~ /config.yaml$/ { if ($0 !~ /^ /) section = $0
                                        split($0, kv, ": "); key = kv[1]; sub(/^ +/, "", key)
                                        if ($0 ~ /^ / && section ~ /^sigma_mode_params:/)
                                            key = (key == "num_steps") ? "dd_steps" : "dd_" key
                                        cfg[key] = kv[2]; next }
            FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
            { last = $0; epochs = $(col["epoch"]) }
            END { split(last, f, "\t"); k = cfg["dd_steps"]
                  printf "%s\t%d\t%d\t%.4f\t%.4f\t%.4f\n", name, k,
                         k * (epochs - cfg["dd_start_epoch"]), f[col["sigma_min"]],
                         f[col["sigma_mean"]], f[col["sigma_max"]] }
        ' "$out/$name/config.yaml" "$out/$name/log.tsv"
    done
} >"$out/dd_training.tsv"

# Claim 6: sequential vs fixed-n CERTIFY, per σ on the sequential grid.
report "$out/sequential_s025.md" \
    $(for name in gaussian_s025 consistency_s025; do files certify "$name"
          files sequential "$name"; done) $(files sequential_nmax100k gaussian_s025) \
    --radii 0:0.75:0.25
report "$out/sequential_s050.md" \
    $(for name in "${s050[@]}"; do files certify "$name"; files sequential "$name"; done) \
    $(files sequential_nmax100k gaussian_s050) --radii 0:1.5:0.25
report "$out/sequential_s100.md" \
    $(for name in gaussian_s100 consistency_s100; do files certify "$name"
          files sequential "$name"; done) --radii 0:3:0.25

# Claim 6, example by example: per grid radius, the images only CERTIFY / only the sequential
# certifier certifies.
for sigma in s025 s050 s100; do
    pairs=()
    for name in "${RUNS[@]}"; do
        if [[ $name != *_$sigma ]]; then continue; fi
        for stem in $(records_of "$name"); do
            if [[ $stem == sequential* ]]; then
                pairs+=("$out/$name/certify.tsv" "$out/$name/$stem.tsv")
            fi
        done
    done
    report "$out/agreement_$sigma.md" "${pairs[@]}" --agreement --radii "$(grid_of "x_$sigma")"
done

# Claim 6's cost: forward passes per image (n0 + n, selection included) of CERTIFY and of the
# sequential certifier, and how often each stopping rule ended the sequential runs.
{
    printf 'name\tfile\tcertify_forward_per_image\tsequential_forward_per_image\tfewer\tstopped\n'
    for name in "${RUNS[@]}"; do
        for stem in $(records_of "$name"); do
            if [[ $stem != sequential* || ! -f $out/$name/$stem.tsv ]]; then continue; fi
            awk -F'\t' -v name="$name" -v stem="$stem" '
                FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
                FILENAME ~ /\/certify.tsv$/ { c += $(col["n0"]) + $(col["n"]); cn++; next }
                { s += $(col["n0"]) + $(col["n"]); sn++; stop[$(col["stopped"])]++ }
                END { how = ""; split("all n_max unreachable futile", why, " ")
                      for (j = 1; j <= 4; j++) if (stop[why[j]]) how = how (how == "" ? "" : ",") \
                          why[j] "=" stop[why[j]]
                      printf "%s\t%s\t%.0f\t%.0f\t%.2f\t%s\n", name, stem, c / cn, s / sn,
                             (c / cn) / (s / sn), how }
            ' "$out/$name/certify.tsv" "$out/$name/$stem.tsv"
        done
    done
} >"$out/sequential_draws.tsv"

# Certification cost: seconds per record file (the sum of its rows' `time`, each image's share
# of the wall time) and per image, with the device type its manifest records (cpu or cuda).
{
    printf 'name\tfile\timages\tseconds\tseconds_per_image\tdevice\n'
    for name in "${RUNS[@]}"; do
        for stem in $(records_of "$name"); do
            if [[ $stem == grad_norms ]]; then continue; fi  # an analysis, not a certificate
            if [[ ! -f $out/$name/$stem.tsv ]]; then continue; fi
            awk -F'\t' -v name="$name" -v stem="$stem" -v device="$(device_of "$name" "$stem")" '
                FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
                { s += $(col["time"]); n++ }
                END { printf "%s\t%s\t%d\t%.1f\t%.3f\t%s\n", name, stem, n, s, s / n, device }
            ' "$out/$name/$stem.tsv"
        done
    done
} >"$out/certify_time.tsv"

# Training cost, from the published logs (in git): seconds summed over the logged epochs, and the
# wall time of the train commands (process start, data loading and test evaluation included;
# heat_s050's is its fine-tune only: add gaussian_s050's for the whole model).
{
    printf 'name\tmethod\tsigma\tsigma_mode\tepochs\tepoch_seconds\tseconds_per_epoch\twall_seconds'
    printf '\tresumed\thardware\n'
    for name in "${RUNS[@]}"; do
        if [[ ! -f $out/$name/log.tsv ]]; then continue; fi  # not trained and published yet
        # wall_time.tsv is missing where a train command ran outside the driver: wall "-"
        awk -F'\t' -v name="$name" '
            FILENAME ~ /config.yaml$/ { split($0, kv, ": "); cfg[kv[1]] = kv[2]; next }
            FILENAME ~ /log.tsv$/ && FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
            FILENAME ~ /log.tsv$/ { secs += $(col["seconds"]); epochs++; next }
            FNR > 1 { wall += $2; walls++; if ($3 > 0) resumed = 1; hw = $6 }
            END { printf "%s\t%s\t%s\t%s\t%d\t%.1f\t%.3f\t%s\t%s\t%s\n", name, cfg["method"],
                  cfg["sigma"], cfg["sigma_mode"], epochs, secs, secs / epochs,
                  walls ? sprintf("%.1f", wall) : "-", walls ? (resumed ? "yes" : "no") : "-",
                  walls ? hw : "-" }
        ' "$out/$name/config.yaml" "$out/$name/log.tsv" \
            $(if [[ -f $out/$name/wall_time.tsv ]]; then echo "$out/$name/wall_time.tsv"; fi)
    done
} >"$out/train_time.tsv"
# smoothcert's training-cost table (method, #HP, s/epoch, peak MB, ACR of certify.tsv), from the
# published copies (config.yaml stands in for the checkpoint).
report "$out/train_cost.md" --train $(for name in "${RUNS[@]}"; do
                                          if [[ -f $out/$name/log.tsv ]]; then echo "$out/$name"
                                          fi; done)

# The TSV summaries as Markdown tables, then every piece into its block of docs/RESULTS.md:
# the lines between <!-- report:step5.NAME --> and <!-- /report:step5.NAME --> are replaced by
# results/step5/NAME.md, so the document's tables are only ever written here.
for tsv in train_time certify_time sequential_draws dd_training; do
    awk -F'\t' '{ row = "|"; for (i = 1; i <= NF; i++) row = row " " $i " |"; print row }
                 NR == 1 { row = "|"; for (i = 1; i <= NF; i++) row = row " --- |"; print row }' \
        "$out/$tsv.tsv" >"$out/$tsv.md.tmp"
    mv "$out/$tsv.md.tmp" "$out/$tsv.md"
done
doc=${DOC:-docs/RESULTS.md}
if [[ -f $doc ]]; then
    env "PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" - "$doc" "$out" <<'SPLICE'
import re
import sys
from pathlib import Path

from smoothcert.report import splice_block

doc, out = Path(sys.argv[1]), Path(sys.argv[2])
names = re.findall(r"^<!-- report:(step5\.[A-Za-z0-9_.]+) -->$", doc.read_text(), re.M)
written = 0
for name in names:
    piece = out / f"{name.removeprefix('step5.')}.md"
    if not piece.is_file():  # its runs are not published yet: the block keeps what it holds
        print(f"{doc}: block {name} left as it is (no {piece} yet)")
        continue
    splice_block(doc, name, piece.read_text(encoding="utf-8"))
    written += 1
print(f"{doc}: {written} tables written")
SPLICE
fi
echo "results: $out"
