#!/usr/bin/env bash
# Translate a test set with a checkpoint and score it with sacreBLEU.
#
#   tools/scripts/evaluate.sh CHECKPOINT --src FILE --ref FILE [--tokenized-bleu] [--lang de]
#                             [--output HYP] [--translate BIN] [--venv DIR] [-- luna-translate options]
#
# Defaults follow the usual fairseq practice for WMT'14 EN-DE: --beam 4 --lenpen 0.6 (anything
# after "--" is passed to luna-translate and overrides them). sacreBLEU (and sacremoses for
# --tokenized-bleu) is installed by this script into a local virtual environment
# (default: build-eval/.venv-eval in the repository; python3 -m venv + pip install).
# Prints the sacreBLEU score with its signature; --tokenized-bleu adds the papers' tokenized
# BLEU with compound splitting (get_ende_bleu.sh), clearly labelled.
#
# Example (newstest2014 full):
#   tools/scripts/evaluate.sh checkpoints/avg5.safetensors \
#       --src ../shared/data/wmt14-en-de/test/newstest2014-full.en \
#       --ref ../shared/data/wmt14-en-de/test/newstest2014-full.de --tokenized-bleu -- --threads 2
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
die() { echo "evaluate.sh: $*" >&2; exit 1; }
usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

ckpt="" src="" ref="" out="" lang="de" tokenized=0 translate="" venv="${LUNA_EVAL_VENV:-$repo/build-eval/.venv-eval}"
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --src) src="$2"; shift 2 ;;
        --ref) ref="$2"; shift 2 ;;
        --output) out="$2"; shift 2 ;;
        --lang) lang="$2"; shift 2 ;;
        --tokenized-bleu) tokenized=1; shift ;;
        --translate) translate="$2"; shift 2 ;;
        --venv) venv="$2"; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) [[ -z "$ckpt" ]] || die "unexpected argument '$1'"; ckpt="$1"; shift ;;
    esac
done
[[ -n "$ckpt" && -n "$src" && -n "$ref" ]] || { usage >&2; die "CHECKPOINT, --src and --ref are required"; }
[[ -f "$ckpt" ]] || die "$ckpt: no such checkpoint"
[[ -f "$src" ]] || die "$src: no such file"
[[ -f "$ref" ]] || die "$ref: no such file"
if [[ -z "$translate" ]]; then
    translate="$(command -v luna-translate || true)"
    for d in "$repo"/build "$repo"/build-*; do
        [[ -z "$translate" && -x "$d/luna-translate" ]] && translate="$d/luna-translate"
    done
fi
[[ -x "$translate" ]] || die "luna-translate not found: build it (cmake --build build) or give --translate BIN"

# the evaluation environment
if [[ ! -x "$venv/bin/python" ]]; then
    echo "evaluate.sh: creating $venv (sacrebleu, sacremoses)" >&2
    python3 -m venv "$venv" || die "python3 -m venv failed (install python3-venv)"
fi
if ! "$venv/bin/python" -c "import sacrebleu, sacremoses" 2>/dev/null; then
    "$venv/bin/pip" install --quiet sacrebleu sacremoses >&2 ||
        die "pip install sacrebleu sacremoses failed (no network? set LUNA_EVAL_VENV to a venv that has them)"
fi

# translate
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
hyp="${out:-$tmp/hyp.txt}"
"$translate" "$ckpt" --input "$src" --beam 4 --lenpen 0.6 "${extra[@]}" > "$tmp/hyp.partial"
mv "$tmp/hyp.partial" "$hyp"
[[ $(wc -l < "$hyp") -eq $(wc -l < "$ref") ]] ||
    die "$hyp has $(wc -l < "$hyp") lines but $ref has $(wc -l < "$ref")"

echo "checkpoint: $ckpt"
echo "test set:   $src -> $ref ($(wc -l < "$ref") sentences)"
args=("$hyp" "$ref" --lang "$lang")
[[ $tokenized -eq 1 ]] && args+=(--tokenized-bleu)
"$venv/bin/python" "$repo/tools/scripts/eval/bleu.py" "${args[@]}"
