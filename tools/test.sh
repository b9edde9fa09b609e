#!/usr/bin/env bash
# Build luna and run its test suite (CTest + Check), doing its own setup on a fresh machine.
# The options are in usage() below (tools/test.sh --help); each stage is one function, run in
# order at the end.
set -euo pipefail
usage() {
  cat <<'EOF'
usage: tools/test.sh [--sanitize] [--gpu] [--mpi] [--no-cuda-emu] [--no-mpi] [--no-deps] [-- CTEST-ARGS...]

Builds luna and runs its test suite (CTest + Check), doing its own setup on a fresh Debian
machine: installs the dependencies (tools/ci/install-deps.sh), configures build/ with -Werror, builds
and runs every CPU test. Then, where the CUDA toolkit's headers are installed, it builds the CUDA
backend against the CPU execution harness in build-emu/ (-DLUNA_CUDA_EMU=ON) and runs the op,
model and program suites on it (LUNA_TEST_BACKEND=cuda, three thread orders; label cuda-emu).
Last, the multi-rank tests (label mpi): build-mpi/ (-DLUNA_MPI=ON, with the CUDA headers also the
backend against the harness) runs mpiexec -n 2 and -n 4 luna-train against one process, on the
CPU and on --device cuda with the harness's fake NCCL. Each CTest run ends with the number of
tests that passed.

options:
  --sanitize    the same in build-asan/ with AddressSanitizer + UndefinedBehaviorSanitizer (with
                the CUDA headers, the backend's suites run there once, in forward thread order)
  --no-cuda-emu skip the build-emu/ stage
  --no-mpi      skip the build-mpi/ stage
  --gpu         a CUDA build (-DLUNA_CUDA=ON) that also runs the tests labelled gpu (needs a GPU)
  --mpi         only the build-mpi/ stage: CPU and mpi tests there
  --no-deps     skip tools/ci/install-deps.sh
  -h, --help    show this help
  -- ARGS...    pass ARGS to ctest

examples:
  tools/test.sh                              everything, from a fresh machine
  tools/test.sh --no-deps -- -R ops_softmax  one suite, dependencies already installed
  tools/test.sh --sanitize --no-deps         under ASan + UBSan, in build-asan/
EOF
}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs=$(nproc 2>/dev/null || echo 2)
deps=1 sanitize=0 gpu=0 mpi=0 cuda_emu=1 mpi_stage=1
ctest_extra=()

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --sanitize) sanitize=1 ;;
      --gpu) gpu=1 ;;
      --mpi) mpi=1 ;;
      --no-deps) deps=0 ;;
      --no-cuda-emu) cuda_emu=0 ;;
      --no-mpi) mpi_stage=0 ;;
      --) shift; ctest_extra=("$@"); break ;;
      -h|--help) usage; exit 0 ;;
      *) echo "test.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
  done
}

have_cuda_headers() { command -v nvcc > /dev/null || [ -e /usr/local/cuda/include/cublasLt.h ]; }

