#!/usr/bin/env bash
# On a machine with a GPU: build luna with CUDA and check the CUDA backend on the real hardware,
# which CI cannot (docs/gpu.md). Prints one summary at the end; exit status 0 only when every step
# passed.
#
#   tools/ci/gpu-check.sh [--no-sanitizer] [--quick] [--build-dir DIR] [--no-build] [--no-torch]
#                         [--test-timeout S] [--train-data DATA-BIN] [--ncu] [--baseline BIN]
#
# Steps (each one summary line):
#   1. build       -DLUNA_CUDA=ON in build-gpu/ (nvcc, sm_80 + sm_90a, -Werror; -DLUNA_MPI=ON with
#                  OpenMPI: test_trainer_mpi_nccl_gpu, real NCCL between 4 GPUs); --build-dir DIR
#                  builds there instead; --no-build uses DIR as it is (e.g. built on a machine
#                  without a GPU and copied over, with its source tree at the same path)
#   2. gpu tests   ctest -L gpu (--test-timeout S: ctest --timeout): every op suite, the
#                  whole-model suite and the program suite on
#                  the CUDA backend against the CPU backend (the suites the CPU execution harness
#                  runs in CI), with the real CUDA runtime and the real cuBLASLt — so the cuBLASLt
#                  cases the fake cuBLASLt passes in CI are checked against the real library
#   2b. int8 CPU   where the host's CPU has AVX-512 VNNI: the int8 suites on the CPU backend (the
#                  VNNI kernel against the scalar and AVX2 ones) and bench-int8
#   3. sanitizer   compute-sanitizer memcheck, racecheck and synccheck over the op suites
#                  (LUNA_CUDA_CACHE=0: exact allocations, so memcheck sees each buffer's end)
#   4. benchmarks  bench-model (luna_base_tied, bf16: forward+backward and whole updates at 8k and
#                  32k target tokens, updates with and without graphs, with launches and host
#                  time per step; fp32 at 8k) next to the PyTorch reference model's AMP
#                  step at the same shapes (tests/reference/bench_reference.py --device cuda
#                  --amp bf16; where python3 has torch with CUDA, unless --no-torch),
#                  bench-model --update --profile at 32k (measured vs PREDICTED time per op
#                  family, gpu-check.profile.log), bench-translate (luna_demo preset, beam 4);
#                  PyTorch both eager and through torch.compile (where PyTorch >= 2.0);
#                  --quick: the short device run (about 8 minutes on an H100/H200 with a build made
#                  elsewhere: --no-build): compute-sanitizer (memcheck, racecheck) on the suites of
#                  the most recently rewritten kernels only, run beside the gpu tests; batches of
#                  8k and 32k target tokens, fewer steps
#                  --baseline BIN: an earlier build's bench-model, timed in the same run right
#                  after each bench-model line of this build (before/after on one GPU)
#   5. training    --train-data DATA-BIN (e.g. the WMT mini data-bin, prepared on the CPU machine):
#                  luna-train --device cuda --arch luna_base_tied, 200 updates at 8k and at 32k
#                  tokens per update (--quick: 120); the last logged wps of each
#   6. ncu         --ncu: Nsight Compute on one 32k bf16 update of bench-model, launch-limited, the
#                  kernels by time (gpu-check.ncu.log)
# Nothing here is run by CI (no GPU there); tools/test.sh --gpu runs step 2 alone.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build-gpu"
sanitizer=1
quick=0
do_build=1
torch=1
ncu=0
train_data=""
baseline=""
test_timeout=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-sanitizer) sanitizer=0 ;;
    --quick) quick=1 ;;
    --no-build) do_build=0 ;;
    --no-torch) torch=0 ;;
    --ncu) ncu=1 ;;
    --train-data)
      [ $# -ge 2 ] || { echo "gpu-check: --train-data needs a data-bin directory" >&2; exit 2; }
      train_data="$(cd "$2" && pwd)" || exit 2; shift ;;
    --baseline)
      [ $# -ge 2 ] && [ -x "$2" ] || { echo "gpu-check: --baseline needs an executable bench-model" >&2; exit 2; }
      baseline="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift ;;
    --test-timeout)
      [ $# -ge 2 ] || { echo "gpu-check: --test-timeout needs seconds" >&2; exit 2; }
      test_timeout=(--timeout "$2"); shift ;;
    --build-dir)
      [ $# -ge 2 ] || { echo "gpu-check: --build-dir needs a directory" >&2; exit 2; }
      build="$(mkdir -p "$2" && cd "$2" && pwd)"; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
jobs=$(nproc 2>/dev/null || echo 2)
[ "$jobs" -gt 8 ] && jobs=8
summary=()
failed=0
note() { summary+=("$1"); echo "gpu-check: $1"; }
fail() { note "FAIL $1"; failed=1; }

if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu-check: no GPU here (nvidia-smi -L failed); nothing to check" >&2
  exit 2
fi
note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)"

