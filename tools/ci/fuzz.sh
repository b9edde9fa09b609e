#!/usr/bin/env bash
# Build the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, ASan and UBSan in build-fuzz/ and
# run each for a while from its committed seed corpus (tests/fuzz/corpus/<target>/).
#
#   tools/ci/fuzz.sh               every target for 60 s (CI: --seconds 20)
#   tools/ci/fuzz.sh --seconds N   every target for N seconds
#   tools/ci/fuzz.sh --runs N      every target for N executions instead (a long run: --runs 10000000)
#   tools/ci/fuzz.sh --only NAME   just that target (e.g. --only fuzz_json)
# Each input must finish within 1 s (-timeout=1) and leak nothing (-detect_leaks=1). New inputs
# found go to build-fuzz/corpus/<target>/ (not committed); a crash, hang or leak stops the run
# with its reproducer in build-fuzz/artifacts/ and a non-zero exit status. Needs clang:
# tools/ci/install-deps.sh --fuzz.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build-fuzz"
seconds=60
runs=""
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift ;;
    --runs) runs="$2"; shift ;;
    --only) only="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
command -v clang >/dev/null || { echo "fuzz.sh: clang not found (tools/ci/install-deps.sh --fuzz)" >&2; exit 1; }
targets=()
for src in "$root"/tests/fuzz/fuzz_*.c; do
  name="$(basename "$src" .c)"
  if [ -z "$only" ] || [ "$only" = "$name" ]; then targets+=("$name"); fi
done
[ ${#targets[@]} -gt 0 ] || { echo "fuzz.sh: no target '$only'" >&2; exit 2; }
# No -Werror: clang warns about OpenMP simd loops in the kernels that GCC vectorises.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DLUNA_FUZZ=ON -DLUNA_BUILD_TESTS=OFF \
  -DLUNA_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}"
mkdir -p "$build/artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
limit=(-max_total_time="$seconds")
[ -n "$runs" ] && limit=(-runs="$runs")
status=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  echo "=== $t (${runs:+$runs runs}${runs:-$seconds s}) ==="
  # One process, one job: the inputs of the committed seed corpus are read, never written.
  if ! "$build/$t" -timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=1024 -detect_leaks=1 \
      -print_final_stats=1 "${limit[@]}" -artifact_prefix="$build/artifacts/$t-" \
      "$corpus" "$root/tests/fuzz/corpus/$t" 2>"$build/$t.log"; then
    tail -40 "$build/$t.log"
    echo "fuzz.sh: $t FAILED (log $build/$t.log, reproducer in $build/artifacts/)" >&2
    status=1
  else
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^#[0-9]+ +DONE' "$build/$t.log" || true
  fi
done
exit $status
