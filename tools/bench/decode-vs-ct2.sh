#!/usr/bin/env bash
# CPU decoding: luna-translate against CTranslate2 (fp32; with --int8 also both in int8) on the same
# transformer weights.
#
# Exports the transformer checkpoint with tools/scripts/export-ctranslate2.py, then decodes INPUT with
# luna-translate and with CTranslate2 (tools/bench/ct2_translate.py) alternately, at each thread
# count, REPS times, and (when --luna is given) with luna-translate on a Luna checkpoint at the
# same beam. Times are the decoding alone as each program reports it (model load, SentencePiece
# encoding and detokenization excluded for both). Prints the median time, sentences/s, target
# tokens/s (</s> included), luna/CT2 speed ratio and how many output lines are identical, as a
# Markdown table. Creates the Python venv (ctranslate2, sentencepiece, numpy, safetensors) if it
# is missing. --int8 adds luna-translate --quantize int8 and CTranslate2 on the same weights exported
# with its converter's int8 quantization (compute type int8), and the BLEU of every program's output
# when --reference is given.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TR=""
LUNA=""
INPUT="$ROOT/../shared/data/multi30k/test_2016_flickr.en"
REPS=3
BEAM=4
LENPEN=0.6
BATCH=32
THREADS="1 2"
VENV="$ROOT/build-ct2/venv"
WORK="$ROOT/build-ct2"
BIN="$ROOT/build/luna-translate"
BASE=""
CT2_VERSION=4.8.5
INT8=""
REF=""

usage() {
    cat <<EOF
usage: tools/bench/decode-vs-ct2.sh --transformer CKPT [--luna CKPT] [options]

Decodes INPUT with luna-translate and with CTranslate2 (fp32, CPU) on the same transformer
weights, alternating the programs, and prints a Markdown table: median decoding time over REPS
runs (model load and tokenization excluded for both), sentences/s, target tokens/s, the
luna/CTranslate2 speed ratio and the number of identical output lines.

  --transformer CKPT   luna transformer checkpoint (.safetensors), exported for CTranslate2
  --luna CKPT          also time luna-translate on this Luna checkpoint (same beam)
  --input FILE         source sentences (default: ../shared/data/multi30k/test_2016_flickr.en)
  --reps N             runs per program and thread count (default: $REPS)
  --threads "1 2"      thread counts (default: "$THREADS")
  --beam N             beam size (default: $BEAM)
  --lenpen F           length penalty (default: $LENPEN)
  --batch-size N       sentences per batch, both programs (default: $BATCH)
  --luna-translate BIN the luna-translate to time (default: build/luna-translate)
  --baseline BIN       also time another luna-translate (e.g. a build before a change) on the
                       transformer (with --int8 also its int8), in the same alternation; its
                       output is compared with BIN's
  --venv DIR           Python venv with ctranslate2 (created if missing; default: build-ct2/venv)
  --work DIR           exported model and outputs (default: build-ct2)
  --int8               also luna-translate --quantize int8 and CTranslate2 int8 (its converter's
                       int8 quantization of the same weights, compute type int8)
  --reference FILE     sacreBLEU of each program's output against FILE (sacrebleu in the venv)
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
    --transformer) TR=$2; shift 2 ;;
    --luna) LUNA=$2; shift 2 ;;
    --input) INPUT=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --beam) BEAM=$2; shift 2 ;;
    --lenpen) LENPEN=$2; shift 2 ;;
    --batch-size) BATCH=$2; shift 2 ;;
    --luna-translate) BIN=$2; shift 2 ;;
    --baseline) BASE=$2; shift 2 ;;
    --venv) VENV=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --int8) INT8=1; shift ;;
    --reference) REF=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "decode-vs-ct2.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
[ -n "$TR" ] || { echo "decode-vs-ct2.sh: --transformer CKPT is required (--help)" >&2; exit 2; }
for f in "$TR" "$INPUT" ${LUNA:+"$LUNA"}; do
    [ -f "$f" ] || { echo "decode-vs-ct2.sh: $f: no such file" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "decode-vs-ct2.sh: $BIN: not built (cmake --build build)" >&2; exit 1; }