# 1. build (with MPI where OpenMPI is installed: the multi-GPU NCCL suite, skipped under 4 GPUs)
mkdir -p "$build"
mpi_flag=-DLUNA_MPI=OFF
command -v mpicc > /dev/null && mpi_flag=-DLUNA_MPI=ON
if [ "$do_build" -eq 0 ]; then
  if [ -x "$build/bench-model" ] && [ -f "$build/CTestTestfile.cmake" ]; then
    note "ok   build: using $build as it is (--no-build)"
  else
    fail "build: --no-build, but $build has no bench-model or CTestTestfile.cmake"
    printf '%s\n' "=== gpu-check summary ===" "${summary[@]}"
    exit 1
  fi
elif cmake -S "$root" -B "$build" -DLUNA_CUDA=ON "$mpi_flag" -DLUNA_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
     > "$build/gpu-check.configure.log" 2>&1 &&
   cmake --build "$build" -j"$jobs" > "$build/gpu-check.build.log" 2>&1; then
  note "ok   build (build-gpu/, logs there)"
else
  tail -n 40 "$build/gpu-check.build.log" "$build/gpu-check.configure.log" 2> /dev/null
  fail "build (see $build/gpu-check.*.log)"
  printf '%s\n' "=== gpu-check summary ===" "${summary[@]}"
  exit 1
fi

# 3. compute-sanitizer over the op suites (a function: --quick runs it beside the gpu tests)
# --quick: the suites of the kernels rewritten most recently (chunked causal contraction, fp32 tree
# column sums, full-block optimizer and clipping reductions, residual_norm's and
# bias_relu_dropout's backward with their column sums in the row pass, the gated update, the beam
# search's selection and the cache-slot table's gather, the projections of one input as one
# batched GEMM, the decoder step's products at each row's position) and the bf16 one-kernel
# attention's own suite (test_gpu_attention: the op suites run fp32 activations, which keep the
# composition); racecheck skips synccheck there.
sanitize() {
  local tools=(memcheck racecheck synccheck) suites=("$build"/test_ops_*) tool t bad slow rc
  local limit=(); [ "$quick" -eq 1 ] && limit=(timeout 100)  # a suite over it is reported, not waited for
  if [ "$quick" -eq 1 ]; then
    tools=(memcheck racecheck)
    suites=()
    for t in causal fused layer_norm linear optimizer reduce beam_select index_rows \
             linear_multi causal_step; do
      suites+=("$build/test_ops_$t")
    done
    suites+=("$build/test_gpu_attention")
  fi
  for tool in "${tools[@]}"; do
    bad=0 slow=""
    for t in "${suites[@]}"; do
      [ -x "$t" ] || continue
      LUNA_TEST_BACKEND=cuda LUNA_CUDA_CACHE=0 CK_FORK=no CK_DEFAULT_TIMEOUT=0 \
        "${limit[@]}" compute-sanitizer --tool "$tool" --error-exitcode 99 "$t" \
        > "$build/gpu-check.$tool.$(basename "$t").log" 2>&1
      rc=$?
      if [ "$rc" -eq 124 ]; then slow="$slow $(basename "$t")"
      elif [ "$rc" -ne 0 ]; then bad=$((bad + 1)); fi
    done
    if [ "$bad" -eq 0 ] && [ -z "$slow" ]; then echo "ok   compute-sanitizer $tool: clean on ${#suites[@]} op suite(s)"
    elif [ "$bad" -eq 0 ]; then echo "FAIL compute-sanitizer $tool: no errors, but over the time limit:$slow"
    else echo "FAIL compute-sanitizer $tool: $bad op suite(s) reported errors ($build/gpu-check.$tool.*.log)${slow:+; over the time limit:$slow}"; fi
  done
}
sanitizer_log="$build/gpu-check.sanitizer.summary"
rm -f "$sanitizer_log"
sanitizer_pid=""
if [ "$sanitizer" -eq 1 ] && ! command -v compute-sanitizer > /dev/null; then
  note "skip compute-sanitizer: not on PATH (it ships with the CUDA toolkit)"
  sanitizer=0
fi
if [ "$sanitizer" -eq 1 ] && [ "$quick" -eq 1 ]; then
  sanitize > "$sanitizer_log" 2>&1 &
  sanitizer_pid=$!
