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
# Markdown table. At T > 1 threads each program also runs in its throughput configuration: T
# batches side by side on one thread each (luna-translate --workers T --threads 1, CTranslate2
# inter_threads T, intra_threads 1), and the ratios are against the faster CTranslate2
# configuration of the same precision and core count. Creates the Python venv (ctranslate2, sentencepiece, numpy, safetensors) if it
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
luna/CTranslate2 speed ratio and the number of identical output lines. At T > 1 threads both
programs also run T batches side by side on one thread each (luna-translate --workers T,
CTranslate2 inter_threads T), and every ratio is against the faster CTranslate2 configuration.

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
    lunaw) "$BIN" "$TR" --input "$INPUT" --beam "$BEAM" --lenpen "$LENPEN" --batch-size "$BATCH" \
        --threads 1 --workers "$t" >"$out" 2>"$err" ;;
    ct2x) "$PY" "$ROOT/tools/bench/ct2_translate.py" "$WORK/ct2-model" "$WORK/spm.model" \
        --input "$INPUT" --output "$out" --beam "$BEAM" --lenpen "$LENPEN" \
        --batch-size "$BATCH" --threads 1 --inter-threads "$t" 2>"$err" ;;
    luna8w) "$BIN" "$TR" --quantize int8 --input "$INPUT" --beam "$BEAM" --lenpen "$LENPEN" \
        --batch-size "$BATCH" --threads 1 --workers "$t" >"$out" 2>"$err" ;;
    ct2i8x) "$PY" "$ROOT/tools/bench/ct2_translate.py" "$WORK/ct2-model-int8" "$WORK/spm.model" \
        --input "$INPUT" --output "$out" --beam "$BEAM" --lenpen "$LENPEN" \
        --batch-size "$BATCH" --threads 1 --inter-threads "$t" --compute-type int8 2>"$err" ;;
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
# names_at T: the runs at T threads (at T > 1 also both programs' T batches side by side)
names_at() {
    local n="$NAMES"
    if [ "$1" -gt 1 ]; then
        n="$n lunaw ct2x"
        [ -z "$INT8" ] || n="$n luna8w ct2i8x"
    fi
    echo "$n"
}
for rep in $(seq "$REPS"); do
    for t in $THREADS; do
        for name in $(names_at "$t"); do run "$name" "$t" "$rep"; done
    done
done
# median NAME T: the median time of those runs ("" if none)
median() {
    awk -v n="$1" -v t="$2" '$1 == n && $2 == t {print $4}' "$WORK/times" | sort -g |
        awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]}'
}
# faster A B: the smaller of two medians, either may be ""
faster() { awk -v a="$1" -v b="$2" 'BEGIN {print (b == "" || (a != "" && a + 0 <= b + 0)) ? a : b}'; }
# same A B: lines equal in two outputs
same() { paste -d '\t' "$WORK/$1.$3.out" "$WORK/$2.$3.out" | awk -F '\t' '$1 == $2' | wc -l; }

N=$(grep -c '' "$INPUT")
echo
echo "| model | program | threads | median s | median CPU s | sentences/s | target tokens/s | luna / CT2 | identical lines |"
echo "|---|---|---|---|---|---|---|---|---|"
for t in $THREADS; do
    # every ratio against the faster CTranslate2 configuration of its precision at t threads
    ct2_med=$(faster "$(median ct2 "$t")" "$(median ct2x "$t")")
    ct2i8_med=$(faster "$(median ct2i8 "$t")" "$(median ct2i8x "$t")")
    same8="" samew="" same8w=""
    [ -z "$INT8" ] || same8=$(same luna8 ct2i8 "$t")
    same=$(same luna ct2 "$t")
    [ "$t" -le 1 ] || samew=$(same lunaw ct2x "$t")
    [ "$t" -le 1 ] || [ -z "$INT8" ] || same8w=$(same luna8w ct2i8x "$t")
    base_same="" base8_same=""
    [ -z "$BASE" ] || base_same=$(same luna base "$t")
    [ -z "$BASE" ] || [ -z "$INT8" ] || base8_same=$(same luna8 base8 "$t")
    for name in $(names_at "$t"); do
        awk -v n="$name" -v t="$t" -v N="$N" -v c="$ct2_med" -v c8="$ct2i8_med" -v same="$same" \
            -v bsame="$base_same" -v b8same="$base8_same" -v same8="$same8" -v samew="$samew" \
            -v same8w="$same8w" '
            $1 == n && $2 == t { s[++k] = $4; tok[k] = $5; cpu[k] = $6 }
            END {
                # median by time (odd REPS: the middle run; even: the upper middle); CPU: its own median
                for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) {
                    if (s[j] < s[i]) { x = s[i]; s[i] = s[j]; s[j] = x; x = tok[i]; tok[i] = tok[j]; tok[j] = x }
                    if (cpu[j] < cpu[i]) { x = cpu[i]; cpu[i] = cpu[j]; cpu[j] = x }
                }
                m = int((k + 1) / 2)
                model = n ~ /^luna_demo/ ? "luna_demo" : "transformer"
                int8 = n ~ /8/
                prog = n == "ct2" ? "CTranslate2 fp32" : (n == "ct2i8" ? "CTranslate2 int8" : \
                    (n == "ct2x" ? "CTranslate2 fp32, " t " batches x 1 thread" : \
                    (n == "ct2i8x" ? "CTranslate2 int8, " t " batches x 1 thread" : \
                    (n == "lunaw" ? "luna-translate --workers " t : (n == "luna8w" ? "luna-translate int8 --workers " t : \
                    (n == "base" ? "luna-translate (baseline)" : (n == "base8" ? "luna-translate int8 (baseline)" : \
                    (int8 ? "luna-translate int8" : "luna-translate"))))))))
                ref = int8 ? c8 : c
                ratio = sprintf("%.2fx", ref / s[m])
                ident = n == "luna" ? same " / " N " with CT2" : (n == "base" ? bsame " / " N " with luna-translate" : \
                    (n == "luna8" ? same8 " / " N " with CT2 int8" : (n == "base8" ? b8same " / " N " with luna int8" : \
                    (n == "lunaw" ? samew " / " N " with CT2 x" t : (n == "luna8w" ? same8w " / " N " with CT2 int8 x" t : "")))))
                printf "| %s | %s | %s | %.2f | %s | %.1f | %.0f | %s | %s |\n", model, prog, t, s[m], cpu[m], N / s[m], tok[m] / s[m], ratio, ident
            }' "$WORK/times"
    done
done
echo
echo "(beam $BEAM, lenpen $LENPEN, --batch-size $BATCH, $REPS runs each, alternated; median of the" \
    "decoding time each program reports, model load and tokenization excluded; luna / CT2 =" \
    "the faster CTranslate2 configuration's median time at these threads / this row's (int8" \
    "rows: CTranslate2 int8's; CTranslate2's own rows: below 1 for its slower configuration);" \
    "CPU s: the process's CPU seconds over the same span)"
if [ -n "$REF" ]; then
    echo
    echo "| run (see above) | threads | sacreBLEU |"
    echo "|---|---|---|"
    for t in $THREADS; do
        for name in $(names_at "$t"); do
            bleu=$("$VENV/bin/sacrebleu" -b "$REF" <"$WORK/$name.$t.out")
            echo "| $name | $t | $bleu |"
        done
    done
fi
