#!/usr/bin/env bash
# CPU training speed, before/after in one run (docs/benchmarks.md, "CPU training").
#
#   tools/bench/train-speed.sh [--before BUILD] [--after BUILD] [--data DATA-BIN] [--threads 2]
#                              [--reps 2] [--updates 20]
#
# For each build (a directory with bench-gemm, bench-model and luna-train): the GEMM rate through
# the backend on luna_base's three big shapes (after only), `bench-model --update` (luna_base_tied,
# 128 x 32 target tokens, clip + Apollo) REPS times, alternating the builds, and `luna-train` on
# DATA-BIN (the WMT'14 recipe's Apollo settings, --max-tokens 4096) for UPDATES updates, logging
# every UPDATES/2: the second log line's wps is the steady state (the first includes the
# arena's first-touch page faults). Without --before only the after build is measured. Timing
# runs get `nice -n -10` when allowed, so that niced background work barely disturbs them.
# DATA-BIN: tools/scripts/recipes/wmt14-en-de/prepare.sh --offline --bpe-vocab-size 32000 (default
# build-wmt14/data-bin).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
before="" after="$repo/build" data="$repo/build-wmt14/data-bin" threads=2 reps=2 updates=20
die() { echo "train-speed.sh: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --before) before="$2"; shift 2 ;;
        --after) after="$2"; shift 2 ;;
        --data) data="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        --reps) reps="$2"; shift 2 ;;
        --updates) updates="$2"; shift 2 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ "$updates" =~ ^[1-9][0-9]*$ && $updates -ge 2 ]] || die "--updates must be an integer >= 2"
[[ -f "$data/dict.en.txt" ]] || die "$data is not a data-bin (run tools/scripts/recipes/wmt14-en-de/prepare.sh --offline --bpe-vocab-size 32000, or give --data)"
builds=("$after"); names=(after)
[[ -n "$before" ]] && { builds=("$before" "$after"); names=(before after); }
for b in "${builds[@]}"; do
    for p in bench-gemm bench-model luna-train; do [[ -x "$b/$p" ]] || die "$b/$p not found"; done
done
prio=(nice -n -10); nice -n -10 true 2>/dev/null || prio=()

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $threads threads; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "## GEMM through the backend (after), GFLOP/s at $threads threads"
for s in "4096 2048 512" "4096 512 2048" "4096 32000 512"; do
    read -r m n k <<<"$s"
    echo "${m}x${n}x${k}: $("${prio[@]}" "$after/bench-gemm" --m "$m" --n "$n" --k "$k" --threads "$threads" --reps 3 2>&1 |
        grep "threads=$threads" | tr -s ' ' | cut -d' ' -f3-4 | tr '\n' ' ')"
done
echo "## bench-model --update"
for ((r = 1; r <= reps; r++)); do
    for i in "${!builds[@]}"; do
        echo "${names[$i]}: $("${prio[@]}" "${builds[$i]}/bench-model" --threads "$threads" --warmup 1 --steps 2 --update 2>&1 | grep 'target tokens/s' | tail -n 1)"
    done
done
echo "## luna-train, $data, $updates updates"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
for i in "${!builds[@]}"; do
    echo "${names[$i]}:"
    "${prio[@]}" "${builds[$i]}/luna-train" "$data" --arch luna_base_tied --projection-length 32 \
        --causal-activation softplus --optimizer apollo --lr 0.1 --apollo-beta 0.9 --apollo-eps 1e-4 \
        --weight-decay 1e-8 --weight-decay-type L2 --clip-norm 0.1 --clip-mode each \
        --lr-scheduler milestone --warmup-updates 1000 --warmup-init-lr 1e-5 --label-smoothing 0.1 \
        --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1 --device cpu \
        --threads "$threads" --max-tokens 4096 --max-update "$updates" --seed 1 \
        --log-interval $((updates / 2)) --disable-validation --save-dir "$work/ck" --no-save \
        --no-progress-bar 2>&1 | grep -E '\| update [0-9]+ \|'
done
