#!/usr/bin/env bash
# Does training on the GPU learn what the CPU learns? Two checks (issue "GPU training", item 9):
#
#   tools/ci/gpu-learn.sh --data DATA-BIN --out DIR [--build DIR] [--cpu-reference]
#                         [--cpu-losses FILE] [--minutes M] [--test-src F --test-ref F]
#
#   1. the loss curve: luna_base_tied with the WMT'14 recipe's settings (tools/scripts/recipes/
#      wmt14-en-de/train.sh) but 1,024 tokens per update, 200 updates, logged at every update.
#      --cpu-reference runs it on the CPU (fp32; ~15 minutes on 2 cores) and writes
#      DIR/losses.cpu.jsonl; on a GPU machine it runs with --device cuda (bf16) and, given
#      --cpu-losses FILE (that CPU file, made beforehand), compares the two curves with
#      tools/ci/compare_losses.py (the bound is stated there).
#   2. five minutes of training (--minutes) with the recipe's one-GPU settings (8,192 tokens x
#      update-freq 8 = 65k tokens per update) on DATA-BIN, then newstest2014 (--test-src, e.g. the
#      WMT mini's raw/test.en) translated on the GPU with beam 4, lenpen 0.6: DIR/newstest2014.hyp.de,
#      scored with sacreBLEU against --test-ref when python3 has sacrebleu (else score the file
#      on another machine: sacrebleu REF -i HYP).
# Step 2 runs only on a GPU (not with --cpu-reference). Exit status 0 when every step ran and the
# curves agree.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build-gpu" data="" out="" cpu_ref=0 cpu_losses="" minutes=5 test_src="" test_ref=""
die() { echo "gpu-learn: error: $*" >&2; exit 2; }
need() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --data) need "$@"; data="$2"; shift ;;
    --out) need "$@"; out="$2"; shift ;;
    --build) need "$@"; build="$2"; shift ;;
    --cpu-reference) cpu_ref=1 ;;
    --cpu-losses) need "$@"; cpu_losses="$2"; shift ;;
    --minutes) need "$@"; minutes="$2"; shift ;;
    --test-src) need "$@"; test_src="$2"; shift ;;
    --test-ref) need "$@"; test_ref="$2"; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
[ -n "$data" ] && [ -f "$data/dict.en.txt" ] || die "--data DATA-BIN: no dict.en.txt in '$data'"
[ -n "$out" ] || die "--out DIR is required"
[ -x "$build/luna-train" ] || die "$build/luna-train not found (--build DIR)"
mkdir -p "$out"
failed=0

# The recipe (tools/scripts/recipes/wmt14-en-de/train.sh) without its batch size and schedule
# length; the milestones lie beyond these runs.
recipe=(--arch luna_base_tied --projection-length 32 --causal-activation softplus
        --optimizer apollo --lr 0.1 --apollo-beta 0.9 --apollo-eps 1e-4
        --weight-decay 1e-8 --weight-decay-type L2 --clip-norm 0.1 --clip-mode each
        --lr-scheduler milestone --warmup-updates 1000 --warmup-init-lr 1e-5
        --milestones 300000 450000 --lr-decay-rate 0.1
        --label-smoothing 0.1 --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1
        --seed 1 --no-progress-bar)

# 1. the loss curve
if [ "$cpu_ref" -eq 1 ]; then
  device=(--device cpu --threads "$(nproc)") tag=cpu
else
  device=(--device cuda) tag=gpu
fi
log="$out/losses.$tag.jsonl"
if "$build/luna-train" "$data" "${recipe[@]}" "${device[@]}" --max-tokens 1024 --update-freq 1 \
     --max-update 200 --log-interval 1 --log-format json --disable-validation --no-save \
     --save-dir "$out/curve.ck" > "$out/curve.$tag.log" 2>&1; then
  grep '"num_updates"' "$out/curve.$tag.log" > "$log"
  echo "gpu-learn: $tag loss curve, 200 updates of 1,024 tokens: $log"
else
  echo "gpu-learn: luna-train failed ($out/curve.$tag.log)"; failed=1
fi
if [ "$cpu_ref" -eq 1 ]; then exit "$failed"; fi
if [ -n "$cpu_losses" ]; then
  python3 "$root/tools/ci/compare_losses.py" "$cpu_losses" "$log" | tee "$out/curve.compare.txt" ||
    failed=1
fi

# 2. five minutes with the one-GPU recipe, then newstest2014
ck="$out/learn.ck"
rm -rf "$ck"
timeout -s TERM "$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')" \
  "$build/luna-train" "$data" "${recipe[@]}" --device cuda --max-tokens 8192 --update-freq 8 \
  --max-update 500000 --log-interval 20 --validate-interval-updates 200 --save-dir "$ck" \
  --no-epoch-checkpoints > "$out/learn.log" 2>&1
rc=$?
if [ ! -f "$ck/checkpoint_last.safetensors" ]; then
  echo "gpu-learn: no checkpoint after $minutes minutes (luna-train exit $rc; $out/learn.log)"
  exit 1
fi
echo "gpu-learn: $minutes minutes: $(grep -o 'num_updates [0-9]*' "$out/learn.log" | tail -n 1)," \
  "last training line: $(grep '| update [0-9]' "$out/learn.log" | tail -n 1 | grep -o 'loss [0-9.]*\|wps [0-9.]*' | tr '\n' ' ')"
if [ -n "$test_src" ]; then
  hyp="$out/newstest2014.hyp.de"
  if "$build/luna-translate" "$ck/checkpoint_last.safetensors" --device cuda --input "$test_src" \
       --beam 4 --lenpen 0.6 > "$hyp" 2> "$out/translate.log"; then
    echo "gpu-learn: $(tail -n 1 "$out/translate.log")"
    if [ -n "$test_ref" ] && python3 -c "import sacrebleu" 2> /dev/null; then
      python3 -m sacrebleu "$test_ref" -i "$hyp" -b | sed 's/^/gpu-learn: sacreBLEU newstest2014: /'
    else
      echo "gpu-learn: hypotheses in $hyp (no sacrebleu here: sacrebleu REF -i HYP elsewhere)"
    fi
  else
    echo "gpu-learn: luna-translate failed ($out/translate.log)"; failed=1
  fi
fi
exit "$failed"
