#!/usr/bin/env bash
# WMT'14 English->German, step 2: train Luna with the paper's recipe (../shared/spec/recipe-wmt14.md).
#
#   tools/scripts/recipes/wmt14-en-de/train.sh [--mode 8gpu|1gpu|cpu] [--work DIR] [--smoke] [-- luna-train options]
#
# The recipe: luna_base_tied (l 32, softplus), Apollo lr 0.1 (β 0.9, ε 1e-4, L2 weight decay
# 1e-8, per-tensor clip 0.1), milestone schedule (warmup 1000 updates from 1e-5, ×0.1 at 300k and
# 450k, 500k updates), label smoothing 0.1, dropout/attention/activation dropout 0.1, about
# 65k target tokens per update, a checkpoint every 5000 updates (the last 5 are kept for averaging).
# Modes (the batch is the same in all three: 8 × 8192 tokens per update):
#   8gpu  the paper's command: 8 ranks (mpirun -np 8), --device cuda --max-tokens 8192 --update-freq 1
#   1gpu  one GPU: --device cuda --max-tokens 8192 --update-freq 8
#   cpu   the CPU fallback: --device cpu --threads N --max-tokens 4096 --update-freq 16 (the same
#         optimisation; luna_base_tied trains at a few hundred target tokens/s on 2 cores, minutes
#         per update (docs/benchmarks.md), so pass -- --max-update N for a bounded run)
# The GPU modes need a luna-train built with -DLUNA_CUDA=ON (8gpu also -DLUNA_MPI=ON and mpirun);
# luna-train says so clearly when it was not. Running the same command again resumes from
# WORK/checkpoints/checkpoint_last.
# --smoke: luna_tiny, 20 updates, a checkpoint every 4 (CPU, a few seconds), for CI.
#
# options:
#   --mode M       8gpu, 1gpu or cpu (default: cpu)
#   --work DIR     working folder of prepare.sh (default: build-wmt14; --smoke: build-wmt14-smoke)
#   --threads N    CPU threads in cpu mode (default: nproc)
#   --build DIR    folder with luna-train (default: build in the repository, else PATH)
#   --dry-run      print the command instead of running it
#   --smoke        the quick CI variant
#   -h, --help     this help
# Anything after "--" is appended to the luna-train command line (later flags win).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
die() { echo "train.sh: error: $*" >&2; exit 1; }
say() { echo "train.sh: $*"; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

mode=cpu work="" threads="$(nproc 2>/dev/null || echo 2)" build="$repo/build" dry=0 smoke=0
extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --mode) need "$@"; mode="$2"; shift 2 ;;
        --work) need "$@"; work="$2"; shift 2 ;;
        --threads) need "$@"; threads="$2"; shift 2 ;;
        --build) need "$@"; build="$2"; shift 2 ;;
        --dry-run) dry=1; shift ;;
        --smoke) smoke=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ -n "$work" ]] || { [[ $smoke -eq 1 ]] && work="$repo/build-wmt14-smoke" || work="$repo/build-wmt14"; }
case "$mode" in 8gpu|1gpu|cpu) ;; *) die "--mode must be 8gpu, 1gpu or cpu, got '$mode'" ;; esac
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer, got '$threads'"
train="$build/luna-train"
[[ -x "$train" ]] || train="$(command -v luna-train || true)"
[[ -n "$train" && -x "$train" ]] ||
    die "luna-train not found in $build or on PATH: build it (cmake --build build) or give --build DIR"
[[ $dry -eq 1 || -f "$work/data-bin/dict.en.txt" ]] ||
    die "$work/data-bin/dict.en.txt not found: run prepare.sh$([[ $smoke -eq 0 ]] || echo ' --smoke') first (or give --work DIR)"

args=(
    "$work/data-bin" --arch luna_base_tied --projection-length 32 --causal-activation softplus
    --optimizer apollo --lr 0.1 --apollo-beta 0.9 --apollo-eps 1e-4
    --weight-decay 1e-8 --weight-decay-type L2 --clip-norm 0.1 --clip-mode each
    --lr-scheduler milestone --warmup-updates 1000 --warmup-init-lr 1e-5
    --milestones 300000 450000 --lr-decay-rate 0.1 --max-update 500000
    --label-smoothing 0.1 --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1
    --save-dir "$work/checkpoints" --save-interval-updates 5000 --keep-interval-updates 5
    --keep-last-epochs 5 --validate-interval-updates 5000
    --seed 1 --log-interval 100
)
launcher=()
case "$mode" in
    8gpu) launcher=(mpirun -np 8); args+=(--device cuda --max-tokens 8192 --update-freq 1) ;;
    1gpu) args+=(--device cuda --max-tokens 8192 --update-freq 8) ;;
    cpu)  args+=(--device cpu --threads "$threads" --max-tokens 4096 --update-freq 16) ;;
esac
if [[ $smoke -eq 1 ]]; then   # later flags win: a tiny model, a few updates, frequent checkpoints
    launcher=()
    args+=(--device cpu --threads "$threads" --arch luna_tiny --projection-length 8
           --max-tokens 2048 --update-freq 1 --warmup-updates 5 --max-update 20
           --save-interval-updates 4 --validate-interval-updates 10 --log-interval 5
           --max-source-positions 128 --max-target-positions 128 --no-progress-bar)
fi
args+=("${extra[@]}")
if [[ $dry -eq 1 ]]; then
    printf '%q ' "${launcher[@]}" "$train" "${args[@]}"; echo
    exit 0
fi
[[ "$mode" != 8gpu || $smoke -eq 1 ]] || command -v mpirun >/dev/null ||
    die "mpirun not found: the 8-GPU mode runs 8 ranks with MPI (tools/ci/install-deps.sh --mpi; configure with -DLUNA_MPI=ON -DLUNA_CUDA=ON)"
mkdir -p "$work/checkpoints"
say "mode $mode$([[ $smoke -eq 1 ]] && echo ' (smoke)'), log: $work/train.log"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
echo "# $(date -u +%FT%TZ) ${launcher[*]} $train ${args[*]}" >>"$work/train.log"
"${launcher[@]}" "$train" "${args[@]}" 2>&1 | tee -a "$work/train.log" ||
    die "luna-train failed (log: $work/train.log)"
say "done: checkpoints in $work/checkpoints"