mkdir -p "$WORK"
PY="$VENV/bin/python"
if ! "$PY" -c "import ctranslate2, sentencepiece, numpy, safetensors, sacrebleu" 2>/dev/null; then
    echo "decode-vs-ct2.sh: creating $VENV (ctranslate2==$CT2_VERSION)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "ctranslate2==$CT2_VERSION" sentencepiece numpy safetensors sacrebleu
fi
echo "decode-vs-ct2.sh: ctranslate2 $("$PY" -c 'import ctranslate2; print(ctranslate2.__version__)')" >&2
"$PY" "$ROOT/tools/scripts/export-ctranslate2.py" "$TR" "$WORK/ct2-model" --force \
    --spm-model "$WORK/spm.model"
[ -z "$INT8" ] || "$PY" "$ROOT/tools/scripts/export-ctranslate2.py" "$TR" "$WORK/ct2-model-int8" \
    --force --quantization int8 --spm-model "$WORK/spm.model"

# run NAME THREADS REP: one decode; appends "name threads secs tokens" to $WORK/times
run() {
    local name=$1 t=$2 rep=$3 out="$WORK/$1.$2.out" err="$WORK/$1.$2.err"
    case "$name" in
    luna) "$BIN" "$TR" --input "$INPUT" --beam "$BEAM" --lenpen "$LENPEN" --batch-size "$BATCH" \
        --threads "$t" >"$out" 2>"$err" ;;
    base) "$BASE" "$TR" --input "$INPUT" --beam "$BEAM" --lenpen "$LENPEN" --batch-size "$BATCH" \
        --threads "$t" >"$out" 2>"$err" ;;
    luna_demo) "$BIN" "$LUNA" --input "$INPUT" --beam "$BEAM" --lenpen "$LENPEN" \
        --batch-size "$BATCH" --threads "$t" >"$out" 2>"$err" ;;
    ct2) "$PY" "$ROOT/tools/bench/ct2_translate.py" "$WORK/ct2-model" "$WORK/spm.model" \
        --input "$INPUT" --output "$out" --beam "$BEAM" --lenpen "$LENPEN" \
        --batch-size "$BATCH" --threads "$t" 2>"$err" ;;
    luna8) "$BIN" "$TR" --quantize int8 --input "$INPUT" --beam "$BEAM" --lenpen "$LENPEN" \
        --batch-size "$BATCH" --threads "$t" >"$out" 2>"$err" ;;
    base8) "$BASE" "$TR" --quantize int8 --input "$INPUT" --beam "$BEAM" --lenpen "$LENPEN" \
        --batch-size "$BATCH" --threads "$t" >"$out" 2>"$err" ;;
    luna_demo8) "$BIN" "$LUNA" --quantize int8 --input "$INPUT" --beam "$BEAM" \
        --lenpen "$LENPEN" --batch-size "$BATCH" --threads "$t" >"$out" 2>"$err" ;;
    ct2i8) "$PY" "$ROOT/tools/bench/ct2_translate.py" "$WORK/ct2-model-int8" "$WORK/spm.model" \
        --input "$INPUT" --output "$out" --beam "$BEAM" --lenpen "$LENPEN" \
        --batch-size "$BATCH" --threads "$t" --compute-type int8 2>"$err" ;;
    esac
    # "... translated N sentences (E empty) in S s: X sentences/s, Y target tokens/s (...; C s CPU)"
    awk -v n="$name" -v t="$t" -v r="$rep" '/translated/ {
        c = "nan"
        for (i = 1; i <= NF; i++) {
            if ($i == "in") s = $(i + 1); if ($i == "target") y = $(i - 1)
            if ($i ~ /^CPU/) c = $(i - 2)
        }
        printf "%s %s %s %s %.0f %s\n", n, t, r, s, s * y, c }' "$err" >>"$WORK/times"
    tail -1 "$err" >&2
}

: >"$WORK/times"
NAMES="luna ct2${LUNA:+ luna_demo}${BASE:+ base}${INT8:+ luna8 ct2i8}"
[ -z "$INT8" ] || [ -z "$LUNA" ] || NAMES="$NAMES luna_demo8"
[ -z "$INT8" ] || [ -z "$BASE" ] || NAMES="$NAMES base8"
for rep in $(seq "$REPS"); do
    for t in $THREADS; do
        for name in $NAMES; do run "$name" "$t" "$rep"; done
    done
