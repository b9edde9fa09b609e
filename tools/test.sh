#!/usr/bin/env bash
# Build luna and run its test suite (CTest + Check), doing its own setup on a fresh machine.
# The options are in usage() below (tools/test.sh --help).
set -euo pipefail
usage() {
  cat <<'EOF'
usage: tools/test.sh [--sanitize] [--gpu] [--mpi] [--no-deps] [-- CTEST-ARGS...]

Builds luna and runs its test suite (CTest + Check), doing its own setup on a fresh Debian
machine: installs the dependencies (tools/install-deps.sh), configures build/ with -Werror, builds
and runs every CPU test. The last line reports the number of tests that passed.

options:
  --sanitize    the same in build-asan/ with AddressSanitizer + UndefinedBehaviorSanitizer
  --gpu         a CUDA build (-DLUNA_CUDA=ON) that also runs the tests labelled gpu (needs a GPU)
  --mpi         build with -DLUNA_MPI=ON in build-mpi/ (OpenMPI from install-deps.sh --mpi) and
                also run the tests labelled mpi (mpiexec -n 2 luna-train)
  --no-deps     skip tools/install-deps.sh
  -h, --help    show this help
  -- ARGS...    pass ARGS to ctest

examples:
  tools/test.sh                              everything, from a fresh machine
  tools/test.sh --no-deps -- -R ops_softmax  one suite, dependencies already installed
  tools/test.sh --sanitize --no-deps         under ASan + UBSan, in build-asan/
EOF
}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
cmake_flags=(-DLUNA_WERROR=ON)
labels=(-L cpu)
deps=1
mpi=0
gpu=0
ctest_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) build="$root/build-asan"; cmake_flags+=(-DLUNA_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
    --gpu) cmake_flags+=(-DLUNA_CUDA=ON); gpu=1 ;;
    --mpi) cmake_flags+=(-DLUNA_MPI=ON); mpi=1 ;;
    --no-deps) deps=0 ;;
    --) shift; ctest_extra=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "test.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$gpu" -eq 1 ]; then
  labels=() # every label
elif [ "$mpi" -eq 1 ]; then
  labels=(-L '^(cpu|mpi)$')
fi
# Its own build folder (--sanitize --mpi: build-asan-mpi/). The mpi test sets Open MPI's variables
# for running as root and with more ranks than cores itself (CMakeLists.txt).
[ "$mpi" -eq 1 ] && build="$build-mpi"
if [ "$deps" -eq 1 ]; then
  if [ "$mpi" -eq 1 ]; then "$root/tools/install-deps.sh" --mpi; else "$root/tools/install-deps.sh"; fi
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$root" -B "$build" "${cmake_flags[@]}" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
grep -E '^-- (luna|  )' "$build.configure.log" || true
cmake --build "$build" -j"$jobs"
# GPU tests carry the label gpu: on a CPU-only run CTest reports them as not run (-L cpu), visibly.
if [ ${#labels[@]} -gt 0 ] && [ -n "$(cd "$build" && ctest -N -L gpu 2>/dev/null | grep -E '^ +Test +#')" ]; then
  echo "note: tests labelled gpu are skipped on this CPU-only run (tools/test.sh --gpu runs them)"
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "$build" --output-on-failure -j"$jobs" "${labels[@]}" "${ctest_extra[@]}"
