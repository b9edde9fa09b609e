#!/usr/bin/env bash
# Pack a CUDA build made on a machine without a GPU into one archive for a short device run
# (docs/gpu.md, "Checking a GPU machine"): the programs and suites that gpu-check.sh runs, the
# CTest files, the non-CUDA shared libraries they load (OpenBLAS, SentencePiece, Check's subunit,
# libgomp), optionally an earlier build's bench-model (the baseline timed in the same run) and a
# data-bin for the training step. The CUDA libraries (cudart, cuBLASLt) come from the GPU machine.
#
#   tools/ci/gpu-bundle.sh OUT.tar.xz [--build-dir DIR] [--baseline BENCH-MODEL] [--train-data DATA-BIN]
#                          [--add FILE]...
#
# --add FILE (repeatable) copies FILE into gpu-bundle/extra/ (e.g. newstest2014's test.en/test.de
# and the CPU's loss curve for tools/ci/gpu-learn.sh).
#
# xz, not gzip: every program carries the same kernel images, which gzip's 32 KiB window cannot
# see across files (a bundle of 26 programs: 61 MB as .tar.gz, 14 MB as .tar.xz).
#
# On the GPU machine, with the repository at the same absolute path as here (a symbolic link
# will do):
#   tar xJf OUT.tar.xz && export LD_LIBRARY_PATH=$PWD/gpu-bundle/lib:$LD_LIBRARY_PATH
#   tools/ci/gpu-check.sh --quick --no-build --build-dir BUILD-DIR \
#       --baseline gpu-bundle/baseline/bench-model --train-data gpu-bundle/data-bin --ncu
# Build for the GPU with -DLUNA_NATIVE=OFF: that machine's processor may lack this one's
# instructions (the CPU kernels choose their SIMD paths at run time).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
die() { echo "gpu-bundle: error: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: gpu-bundle.sh OUT.tar.xz [--build-dir DIR] [--baseline BIN] [--train-data DIR] [--add FILE]..."
case "$1" in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
out="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; shift
build="$root/build-gpu" baseline="" data="" extra=()
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value"
  case "$1" in
    --build-dir) build="$(cd "$2" && pwd)" ;;
    --baseline) baseline="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")" ;;
    --train-data) data="$(cd "$2" && pwd)" ;;
    --add) [ -f "$2" ] || die "--add $2: no such file"; extra+=("$2") ;;
    *) die "unknown option '$1'" ;;
  esac
  shift 2
done
[ -f "$build/CTestTestfile.cmake" ] || die "$build is not a configured build (no CTestTestfile.cmake)"
grep -q '^LUNA_CUDA:BOOL=ON' "$build/CMakeCache.txt" || die "$build is not a -DLUNA_CUDA=ON build"
grep -q '^LUNA_NATIVE:BOOL=OFF' "$build/CMakeCache.txt" ||
  echo "gpu-bundle: warning: $build was built with -march=native; the GPU machine's processor may lack its instructions" >&2

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu-bundle/lib"
# the executables the gpu-labelled suites and the benchmarks run, with the CTest files naming them
mapfile -t tests < <(ctest --test-dir "$build" -N -V -L gpu | sed -n 's/^[0-9]*: Test command: \([^ ]*\).*/\1/p' | sort -u)
[ "${#tests[@]}" -gt 0 ] || die "no gpu-labelled tests in $build"
files=()
for f in "${tests[@]}" "$build"/bench-model "$build"/bench-translate "$build"/luna-train \
         "$build"/luna-translate "$build"/luna-preprocess "$build"/luna-average; do
  [ -x "$f" ] || die "$f missing: build it first"
  files+=("${f#"$build"/}")
done
(cd "$build" && find . -name CTestTestfile.cmake -printf '%P\n') > "$stage/ctest-files"
mapfile -t ctest_files < "$stage/ctest-files"
# shared libraries outside the C library and the CUDA toolkit
for f in "${files[@]}"; do ldd "$build/$f"; done | awk '$3 ~ /^\// { print $3 }' | sort -u |
  grep -E 'openblas|gfortran|quadmath|gomp|sentencepiece|subunit|protobuf' |
  while read -r lib; do cp -L "$lib" "$stage/gpu-bundle/lib/"; done
if [ -n "$baseline" ]; then mkdir -p "$stage/gpu-bundle/baseline" && cp "$baseline" "$stage/gpu-bundle/baseline/"; fi
if [ -n "$data" ]; then cp -r "$data" "$stage/gpu-bundle/data-bin"; fi
if [ ${#extra[@]} -gt 0 ]; then mkdir -p "$stage/gpu-bundle/extra" && cp "${extra[@]}" "$stage/gpu-bundle/extra/"; fi
rel="$(realpath --relative-to="$root" "$build")"
# copies without symbols (smaller to carry); the device code is untouched
mkdir -p "$stage/tree/$rel"
for f in "${files[@]}" "${ctest_files[@]}"; do
  mkdir -p "$stage/tree/$rel/$(dirname "$f")" && cp "$build/$f" "$stage/tree/$rel/$f"
done
for f in "${files[@]}"; do strip --strip-unneeded "$stage/tree/$rel/$f" 2> /dev/null || true; done
XZ_OPT="-6 -T0" tar cJf "$out" -C "$stage/tree" $(printf "$rel/%s " "${files[@]}" "${ctest_files[@]}") \
  -C "$stage" gpu-bundle
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1)): ${#files[@]} programs and suites of $rel, $(ls "$stage/gpu-bundle/lib" | wc -l) libraries${baseline:+, baseline bench-model}${data:+, data-bin}${extra:+, ${#extra[@]} extra files}"