done

N=$(grep -c '' "$INPUT")
echo
echo "| model | program | threads | median s | median CPU s | sentences/s | target tokens/s | luna / CT2 | identical lines |"
echo "|---|---|---|---|---|---|---|---|---|"
for t in $THREADS; do
    ct2_med=$(awk -v t="$t" '$1 == "ct2" && $2 == t {print $4}' "$WORK/times" | sort -g |
        awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    # int8 rows are compared with CTranslate2 int8
    ct2i8_med=$(awk -v t="$t" '$1 == "ct2i8" && $2 == t {print $4}' "$WORK/times" | sort -g |
        awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    same8=""
    [ -z "$INT8" ] || same8=$(paste -d '\t' "$WORK/luna8.$t.out" "$WORK/ct2i8.$t.out" |
        awk -F '\t' '$1 == $2' | wc -l)
    same=$(paste -d '\t' "$WORK/luna.$t.out" "$WORK/ct2.$t.out" | awk -F '\t' '$1 == $2' | wc -l)
    base_same="" base8_same=""
    [ -z "$BASE" ] || base_same=$(paste -d '\t' "$WORK/luna.$t.out" "$WORK/base.$t.out" |
        awk -F '\t' '$1 == $2' | wc -l)
    [ -z "$BASE" ] || [ -z "$INT8" ] || base8_same=$(paste -d '\t' "$WORK/luna8.$t.out" \
        "$WORK/base8.$t.out" | awk -F '\t' '$1 == $2' | wc -l)
    for name in $NAMES; do
        awk -v n="$name" -v t="$t" -v N="$N" -v c="$ct2_med" -v c8="$ct2i8_med" -v same="$same" \
            -v bsame="$base_same" -v b8same="$base8_same" -v same8="$same8" '
            $1 == n && $2 == t { s[++k] = $4; tok[k] = $5; cpu[k] = $6 }
            END {
                # median by time (odd REPS: the middle run; even: the upper middle); CPU: its own median
                for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) {
                    if (s[j] < s[i]) { x = s[i]; s[i] = s[j]; s[j] = x; x = tok[i]; tok[i] = tok[j]; tok[j] = x }
                    if (cpu[j] < cpu[i]) { x = cpu[i]; cpu[i] = cpu[j]; cpu[j] = x }
                }
                m = int((k + 1) / 2)
                model = n ~ /^luna_demo/ ? "luna_demo" : "transformer"
                int8 = n ~ /8$/
                prog = n == "ct2" ? "CTranslate2 fp32" : (n == "ct2i8" ? "CTranslate2 int8" : \
                    (n == "base" ? "luna-translate (baseline)" : (n == "base8" ? "luna-translate int8 (baseline)" : \
                    (int8 ? "luna-translate int8" : "luna-translate"))))
                ref = int8 ? c8 : c
                ratio = (n == "ct2" || n == "ct2i8") ? "1" : sprintf("%.2fx", ref / s[m])
                ident = n == "luna" ? same " / " N " with CT2" : (n == "base" ? bsame " / " N " with luna-translate" : \
                    (n == "luna8" ? same8 " / " N " with CT2 int8" : (n == "base8" ? b8same " / " N " with luna int8" : "")))
                printf "| %s | %s | %s | %.2f | %s | %.1f | %.0f | %s | %s |\n", model, prog, t, s[m], cpu[m], N / s[m], tok[m] / s[m], ratio, ident
            }' "$WORK/times"
    done
done
echo
echo "(beam $BEAM, lenpen $LENPEN, --batch-size $BATCH, $REPS runs each, alternated; median of the" \
    "decoding time each program reports, model load and tokenization excluded; luna / CT2 =" \
    "CTranslate2's median time / this row's (int8 rows: CTranslate2 int8's); CPU s: the" \
    "process's CPU seconds over the same span)"
if [ -n "$REF" ]; then
    echo
    echo "| run (see above) | threads | sacreBLEU |"
    echo "|---|---|---|"
    for t in $THREADS; do
        for name in $NAMES; do
            bleu=$("$VENV/bin/sacrebleu" -b "$REF" <"$WORK/$name.$t.out")
            echo "| $name | $t | $bleu |"
        done
    done
fi