fi

# 2. the suites on the GPU
if ctest --test-dir "$build" -L gpu --output-on-failure -j "$jobs" "${test_timeout[@]}" > "$build/gpu-check.tests.log" 2>&1 &&
   ! grep -q 'No tests were found' "$build/gpu-check.tests.log"; then
  note "ok   gpu tests: $(grep -E 'tests passed' "$build/gpu-check.tests.log")"
else
  fail "gpu tests: $(grep -E 'tests passed|tests failed' "$build/gpu-check.tests.log" | tail -n 1) (log: $build/gpu-check.tests.log)"
fi
grep -hE '^(luna_tiny|transformer_tiny|luna-train|luna-translate|validation|bf16)' \
  "$build/gpu-check.tests.log" | sed 's/^/    /'

# 2b. the int8 CPU kernels on this machine's CPU: the AVX-512 VNNI kernel runs only where the CPU
# has it, which the development machines and CI may not; the device hosts usually do
int8_log="$build/gpu-check.int8.log"
if grep -qw avx512_vnni /proc/cpuinfo; then
  if LUNA_TEST_BACKEND=cpu "$build/test_ops_int8" > "$int8_log" 2>&1 &&
     LUNA_TEST_BACKEND=cpu "$build/test_model_int8" >> "$int8_log" 2>&1; then
    note "ok   int8 CPU kernels with AVX-512 VNNI on this host (test_ops_int8, test_model_int8): $(grep -c '100%' "$int8_log") suites passed"
  else
    fail "int8 CPU kernels on this host's VNNI ($int8_log)"
  fi
  "$build/bench-int8" --threads 1 --reps 20 >> "$int8_log" 2>&1 \
    && note "ok   bench-int8 (fp32 held, AVX2, VNNI on this host's CPU): $int8_log" \
    || fail "bench-int8 ($int8_log)"
else
  note "skip int8 VNNI kernel: this host's CPU lacks avx512_vnni"
fi

if [ "$sanitizer" -eq 1 ]; then
  if [ -n "$sanitizer_pid" ]; then wait "$sanitizer_pid"; else sanitize > "$sanitizer_log" 2>&1; fi
  while IFS= read -r line; do
    case "$line" in
      ok*) note "$line" ;;
      *) fail "${line#FAIL }" ;;
    esac
  done < "$sanitizer_log"
fi

# 4. benchmarks, measured on this GPU (docs/benchmarks.md, docs/gpu.md).
# bench-model's "target tokens/s" line and PyTorch's, at the same shapes, side by side.
if [ "$quick" -eq 1 ]; then batches="256 1024"; sentences=256; steps=5; else batches="256 1024"; sentences=512; steps=10; fi
bench() { # label, then bench-model arguments
  local label="$1"; shift
  local line
  # the tokens/s line, and the device work per step (launches, graph launches, host time)
  line=$("$build/bench-model" --device cuda --tgt-len 32 --src-len 32 "$@" 2>&1 |
         grep -E 'target tokens/s|per step on' | sed 's/^bench-model: //' | paste -sd '|' -) &&
    [[ "$line" == *"target tokens/s"* ]] && note "ok   $label: $line" || fail "$label (bench-model $*)"
  if [ -n "$baseline" ]; then
    line=$("$baseline" --device cuda --tgt-len 32 --src-len 32 "$@" 2>&1 | grep 'target tokens/s') \
      && note "ok   $label, baseline: ${line#bench-model: }" || fail "$label, baseline ($baseline $*)"
  fi
}
have_torch=0
if [ "$torch" -eq 1 ] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  have_torch=1
fi
for b in $batches; do
  bench "bench-model bf16 fwd+bwd  $b x 32" --precision bf16 --batch "$b" --warmup 2 --steps "$steps"
  # an update replays as graphs from its third step (model/seq2seq.h): warmup 3
  bench "bench-model bf16 update   $b x 32" --precision bf16 --batch "$b" --warmup 3 --steps "$steps" --update
  bench "bench-model bf16 update   $b x 32, --no-graphs" --precision bf16 --batch "$b" --warmup 3 \
    --steps "$steps" --update --no-graphs
  if [ "$have_torch" -eq 1 ]; then
    for mode in eager compile; do
      flag=(); [ "$mode" = compile ] && flag=(--compile)
      line=$(python3 "$root/tests/reference/bench_reference.py" --device cuda --amp bf16 --batch "$b" \
             --warmup 3 --steps "$steps" "${flag[@]}" 2>&1 | tail -n 1)
      case "$line" in
        loss*) note "ok   PyTorch AMP bf16 fwd+bwd $b x 32 (tests/reference, $mode): $line" ;;
        *) fail "PyTorch AMP reference $b x 32 ($mode): $line" ;;
      esac
    done
  fi
