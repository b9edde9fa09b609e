#!/usr/bin/env bash
# CPU demo: train a small Luna English->German model on Multi30k and really translate with it.
#
#   tools/demo.sh [--data DIR] [--minutes 15] [--threads 2] [--out DIR] [options]
#
# On a fresh machine it does its own setup: tools/ci/install-deps.sh (apt), a build of the programs
# in build/ (cmake, -Werror), and a Python venv with sacreBLEU and matplotlib (PyPI; shared with
# tools/scripts/evaluate.sh: build-eval/.venv-eval, or $LUNA_EVAL_VENV). Then:
#   1. preprocess Multi30k (29k short caption pairs) with a joint 8000-piece SentencePiece BPE;
#   2. train the luna_demo model (Luna, d 256, FFN 1024, 3+3 layers, 4 heads, l 16, 8.1M
#      parameters; Adam lr 1e-3, inverse_sqrt, 200 warmup updates, ~1500-token batches) for
#      --minutes of wall time (luna-train is stopped with SIGTERM: it finishes the update, writes
#      checkpoint_last and exits 0), saving a checkpoint every 100 updates, validating every 200;
#   3. average checkpoint_last with the two newest of those checkpoints (luna-average): the
#      model still improves quickly at the end of a short run, so only the last ~250 updates;
#   4. final validation of that checkpoint on val: nll (base 2 per token, unsmoothed) and ppl from
#      luna-translate --score-reference, and sacreBLEU of its translations;
#   5. translate test_2016_flickr.en (beam 4, lenpen 0.6: luna-translate's defaults; length at
#      most 1.5 x source + 10) and score it against test_2016_flickr.de with sacreBLEU (printed
#      with its signature), show a few examples;
#   6. plot the learning curve (train and valid nll vs updates, the final validation, valid and
#      test BLEU) to OUT/learning_curve.png; print the disk space OUT takes.
# Takes about --minutes + 2 minutes on 2 cores (+ the build and pip installs on a fresh machine).
# Running it again with the same --out resumes training from OUT/checkpoints/checkpoint_last
# for another --minutes; rm -rf OUT to start over.
#
# options:
#   --data DIR         Multi30k folder with train/val/test_2016_flickr .en/.de
#                      (default: ../shared/data/multi30k beside the repository)
#   --minutes M        training wall time in minutes (default 15; fractions allowed, e.g. 0.5)
#   --threads N        CPU threads for training and translation (default 2)
#   --out DIR          output folder (default: build-demo in the repository)
#   --build DIR        build folder with the programs (default: build in the repository)
#   --max-update N     also stop after N updates (default: no limit, only the time bound)
#   --beam N           beam size (default 4)       --lenpen F  length penalty (default 0.6)
#                      (the defaults are luna-translate's; the demo also bounds the length:
#                      --max-len-a 1.5 --max-len-b 10, and prints the full command at the end)
#   --no-deps          skip tools/ci/install-deps.sh
#   -h, --help         this help
# Anything after "--" is passed to luna-train (e.g. -- --max-tokens 2000 --dropout 0.2).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "demo.sh: error: $*" >&2; exit 1; }
say() { echo "demo.sh: $*"; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

data="$(dirname "$repo")/shared/data/multi30k"
minutes=15 threads=2 out="$repo/build-demo" build="$repo/build" max_update="" beam=4 lenpen=0.6 deps=1
train_extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --data) need "$@"; data="$2"; shift 2 ;;
        --minutes) need "$@"; minutes="$2"; shift 2 ;;
        --threads) need "$@"; threads="$2"; shift 2 ;;
        --out) need "$@"; out="$2"; shift 2 ;;
        --build) need "$@"; build="$2"; shift 2 ;;
        --max-update) need "$@"; max_update="$2"; shift 2 ;;
        --beam) need "$@"; beam="$2"; shift 2 ;;
        --lenpen) need "$@"; lenpen="$2"; shift 2 ;;
        --no-deps) deps=0; shift ;;
        --) shift; train_extra=("$@"); break ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
if ! [[ "$minutes" =~ ^[0-9]+([.][0-9]+)?$ ]] || ! awk "BEGIN{exit !($minutes > 0)}"; then
    die "--minutes must be a positive number, got '$minutes'"
fi
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer, got '$threads'"
[[ -z "$max_update" || "$max_update" =~ ^[1-9][0-9]*$ ]] || die "--max-update must be a positive integer, got '$max_update'"
[[ "$beam" =~ ^[1-9][0-9]*$ ]] || die "--beam must be a positive integer, got '$beam'"
train_seconds=$(awk "BEGIN{printf \"%d\", $minutes * 60 + 0.5}")

