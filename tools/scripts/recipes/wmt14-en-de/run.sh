#!/usr/bin/env bash
# WMT'14 English->German end to end: prepare.sh, train.sh, evaluate.sh (see each one's --help).
#
#   tools/scripts/recipes/wmt14-en-de/run.sh [--smoke] [--mode 8gpu|1gpu|cpu] [--work DIR] [--no-deps] [-- luna-train options]
#
# Does its own setup first (tools/ci/install-deps.sh, a build of the programs in build/ when missing;
# tools/scripts/evaluate.sh makes the sacreBLEU venv). Then: data (downloaded where the network allows,
# else ../shared/data/wmt14-en-de train-mini), the paper's training command in the chosen mode,
# averaging of the last 5 checkpoints, sacreBLEU (wmt14/full reference, 13a, signature) and
# tokenized compound-split BLEU on newstest2014 full.
#
# --smoke runs every stage on the offline mini data with luna_tiny for 20 updates and a
# 200-sentence test subset, from scratch in WORK (default build-wmt14-smoke), in a few minutes
# on CPU: a check that the recipe works, not a result (its BLEU is ~0).
#
# options:
#   --smoke        the quick end-to-end check (CI)
#   --mode M       train.sh's mode: 8gpu, 1gpu or cpu (default: cpu)
#   --work DIR     working folder (default: build-wmt14, or build-wmt14-smoke)
#   --build DIR    build folder (default: build in the repository)
#   --threads N    CPU threads (default: nproc)
#   --no-deps      skip tools/ci/install-deps.sh
#   -h, --help     this help
# Anything after "--" is passed to train.sh (and so to luna-train).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
die() { echo "run.sh: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

smoke=0 mode=cpu work="" build="$repo/build" threads="$(nproc 2>/dev/null || echo 2)" deps=1
extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --smoke) smoke=1; shift ;;
        --mode) need "$@"; mode="$2"; shift 2 ;;
        --work) need "$@"; work="$2"; shift 2 ;;
        --build) need "$@"; build="$2"; shift 2 ;;
        --threads) need "$@"; threads="$2"; shift 2 ;;
        --no-deps) deps=0; shift ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ -n "$work" ]] || { [[ $smoke -eq 1 ]] && work="$repo/build-wmt14-smoke" || work="$repo/build-wmt14"; }
start=$(date +%s)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"   # see train.sh / evaluate.sh
elapsed() { echo "$(( $(date +%s) - start )) s"; }

[[ $deps -eq 1 ]] && { "$repo/tools/ci/install-deps.sh" || die "tools/ci/install-deps.sh failed"; }
programs=(luna-preprocess luna-train luna-translate luna-average)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
    cmake -S "$repo" -B "$build" -DLUNA_WERROR=ON >"$build.configure.log" 2>&1 ||
        { cat "$build.configure.log" >&2; die "cmake configure failed"; }
fi
cmake --build "$build" -j"$threads" --target "${programs[@]}" >/dev/null ||
    die "building ${programs[*]} in $build failed (run cmake --build $build to see why)"

common=(--work "$work" --build "$build")
smoke_flag=()
if [[ $smoke -eq 1 ]]; then
    smoke_flag=(--smoke)
    rm -rf "$work"   # the smoke check always starts from scratch
fi
echo "=== [$(elapsed)] prepare"
"$here/prepare.sh" "${common[@]}" "${smoke_flag[@]}" --workers "$threads"
echo "=== [$(elapsed)] train"
"$here/train.sh" "${common[@]}" "${smoke_flag[@]}" --mode "$mode" --threads "$threads" -- "${extra[@]}"
echo "=== [$(elapsed)] evaluate"
"$here/evaluate.sh" "${common[@]}" "${smoke_flag[@]}" --threads "$threads"
echo "=== [$(elapsed)] done: $work (scores in $work/bleu.txt)"