# The variant this run builds and tests: build folder, CMake flags, CTest labels, and whether the
# multi-rank stage follows. Sets build, cmake_flags, labels and run_mpi_stage.
choose_variant() {
  build="$root/build"
  cmake_flags=(-DLUNA_WERROR=ON)
  labels=(-L cpu)
  if [ "$sanitize" -eq 1 ]; then
    build="$root/build-asan"
    cmake_flags+=(-DLUNA_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo)
  fi
  if [ "$gpu" -eq 1 ]; then cmake_flags+=(-DLUNA_CUDA=ON); fi
  if [ "$mpi" -eq 1 ]; then
    cmake_flags+=(-DLUNA_MPI=ON)
    # Its own build folder (--sanitize --mpi: build-asan-mpi/). The mpi test sets Open MPI's
    # variables for running as root and with more ranks than cores itself (CMakeLists.txt).
    build="$build-mpi"
  fi
  # With the CUDA headers the backend is built against the harness too: under --sanitize its suites
  # run once under ASan + UBSan (forward thread order), under --mpi the multi-rank suite runs again
  # on it with the harness's fake NCCL (test_trainer_mpi_nccl_cuda_emu). A GPU build links the
  # real CUDA instead.
  if [ "$gpu" -eq 0 ] && [ "$cuda_emu" -eq 1 ] && { [ "$sanitize" -eq 1 ] || [ "$mpi" -eq 1 ]; } &&
     have_cuda_headers; then
    cmake_flags+=(-DLUNA_CUDA_EMU=ON)
  fi
  if [ "$gpu" -eq 1 ]; then
    labels=() # every label
  elif [ "$mpi" -eq 1 ]; then
    labels=(-L '^(cpu|mpi)$')
  fi
  # The default run ends with the multi-rank stage, which needs OpenMPI.
  run_mpi_stage=0
  if [ "$mpi_stage" -eq 1 ] && [ "$mpi" -eq 0 ] && [ "$sanitize" -eq 0 ] && [ "$gpu" -eq 0 ] &&
     [ ${#ctest_extra[@]} -eq 0 ]; then
    run_mpi_stage=1
  fi
}

stage_deps() {
  [ "$deps" -eq 1 ] || return 0
  if [ "$mpi" -eq 1 ] || [ "$run_mpi_stage" -eq 1 ]; then
    "$root/tools/ci/install-deps.sh" --mpi
  else
    "$root/tools/ci/install-deps.sh"
  fi
}

# Configure (printing CMake's summary of what it found) and build.
stage_build() {
  cmake -S "$root" -B "$build" "${cmake_flags[@]}" >"$build.configure.log" 2>&1 \
    || { cat "$build.configure.log"; exit 1; }
  grep -E '^-- (luna|  )' "$build.configure.log" || true
  cmake --build "$build" -j"$jobs"
}

stage_tests() {
  # GPU tests carry the label gpu: on a CPU-only run CTest reports them as not run (-L cpu), visibly.
  if [ ${#labels[@]} -gt 0 ] && [ -n "$(cd "$build" && ctest -N -L gpu 2>/dev/null | grep -E '^ +Test +#')" ]; then
    echo "note: tests labelled gpu are skipped on this CPU-only run (tools/test.sh --gpu runs them)"
  fi
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  ctest --test-dir "$build" --output-on-failure -j"$jobs" "${labels[@]}" "${ctest_extra[@]}"
}

# The CUDA backend through the CPU execution harness (tests/cuda_emu/README.md): its own build,
# since its programs and tests link the harness instead of the CUDA libraries. Only the suites that
# run on the backend (<suite>_cuda_emu_<order>) run there; build/ ran everything else.
stage_cuda_emu() {
  if [ "$cuda_emu" -eq 0 ] || [ "$build" != "$root/build" ] || [ ${#ctest_extra[@]} -gt 0 ]; then
    return 0
  fi
  if ! grep -q "CUDA harness  ON" "$build.configure.log"; then
    echo "note: no CUDA toolkit headers (cuda_runtime_api.h, cublasLt.h) found: the CUDA backend's harness suites are not run"
    return 0
  fi
  local emu="$root/build-emu"
  cmake -S "$root" -B "$emu" -DLUNA_WERROR=ON -DLUNA_CUDA_EMU=ON >"$emu.configure.log" 2>&1 \
    || { cat "$emu.configure.log"; exit 1; }
  echo "=== the CUDA backend under the CPU execution harness (build-emu/, label cuda-emu) ==="
  cmake --build "$emu" -j"$jobs"
  ctest --test-dir "$emu" --output-on-failure -j"$jobs" -L cuda-emu -R '_cuda_emu_(forward|reverse|random_7)$'
}

# Data parallelism across processes (label mpi): its own build, since MPI programs link libmpi and,
# with the CUDA headers, the backend against the harness (and its fake NCCL).
stage_mpi() {
  [ "$run_mpi_stage" -eq 1 ] || return 0
  if ! command -v mpiexec > /dev/null; then
    echo "note: no mpiexec (tools/ci/install-deps.sh --mpi installs OpenMPI): the multi-rank tests are not run"
    return 0
  fi
  echo "=== multi-rank training (build-mpi/, label mpi: MPI on CPU, NCCL on the harness) ==="
  local start extra=()
  start=$(date +%s)
  if [ "$cuda_emu" -eq 0 ]; then extra+=(--no-cuda-emu); fi
  "$root/tools/test.sh" --no-deps --mpi "${extra[@]}" -- -L mpi
  echo "multi-rank stage: $(( $(date +%s) - start )) s (build and tests)"
}

parse_args "$@"
choose_variant
stage_deps
stage_build
stage_tests
stage_cuda_emu
stage_mpi