t_start=$(date +%s)
stage_t=$t_start
stage() { local now; now=$(date +%s); say "[$(( now - t_start )) s] $*"; stage_t=$now; }

# ---- 0. setup ----------------------------------------------------------------------------------
for f in train val test_2016_flickr; do
    for l in en de; do
        [[ -f "$data/$f.$l" ]] || die "$data/$f.$l not found: give the Multi30k folder with --data DIR (train, val and test_2016_flickr .en/.de)"
    done
done
data="$(cd "$data" && pwd)"
stage "setup: dependencies, build, Python venv"
if [[ $deps -eq 1 ]]; then
    "$repo/tools/ci/install-deps.sh" || die "tools/ci/install-deps.sh failed (run it by hand to see why, or pass --no-deps)"
fi
programs=(luna-preprocess luna-train luna-translate luna-average)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
    say "configuring $build"
    cmake -S "$repo" -B "$build" -DLUNA_WERROR=ON >"$build.configure.log" 2>&1 ||
        { cat "$build.configure.log" >&2; die "cmake configure failed (log: $build.configure.log)"; }
fi
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target "${programs[@]}" >"$out.build.log" 2>&1 ||
    { tail -40 "$out.build.log" >&2; die "build failed (log: $out.build.log)"; }
rm -f "$out.build.log"
for p in "${programs[@]}"; do [[ -x "$build/$p" ]] || die "$build/$p missing after the build"; done

venv="${LUNA_EVAL_VENV:-$repo/build-eval/.venv-eval}"
if [[ ! -x "$venv/bin/python" ]]; then
    say "creating $venv"
    python3 -m venv "$venv" || die "python3 -m venv $venv failed (install python3-venv)"
fi
if ! "$venv/bin/python" -c "import sacrebleu, sacremoses, matplotlib" 2>/dev/null; then
    say "installing sacrebleu, sacremoses, matplotlib into $venv (PyPI)"
    "$venv/bin/pip" install --quiet sacrebleu sacremoses matplotlib ||
        die "pip install sacrebleu sacremoses matplotlib failed (no network? point LUNA_EVAL_VENV at a venv that has them)"
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="$out/data-bin" ckpts="$out/checkpoints" log="$out/train.log"

# ---- 1. preprocess -----------------------------------------------------------------------------
if [[ -f "$bin/spm.model" && -f "$bin/test.en-de.de.idx" && -f "$bin/train.en-de.en.idx" ]]; then
    stage "preprocess: reusing $bin"
else
    stage "preprocess: Multi30k from $data, joint BPE 8000 -> $bin"
    "$build/luna-preprocess" --source-lang en --target-lang de \
        --trainpref "$data/train" --validpref "$data/val" --testpref "$data/test_2016_flickr" \
        --destdir "$bin" --joined-dictionary --bpe-vocab-size 8000 --workers "$threads" --skip-empty \
        >"$out/preprocess.log" 2>&1 || { cat "$out/preprocess.log" >&2; die "luna-preprocess failed"; }
    grep -E 'train|dictionary' "$out/preprocess.log" | sed 's/^/  /'
fi

# ---- 2. train ----------------------------------------------------------------------------------
train_args=(
    "$bin" --arch luna_demo
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3
    --lr-scheduler inverse_sqrt --warmup-updates 200 --warmup-init-lr 1e-7
    --max-tokens 1500 --dropout 0.1 --label-smoothing 0.1
    --save-dir "$ckpts" --save-interval-updates 100 --keep-interval-updates 3 --no-epoch-checkpoints
    --validate-interval-updates 200
    --threads "$threads" --seed 1 --log-interval 25 --log-format json --no-progress-bar
)
[[ -n "$max_update" ]] && train_args+=(--max-update "$max_update")
train_args+=("${train_extra[@]}")
if [[ -f "$ckpts/checkpoint_last.safetensors" ]]; then
    stage "train: resuming from $ckpts/checkpoint_last.safetensors for $minutes more minute(s) (rm -rf $out to start over)"
else
    stage "train: luna_demo for $minutes minute(s) of wall time on $threads thread(s) (log: $log)"
