#!/usr/bin/env bash
# GPU decoding side by side (docs/gpu.md, "Decoding"): bench-translate on random transformer_base
# and luna_base_tied models (d 512, 6+6, V 32,000) against Hugging Face `generate` on a
# Marian-style model of the transformer's size (tools/bench/hf_generate.py), beam 4, the same
# sentences of one source length and a fixed output length (min = max: every program runs the
# same number of decoder steps), fp32 and bf16; then where a bf16 transformer step's time goes
# (bench-translate --profile, each op synchronised).
#
#   tools/ci/gpu-decode.sh [--build-dir build] [--sentences 3000] [--src-len 27] [--tgt-len 28]
#                          [--batch-size 128] [--quick] [--no-hf]
#
# --quick: 512 sentences. Prints one line per run and a table (also written to
# $OUT/gpu-decode.md when OUT is set, as on the device machine). Needs a CUDA build; the HF rows
# need python3 with torch (CUDA) and transformers, and are skipped (said so) without them.
set -u
build=build sentences=3000 src_len=27 tgt_len=28 batch=128 hf=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --sentences) sentences=$2; shift 2 ;;
    --src-len) src_len=$2; shift 2 ;;
    --tgt-len) tgt_len=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --quick) sentences=512; shift ;;
    --no-hf) hf=0; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-decode.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
[ -x "$build/bench-translate" ] || { echo "gpu-decode.sh: no $build/bench-translate" >&2; exit 2; }
out=${OUT:-$build}
table="$out/gpu-decode.md"
: > "$table"
rows=()
fails=0

# tokens/s from bench-translate's summary line
luna_rate() { sed -n 's/.*s, [0-9.]* sentences\/s, \([0-9.]*\) target tokens\/s.*/\1/p'; }

# each run: the summary line (last) and the per-step launches, GEMMs and host waits before it;
# both bf16 models also with the selection read back every step (--sync-interval 1) beside the
# device's default (every 8 steps), and Luna's steps launched kernel by kernel (--no-graphs)
# beside their replay as graphs (the default)
for run in "transformer_base fp32" "transformer_base bf16" "transformer_base bf16 1" \
           "luna_base_tied fp32" "luna_base_tied bf16" "luna_base_tied bf16 1" \
           "luna_base_tied bf16 0 --no-graphs"; do
  set -- $run
  arch=$1 prec=$2 sync=${3:-0} extra=${4:-}
  lines=$("$build/bench-translate" --preset "$arch" --device cuda --precision "$prec" \
            --vocab 32000 --sentences "$sentences" --src-len "$src_len" --min-len "$tgt_len" \
            --max-len-b "$tgt_len" --beam 4 --batch-size "$batch" --max-tokens 1000000 \
            --sync-interval "$sync" $extra 2>&1 | tail -n 2)
  line=$(echo "$lines" | tail -n 1)
  steps=$(echo "$lines" | sed -n 's/.*per decoder step on cuda (\([0-9]*\) steps): \(.*\)/\1 steps: \2/p')
  rate=$(echo "$line" | luna_rate)
  echo "$arch $prec sync-interval $sync $extra: $line"
  [ -n "$steps" ] && echo "  per step: $steps"
  if [ -z "$rate" ]; then fails=$((fails + 1)); rate="failed"; fi
  rows+=("| luna bench-translate | $arch (sync-interval ${sync/#0/default}${extra:+ $extra}) | $prec | $rate | ${steps:-} |")
done

if [ "$hf" -eq 1 ]; then
  for prec in fp32 bf16; do
    line=$(python3 tools/bench/hf_generate.py --device cuda --dtype "$prec" --sentences "$sentences" \
             --src-len "$src_len" --tgt-len "$tgt_len" --batch-size "$batch" --beam 4 2>&1 | tail -n 1)
    echo "hf $prec: $line"
    rate=$(echo "$line" | sed -n 's/.* s, \([0-9]*\) target tokens\/s.*/\1/p')
    [ -n "$rate" ] || rate="skipped or failed: ${line:0:120}"
    rows+=("| transformers generate | Marian-style, transformer_base's sizes | $prec | $rate | |")
  done
else
  echo "skip Hugging Face generate (--no-hf)"
fi

"$build/bench-translate" --preset transformer_base --device cuda --precision bf16 --vocab 32000 \
  --sentences 256 --src-len "$src_len" --min-len "$tgt_len" --max-len-b "$tgt_len" --beam 4 \
  --batch-size "$batch" --max-tokens 1000000 --profile > "$out/gpu-decode.profile.log" 2>&1 \
  && echo "ok   bench-translate --profile (transformer_base bf16, 256 sentences): $out/gpu-decode.profile.log" \
  || { echo "FAIL bench-translate --profile ($out/gpu-decode.profile.log)"; fails=$((fails + 1)); }

{
  echo "GPU decoding, beam 4, $sentences sentences of $src_len source tokens, $((tgt_len + 1)) target"
  echo "tokens each (</s> counted), V 32,000, batches of $batch sentences ($(date -u +%F))"
  echo
  echo "| program | model | precision | target tokens/s | per decoder step |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$table"
exit $((fails > 0))
