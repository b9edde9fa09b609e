#!/usr/bin/env bash
# WMT'14 English->German, step 3: average the last 5 checkpoints and score newstest2014.
#
#   tools/scripts/recipes/wmt14-en-de/evaluate.sh [--work DIR] [--checkpoint FILE] [--smoke] [-- luna-translate options]
#
# Averages the parameters of the last 5 checkpoint_<epoch>_<update> files in WORK/checkpoints
# (luna-average; fewer when fewer exist) into WORK/checkpoint_avg5.safetensors, translates
# newstest2014 full (WORK/raw/test.en; 3003 sentences, or prepare.sh --smoke's 200) with beam 4,
# length penalty 0.6, and scores it with tools/scripts/evaluate.sh against WORK/raw/test.de (the sacreBLEU
# wmt14/full reference): sacreBLEU (13a, mixed case) with its signature, and the papers'
# tokenized BLEU with compound splitting (clearly labelled; not comparable with sacreBLEU).
# Hypotheses go to WORK/newstest2014.hyp.de, the scores to WORK/bleu.txt.
#
# options:
#   --work DIR         working folder (default: build-wmt14; --smoke: build-wmt14-smoke)
#   --checkpoint FILE  score this checkpoint instead of averaging
#   --num-average N    how many update checkpoints to average (default 5)
#   --threads N        CPU threads for translation (default: nproc)
#   --build DIR        folder with luna-average and luna-translate (default: build, else PATH)
#   --smoke            the quick CI variant (default work folder, --max-len-a 1.2 --max-len-b 10)
#   -h, --help         this help
# Anything after "--" goes to luna-translate (e.g. -- --beam 5 --lenpen 1.0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
die() { echo "evaluate.sh: error: $*" >&2; exit 1; }
say() { echo "evaluate.sh: $*"; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

work="" ckpt="" navg=5 threads="$(nproc 2>/dev/null || echo 2)" build="$repo/build" smoke=0
extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --work) need "$@"; work="$2"; shift 2 ;;
        --checkpoint) need "$@"; ckpt="$2"; shift 2 ;;
        --num-average) need "$@"; navg="$2"; shift 2 ;;
        --threads) need "$@"; threads="$2"; shift 2 ;;
        --build) need "$@"; build="$2"; shift 2 ;;
        --smoke) smoke=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ -n "$work" ]] || { [[ $smoke -eq 1 ]] && work="$repo/build-wmt14-smoke" || work="$repo/build-wmt14"; }
[[ "$navg" =~ ^[1-9][0-9]*$ ]] || die "--num-average must be a positive integer, got '$navg'"
find_prog() {
    local p="$build/$1"
    [[ -x "$p" ]] || p="$(command -v "$1" || true)"
    [[ -n "$p" && -x "$p" ]] || die "$1 not found in $build or on PATH: build it (cmake --build build) or give --build DIR"
    echo "$p"
}
average="$(find_prog luna-average)"
translate="$(find_prog luna-translate)"
src="$work/raw/test.en" ref="$work/raw/test.de"
[[ -f "$src" && -f "$ref" ]] || die "$src or $ref not found: run prepare.sh first (or give --work DIR)"

if [[ -z "$ckpt" ]]; then
    ckdir="$work/checkpoints"
    [[ -d "$ckdir" ]] || die "$ckdir not found: run train.sh first (or give --checkpoint FILE)"
    n=$(find "$ckdir" -maxdepth 1 -regextype posix-extended -regex '.*/checkpoint_[0-9]+_[0-9]+\.safetensors' | wc -l)
    if [[ $n -eq 0 ]]; then
        [[ -f "$ckdir/checkpoint_last.safetensors" ]] || die "no checkpoints in $ckdir: run train.sh first"
        say "no update checkpoints in $ckdir: scoring checkpoint_last without averaging"
        ckpt="$ckdir/checkpoint_last.safetensors"
    else
        (( n < navg )) && navg=$n
        ckpt="$work/checkpoint_avg$navg.safetensors"
        say "averaging the last $navg update checkpoints of $ckdir -> $ckpt"
        "$average" --save-dir "$ckdir" --num-update-checkpoints "$navg" --output "$ckpt" 2>&1 | sed 's/^/  /' ||
            die "luna-average failed"
    fi
fi
[[ -f "$ckpt" ]] || die "$ckpt: no such checkpoint"

# Passive OpenMP waiting: spinning threads slow decoding down many times on a busy machine.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
targs=(--beam 4 --lenpen 0.6 --threads "$threads")
[[ $smoke -eq 1 ]] && targs+=(--max-len-a 1.2 --max-len-b 10)
targs+=("${extra[@]}")
say "translating $src ($(wc -l <"$src") sentences) with ${targs[*]}"
"$repo/tools/scripts/evaluate.sh" "$ckpt" --src "$src" --ref "$ref" --tokenized-bleu \
    --output "$work/newstest2014.hyp.de" --translate "$translate" -- "${targs[@]}" | tee "$work/bleu.txt" ||
    die "translation or scoring failed"
say "hypotheses: $work/newstest2014.hyp.de; scores: $work/bleu.txt"