fi
mkdir -p "$ckpts"
echo "# $(date -u +%FT%TZ) $build/luna-train ${train_args[*]}" >>"$log"
# OpenMP threads that spin while waiting are a little faster on an idle machine but many times
# slower when other programs want the cores (docs/benchmarks.md): spin only when the CPUs are idle
# now (busy < 15% over 2 s).
cpu_busy_percent() {
    local a b
    read -r -a a < /proc/stat 2>/dev/null || { echo 100; return; }
    sleep 2
    read -r -a b < /proc/stat || { echo 100; return; }
    awk -v u=$(( b[1] + b[2] + b[3] + b[6] + b[7] - a[1] - a[2] - a[3] - a[6] - a[7] )) \
        -v i=$(( b[4] + b[5] - a[4] - a[5] )) 'BEGIN{printf "%d", (u + i > 0 ? 100 * u / (u + i) : 100)}'
}
if [[ -z "${OMP_WAIT_POLICY:-}" ]]; then
    busy=$(cpu_busy_percent)
    if [[ $busy -lt 15 ]]; then train_wait=ACTIVE; else train_wait=PASSIVE; fi
    say "CPUs ${busy}% busy with other work: OMP_WAIT_POLICY=$train_wait for training"
else
    train_wait="$OMP_WAIT_POLICY"
fi
rc=0
# SIGTERM after the time bound: luna-train finishes the update, saves checkpoint_last, exits 0.
# If it has not exited 120 s later, it is killed (that would be a bug: then rc is 137).
OMP_WAIT_POLICY="$train_wait" timeout --preserve-status -s TERM -k 120 "$train_seconds" \
    "$build/luna-train" "${train_args[@]}" >>"$log" 2>&1 &
train_pid=$!
trap 'kill -TERM $train_pid 2>/dev/null || true' INT TERM
# progress: one line per validation
last_shown=0
while kill -0 $train_pid 2>/dev/null; do
    sleep 5
    n=$(grep -c '"valid_loss"' "$log" || true)
    if [[ $n -gt $last_shown ]]; then
        grep '"valid_loss"' "$log" | tail -n $(( n - last_shown )) | awk -v t="$(( $(date +%s) - stage_t ))" '
            function field(k) { return match($0, "\"" k "\":[-0-9.eE+]+") ? substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3) : "?" }
            { printf "  update %d: valid loss %.3f, ppl %.1f  (%d s into training)\n", field("valid_num_updates"), field("valid_loss"), field("valid_ppl"), t }'
        last_shown=$n
    fi
done
wait $train_pid || rc=$?
trap - INT TERM
if [[ $rc -ne 0 ]]; then
    tail -20 "$log" >&2
    die "luna-train exited with status $rc (log: $log)"
fi
grep -E '^\| done training|^\| saved checkpoint_last' "$log" | tail -2 | sed 's/^/  /'
updates=$(grep -oE '@ [0-9]+ updates' "$log" | tail -1 | grep -oE '[0-9]+' || true)
[[ -f "$ckpts/checkpoint_last.safetensors" ]] || die "no $ckpts/checkpoint_last.safetensors after training (log: $log)"

# ---- 3. checkpoint ----------------------------------------------------------------------------
# checkpoint_<epoch>_<update>, newest first; checkpoint_last joins them unless it is the newest one
mapfile -t interval_ckpts < <(find "$ckpts" -maxdepth 1 -regextype posix-extended \
                              -regex '.*/checkpoint_[0-9]+_[0-9]+\.safetensors' -printf '%f\n' | sort -t_ -k3,3nr)
