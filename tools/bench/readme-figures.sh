#!/usr/bin/env bash
# Re-measure the CPU demo's figures that README.md and docs/benchmarks.md ("CPU demo") quote: run
# tools/demo.sh from scratch and print them, ready to compare with (or paste into) those tables.
#
#   tools/bench/readme-figures.sh [--minutes 15] [--quick] [--out DIR] [--no-deps] [-- demo options]
#
# Prints: the machine (cores, CPU model), the parameter count, updates reached, test sacreBLEU
# with its signature, the final validation (nll in bits per token, ppl, valid sacreBLEU), the
# demo's wall time and the disk space of its output folder and of the evaluation venv.
# --quick also runs the short demo (tools/demo.sh --minutes 3) and prints
# its figures. OUT (default build-figures in the repository) is removed first, so the run is a
# fresh one (preprocessing included); the build and the venv are reused when present.
# Takes --minutes + about 3 minutes on 2 cores (+ about 6 more with --quick).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
die() { echo "readme-figures.sh: error: $*" >&2; exit 1; }
minutes=15 quick=0 out="$repo/build-figures" deps=()
demo_extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        --minutes) [[ $# -ge 2 ]] || die "--minutes needs a value"; minutes="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        --out) [[ $# -ge 2 ]] || die "--out needs a value"; out="$2"; shift 2 ;;
        --no-deps) deps=(--no-deps); shift ;;
        --) shift; demo_extra=("$@"); break ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

# run_demo DIR MINUTES: a fresh demo run into DIR, its output kept in DIR.out; prints the figures
run_demo() {
    local dir="$1" mins="$2" log="$1.out"
    rm -rf "$dir"
    echo "readme-figures.sh: tools/demo.sh --minutes $mins --out $dir (output: $log)" >&2
    "$repo/tools/demo.sh" --minutes "$mins" --out "$dir" "${deps[@]}" "${demo_extra[@]}" >"$log" 2>&1 ||
        { tail -20 "$log" >&2; die "tools/demo.sh failed (output: $log)"; }
    local line params valid disk
    line=$(grep '^sacreBLEU on test_2016_flickr:' "$log") || die "$log: no sacreBLEU line"
    params=$(grep -oE 'num\. model params: [0-9]+' "$dir/train.log" | head -1 | grep -oE '[0-9]+$' || echo "?")
    valid=$(sed -n 's/^final validation: //p' "$log")
    disk=$(sed -n 's/^disk use: *//p' "$log")
    echo "demo --minutes $mins:"
    echo "  ${line#sacreBLEU on }"
    echo "  $(grep 'signature:' "$log" | tail -1 | sed 's/^ *//')"
    echo "  final validation: $valid"
    echo "  model parameters: $params"
    echo "  disk use: $disk"
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(date -u +%F)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (figures follow the machine's speed and load)"
run_demo "$out" "$minutes"
if [[ $quick -eq 1 ]]; then
    run_demo "$out-quick" 3
fi
