#!/usr/bin/env bash
# Long-sequence efficiency: training steps/s and peak activation memory of softmax
# attention, Luna-16/128/256 and Linformer (k = 256, headwise sharing, E, F as long as the
# source) at long lengths, as ratios to softmax beside the paper's Table 2.
#
#   tools/bench/long.sh [--build DIR] [--out DIR] [--lengths "1024 2048 3072 4096 8192"]
#                       [--types "softmax luna16 luna128 luna256 linformer"]
#                       [--settings "encoder decoder"]
#                       [--batch 1] [--embed-dim 128] [--ffn-dim 256] [--heads 4] [--layers 1]
#                       [--vocab 260] [--tgt-len 32] [--threads 1] [--steps 2]
#                       [--max-softmax-gib 4] [--time cpu|wall] [--venv DIR] [--no-plot]
#
# Every point is one bench-model process (fresh arena): one warmup step, then --steps timed
# forward+backward steps of the full seq2seq model with dropout 0.1 everywhere (embeddings,
# attention probabilities, FFN activations), on one synthetic batch of full-length sentences.
# Settings (same batch size for every attention type):
#   encoder  sources of the given length, targets of --tgt-len (32) tokens: encoder-dominated,
#            the closest our seq2seq model comes to the paper's byte-level classification
#            (LRA text: long input, no long output). Softmax: full m x m self-attention.
#   decoder  sources of --tgt-len tokens, targets of the given length: the causal decoder
#            (softmax: masked n x n attention; Luna: the causal scan of spec §3). Linformer is
#            an encoder self-attention only (no causal form): not run in this setting.
# Luna runs with --fix-projection-length (all l slots): in the decoder setting the sources are
# shorter than l, and dynamic projection (spec §1) would cut every Luna-l down to Luna-32.
# Time: --time cpu (default) counts the process's CPU seconds per step, wall the elapsed ones.
# On a machine shared with other work a single-threaded run's CPU time measures its own work
# while wall time also measures the neighbours' (which change between points); with an idle
# machine and --threads 1 the two agree.
# Peak activation memory = the activation arena's high-water mark + the ops' scratch high-water
# mark (what bench-model reports); parameters, gradients and optimizer state are excluded (they
# do not depend on the length). Softmax points whose estimated attention memory
# ((2·layers + 1) · batch · heads · len² · 4 bytes) exceeds --max-softmax-gib are skipped
# (reported as "-"), as the paper's table stops where softmax no longer fits.
# Output: OUT/long.tsv (raw), OUT/long.md (the table, also printed), OUT/long.png (memory and
# time vs length, needs matplotlib: the evaluation venv of tools/demo.sh / tools/scripts/evaluate.sh,
# build-eval/.venv-eval or $LUNA_EVAL_VENV; without it the plot is skipped with a message).
# Default run: about 4 minutes on one core.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="$repo/build" out="$repo/build-long" lengths="1024 2048 3072 4096 8192"
types="softmax luna16 luna128 luna256 linformer" settings="encoder decoder"
batch=1 dim=128 ffn=256 heads=4 layers=1 vocab=260 short=32 threads=1 steps=2 max_gib=4
venv="${LUNA_EVAL_VENV:-$repo/build-eval/.venv-eval}" plot=1 timing=cpu
die() { echo "long.sh: $*" >&2; exit 1; }
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
    --build) need "$@"; build="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --lengths) need "$@"; lengths="$2"; shift 2 ;;
    --types) need "$@"; types="$2"; shift 2 ;;
    --settings) need "$@"; settings="$2"; shift 2 ;;
    --batch) need "$@"; batch="$2"; shift 2 ;;
    --embed-dim) need "$@"; dim="$2"; shift 2 ;;
    --ffn-dim) need "$@"; ffn="$2"; shift 2 ;;
    --heads) need "$@"; heads="$2"; shift 2 ;;
    --layers) need "$@"; layers="$2"; shift 2 ;;
    --vocab) need "$@"; vocab="$2"; shift 2 ;;
    --tgt-len) need "$@"; short="$2"; shift 2 ;;
    --threads) need "$@"; threads="$2"; shift 2 ;;
    --steps) need "$@"; steps="$2"; shift 2 ;;
    --max-softmax-gib) need "$@"; max_gib="$2"; shift 2 ;;
    --venv) need "$@"; venv="$2"; shift 2 ;;
    --no-plot) plot=0; shift ;;
    --time) need "$@"; timing="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ "$timing" == cpu || "$timing" == wall ]] || die "--time must be cpu or wall (got '$timing')"