avg_inputs=()
newest_update=""
[[ ${#interval_ckpts[@]} -gt 0 ]] && newest_update=$(echo "${interval_ckpts[0]}" | grep -oE '[0-9]+\.safetensors$' | grep -oE '^[0-9]+')
[[ "$newest_update" == "$updates" ]] || avg_inputs+=("$ckpts/checkpoint_last.safetensors")
for c in "${interval_ckpts[@]}"; do
    if [[ ${#avg_inputs[@]} -lt 3 ]]; then avg_inputs+=("$ckpts/$c"); fi
done
if [[ ${#avg_inputs[@]} -ge 2 ]]; then
    stage "average: ${#avg_inputs[@]} checkpoints (checkpoint_last and the newest update checkpoints) -> $out/checkpoint_avg.safetensors"
    "$build/luna-average" --inputs "${avg_inputs[@]}" --output "$out/checkpoint_avg.safetensors" 2>&1 | sed 's/^/  /' ||
        die "luna-average failed"
    final="$out/checkpoint_avg.safetensors"
else
    stage "average: too few checkpoints (short run): using checkpoint_last"
    final="$ckpts/checkpoint_last.safetensors"
fi

# ---- 4. final validation (passive OpenMP waiting: see above) ------------------------------------
# The scoring settings, used for val and test and printed with the command at the end.
search=(--beam "$beam" --lenpen "$lenpen" --max-len-a 1.5 --max-len-b 10)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
stage "final validation: $(basename "$final") on $data/val (nll by --score-reference, sacreBLEU)"
"$build/luna-translate" "$final" --input "$data/val.en" --score-reference --reference "$data/val.de" \
    --output-format fairseq --threads "$threads" --quiet >"$out/val.scores" 2>"$out/val.log" ||
    { cat "$out/val.log" >&2; die "scoring the validation set failed"; }
# P-i lines: per-token log2 probabilities of the reference (</s> included): nll = -mean
read -r valid_nll valid_tokens < <(awk -F'\t' '$1 ~ /^P-/ { n = split($2, a, " "); for (i = 1; i <= n; i++) s -= a[i]; t += n }
    END { if (t > 0) printf "%.4f %d\n", s / t, t; else print "nan 0" }' "$out/val.scores")
valid_ppl=$(awk -v n="$valid_nll" 'BEGIN { printf "%.2f", 2 ^ n }')
"$repo/tools/scripts/evaluate.sh" "$final" --src "$data/val.en" --ref "$data/val.de" \
    --output "$out/val.hyp.de" --venv "$venv" --translate "$build/luna-translate" \
    -- "${search[@]}" --threads "$threads" >"$out/val.bleu.txt" 2>>"$out/val.log" ||
    { cat "$out/val.log" "$out/val.bleu.txt" >&2; die "translating or scoring the validation set failed"; }
valid_bleu=$(sed -n 's/^sacreBLEU: //p' "$out/val.bleu.txt")
say "  valid nll $valid_nll bits/token (ppl $valid_ppl, $valid_tokens tokens), valid sacreBLEU $valid_bleu"

# ---- 5. translate and score ----------------------------------------------------------------------
stage "translate: $data/test_2016_flickr.en (1000 sentences, ${search[*]}) and score"
hyp="$out/test_2016_flickr.hyp.de"
"$repo/tools/scripts/evaluate.sh" "$final" --src "$data/test_2016_flickr.en" --ref "$data/test_2016_flickr.de" \
    --output "$hyp" --venv "$venv" --translate "$build/luna-translate" \
    -- "${search[@]}" --threads "$threads" \
    >"$out/bleu.txt" 2>"$out/translate.log" || { cat "$out/translate.log" "$out/bleu.txt" >&2; die "translation or scoring failed"; }
sed 's/^/  /' "$out/translate.log" | grep -v '^  *$' || true
sed 's/^/  /' "$out/bleu.txt"

echo
echo "examples (test_2016_flickr):"
for i in 1 17 118 512 977; do
    echo "  source:     $(sed -n "${i}p" "$data/test_2016_flickr.en")"
    echo "  reference:  $(sed -n "${i}p" "$data/test_2016_flickr.de")"
    echo "  hypothesis: $(sed -n "${i}p" "$hyp")"
    echo
done

# ---- 6. learning curve -------------------------------------------------------------------------
plot="$out/learning_curve.png"
bleu=$(sed -n 's/^sacreBLEU: //p' "$out/bleu.txt")
if grep -qE '"(valid_)?loss"' "$log"; then
    stage "plot: learning curve"
    "$venv/bin/python" "$repo/tools/scripts/eval/plot_curve.py" "$log" --output "$plot" --nll \
        --final "${updates:-0}:$valid_nll" --bleu "valid:${updates:-0}:$valid_bleu" --bleu "test:${updates:-0}:$bleu" \
        --title "luna_demo on Multi30k: $updates updates, $minutes min on $threads thread(s)" | sed 's/^/  /'
else
    stage "plot: skipped, the run was too short to log any loss (every 25 updates)"
    plot="(none: run longer)"
fi

stage "done"
echo
echo "sacreBLEU on test_2016_flickr: $bleu ($updates updates, whole demo $(( $(date +%s) - t_start )) s)"
echo "  $(grep 'signature:' "$out/bleu.txt" | sed 's/^ *//')"
echo "final validation: nll $valid_nll bits/token (ppl $valid_ppl), sacreBLEU $valid_bleu on val"
echo "checkpoint:      $final"
echo "                 (translate your own sentences with the demo's settings: echo 'A dog runs on the beach.' | $build/luna-translate $final ${search[*]})"
echo "translations:    $hyp"
echo "learning curve:  $plot"
echo "training log:    $log"
echo "disk use:        $(du -sh "$out" | cut -f1) in $out (data-bin $(du -sh "$bin" | cut -f1), checkpoints $(du -sh "$ckpts" | cut -f1)); the evaluation venv $(du -sh "$venv" 2>/dev/null | cut -f1) in $venv"