done
[ "$have_torch" -eq 1 ] || note "skip PyTorch AMP reference: python3 has no torch with CUDA (or --no-torch)"
bench "bench-model fp32 fwd+bwd  ${batches%% *} x 32" --precision fp32 --batch "${batches%% *}" --warmup 2 --steps "$steps"
# The op-cost profile of a whole bf16 update on this GPU: each family's measured time next to the
# roofline's PREDICTED one (model/profile/op_report.h), to calibrate the cost model.
pbatch="${batches##* }"
if "$build/bench-model" --device cuda --precision bf16 --batch "$pbatch" --tgt-len 32 \
     --src-len 32 --warmup 1 --steps 1 --update --profile > "$build/gpu-check.profile.log" 2>&1; then
  note "ok   bench-model --update --profile bf16 $pbatch x 32 (measured vs PREDICTED per op family): $build/gpu-check.profile.log"
else
  fail "bench-model --update --profile ($build/gpu-check.profile.log)"
fi
if [ -n "$baseline" ]; then
  "$baseline" --device cuda --precision bf16 --batch "$pbatch" --tgt-len 32 --src-len 32 --warmup 1 \
    --steps 1 --update --profile > "$build/gpu-check.profile.baseline.log" 2>&1 \
    && note "ok   baseline bench-model --update --profile: $build/gpu-check.profile.baseline.log" \
    || fail "baseline bench-model --update --profile ($build/gpu-check.profile.baseline.log)"
fi
# the summary line and, before it, the launches, GEMMs and host waits per decoder step
line=$("$build/bench-translate" --preset luna_demo --device cuda --sentences "$sentences" \
       --max-len-b 40 2>&1 | tail -n 2 | paste -sd '|') \
  && note "ok   bench-translate luna_demo beam 4 (random weights, 40 tokens): $line" \
  || fail "bench-translate"
# Where a decoding step's time goes on the device (each op synchronised: the ops' sum against the
# wall time above shows how much the host-side beam loop costs).
if "$build/bench-translate" --preset luna_demo --device cuda --sentences "$sentences" \
     --max-len-b 40 --profile > "$build/gpu-check.translate-profile.log" 2>&1; then
  note "ok   bench-translate --profile (per op family): $build/gpu-check.translate-profile.log"
else
  fail "bench-translate --profile ($build/gpu-check.translate-profile.log)"
fi

# 5. luna-train on real data (tokens per second as it logs them)
train_updates=200; [ "$quick" -eq 1 ] && train_updates=120
if [ -n "$train_data" ]; then
  for tokens in 8192 32768; do
    log="$build/gpu-check.train.$tokens.log"
    rm -rf "$build/gpu-check.train.ck"
    if "$build/luna-train" "$train_data" --device cuda --arch luna_base_tied --share-all-embeddings \
         --optimizer apollo --lr 0.01 --lr-scheduler inverse_sqrt --warmup-updates 50 \
         --max-tokens "$tokens" --max-update "$train_updates" --dropout 0.1 --label-smoothing 0.1 \
         --log-interval 20 --no-progress-bar --no-save --save-dir "$build/gpu-check.train.ck" \
         > "$log" 2>&1; then
      note "ok   luna-train cuda bf16 luna_base_tied $tokens tokens/update, $train_updates updates: $(grep '| update [0-9]' "$log" | grep -o 'wps [0-9.]*' | tail -n 1) ($log)"
    else
      fail "luna-train --device cuda ($log: $(tail -n 1 "$log"))"
    fi
  done
fi

# 6. Nsight Compute: the kernels of one 32k update, by time
if [ "$ncu" -eq 1 ]; then
  if command -v ncu > /dev/null; then
    # a time limit: an unfiltered replay once hung until the device run's own limit
    if timeout 150 ncu --clock-control none --launch-skip 0 --launch-count 400 --section SpeedOfLight --csv \
         "$build/bench-model" --device cuda --precision bf16 --batch 1024 --tgt-len 32 --src-len 32 \
         --warmup 0 --steps 1 --update > "$build/gpu-check.ncu.log" 2>&1; then
      note "ok   ncu: 400 launches of a 32k update ($build/gpu-check.ncu.log)"
    else
      fail "ncu ($build/gpu-check.ncu.log)"
    fi
  else
    note "skip ncu: not on PATH"
  fi
fi

printf '%s\n' "=== gpu-check summary ===" "${summary[@]}"
exit "$failed"