bench="$build/bench-model"
[[ -x "$bench" ]] || die "$bench not found (cmake -S . -B build && cmake --build build --target bench-model)"
for v in "$batch" "$dim" "$ffn" "$heads" "$layers" "$vocab" "$short" "$threads" "$steps" $lengths; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || die "'$v' is not a positive integer"
done
mkdir -p "$out"
tsv="$out/long.tsv"
printf 'setting\ttype\tlength\tsteps_per_s\tpeak_bytes\n' >"$tsv"
echo "long.sh: time = $timing seconds, $(uname -m), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), batch $batch, d $dim, FFN $ffn, $heads heads, $layers+$layers layers, V $vocab, short side $short, $threads thread(s), 1 warmup + $steps timed steps"
for setting in $settings; do
    for type in $types; do
        case "$type" in
        softmax) archargs=(--arch transformer_tiny) ;;
        luna[0-9]*) archargs=(--arch luna_tiny --projection-length "${type#luna}" --fix-projection-length) ;;
        linformer) archargs=(--arch transformer_tiny --linformer-k 256) ;;
        *) die "unknown attention type '$type' (softmax, lunaN, linformer)" ;;
        esac
        if [[ "$type" == linformer && "$setting" == decoder ]]; then continue; fi
        for len in $lengths; do
            if [[ "$type" == softmax ]]; then
                est=$(((2 * layers + 1) * batch * heads * len * len * 4))
                if ((est > max_gib * 1073741824)); then
                    echo "long.sh: $setting $type $len: skipped (attention needs ~$((est >> 20)) MiB > --max-softmax-gib $max_gib)"
                    continue
                fi
            fi
            case "$setting" in
            encoder) m=$len n=$short ;;
            decoder) m=$short n=$len ;;
            *) die "unknown setting '$setting' (encoder, decoder)" ;;
            esac
            line=$("$bench" "${archargs[@]}" --batch "$batch" --src-len "$m" --tgt-len "$n" \
                --vocab "$vocab" --embed-dim "$dim" --ffn-dim "$ffn" --heads "$heads" \
                --layers "$layers" --threads "$threads" --warmup 1 --steps "$steps" \
                --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1 |
                grep '^bench-model-result:') || die "bench-model failed for $setting $type $len"
            if [[ "$timing" == cpu ]]; then
                sps=$(sed -n 's/.* cpu_s_per_step=\([^ ]*\).*/\1/p' <<<"$line" | awk '{printf "%.6f", 1 / $1}')
            else
                sps=$(sed -n 's/.* steps_per_s=\([^ ]*\).*/\1/p' <<<"$line")
            fi
            peak=$(sed -n 's/.* peak_bytes=\([^ ]*\).*/\1/p' <<<"$line")
            printf '%s\t%s\t%s\t%s\t%s\n' "$setting" "$type" "$len" "$sps" "$peak" >>"$tsv"
            echo "long.sh: $setting $type $len: $sps steps/s, peak $((peak >> 20)) MiB"
        done
    done
done
py=python3
[[ -x "$venv/bin/python" ]] && py="$venv/bin/python"
plotargs=()
if ((plot)); then
    if "$py" -c "import matplotlib" 2>/dev/null; then
        plotargs=(--plot "$out/long.png")
    else
        echo "long.sh: no matplotlib in $py (run tools/demo.sh or set LUNA_EVAL_VENV): no plot" >&2
    fi
fi
"$py" "$repo/tools/bench/long_report.py" "$tsv" "${plotargs[@]}" \
    --caption "$timing time, batch $batch, d $dim, FFN $ffn, $heads heads, $layers+$layers layers, V $vocab, short side $short, $threads thread(s), $(nproc) cores" \
    | tee "$out/long.md"
