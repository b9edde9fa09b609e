#!/usr/bin/env bash
# WMT'14 English->German, step 1: get the data and binarize it with a joint SentencePiece BPE.
#
#   tools/scripts/recipes/wmt14-en-de/prepare.sh [--work DIR] [--bpe-vocab-size N] [--offline] [--smoke]
#
# Where the network allows, downloads the WMT'14 training data of the paper (Europarl v7, Common
# Crawl, News Commentary v9: 4.5M pairs), newstest2013 (dev) and newstest2014 full (test) from
# statmt.org, and cleans the training pairs as fairseq's prepare-wmt14en2de.sh does (Moses
# clean-corpus-n: 1-250 words a side, length ratio <= 1.5; here in Python, before BPE).
# Otherwise (no network, or --offline) it falls back to the offline copy in
# ../shared/data/wmt14-en-de: train-mini (56,960 real WMT-domain pairs, concatenated in a fixed
# order; the Moses-tokenized sample has its XML escapes undone), the same dev and test sets.
# Then luna-preprocess writes WORK/data-bin (train, valid = newstest2013, test = newstest2014 full;
# --skip-empty drops the one empty pair of train-mini) and the raw test files go to WORK/raw.
#
# options:
#   --work DIR          working folder (default: build-wmt14 in the repository; --smoke: build-wmt14-smoke)
#   --shared-data DIR   the offline copy (default: ../shared/data/wmt14-en-de beside the repository)
#   --bpe-vocab-size N  joint BPE vocabulary (default: 32000 for the full data, 16000 for train-mini,
#                       2000 with --smoke)
#   --offline           do not try to download; use the offline copy
#   --smoke             the quick CI variant: offline data, 2000-piece BPE, test = first 200 sentences
#   --build DIR         folder with luna-preprocess (default: build in the repository, else PATH)
#   --workers N         threads for SentencePiece (default: nproc)
#   -h, --help          this help
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
die() { echo "prepare.sh: error: $*" >&2; exit 1; }
say() { echo "prepare.sh: $*"; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

work="" shared="$(dirname "$repo")/shared/data/wmt14-en-de" vocab="" offline=0 smoke=0 build="$repo/build"
workers="$(nproc 2>/dev/null || echo 2)"
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --work) need "$@"; work="$2"; shift 2 ;;
        --shared-data) need "$@"; shared="$2"; shift 2 ;;
        --bpe-vocab-size) need "$@"; vocab="$2"; shift 2 ;;
        --offline) offline=1; shift ;;
        --smoke) smoke=1; offline=1; shift ;;
        --build) need "$@"; build="$2"; shift 2 ;;
        --workers) need "$@"; workers="$2"; shift 2 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ -n "$work" ]] || { [[ $smoke -eq 1 ]] && work="$repo/build-wmt14-smoke" || work="$repo/build-wmt14"; }
[[ -z "$vocab" || "$vocab" =~ ^[1-9][0-9]*$ ]] || die "--bpe-vocab-size must be a positive integer, got '$vocab'"
preprocess="$build/luna-preprocess"
[[ -x "$preprocess" ]] || preprocess="$(command -v luna-preprocess || true)"
[[ -n "$preprocess" && -x "$preprocess" ]] ||
    die "luna-preprocess not found in $build or on PATH: build it (cmake -S . -B build && cmake --build build) or give --build DIR"

raw="$work/raw"
mkdir -p "$raw"

# ---- the full data, where the network allows --------------------------------------------------
statmt_urls=(
    "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
    "http://statmt.org/wmt14/training-parallel-nc-v9.tgz"
    "http://data.statmt.org/wmt17/translation-task/dev.tgz"
    "http://statmt.org/wmt14/test-full.tgz"
)
corpora=(training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v9.de-en)

download_full() {
    local orig="$work/orig" url f
    command -v curl >/dev/null || { say "curl not installed: cannot download"; return 1; }
    curl -sfI --max-time 15 "${statmt_urls[4]}" >/dev/null 2>&1 || { say "statmt.org is not reachable"; return 1; }
    mkdir -p "$orig"
    for url in "${statmt_urls[@]}"; do
        f="$orig/$(basename "$url")"
        if [[ ! -f "$f.done" ]]; then
            say "downloading $url"
            curl -fL --retry 3 -o "$f" "$url" || { say "download of $url failed"; return 1; }
            tar -xzf "$f" -C "$orig" || { say "cannot unpack $f"; return 1; }
            touch "$f.done"
        fi
    done
    say "cleaning the training data (1-250 words, ratio <= 1.5)"
    local c
    : >"$raw/train.en.tmp"; : >"$raw/train.de.tmp"
    for c in "${corpora[@]}"; do
        [[ -f "$orig/$c.en" && -f "$orig/$c.de" ]] || { say "$orig/$c.{en,de} missing after unpacking"; return 1; }
        cat "$orig/$c.en" >>"$raw/train.en.tmp"
        cat "$orig/$c.de" >>"$raw/train.de.tmp"
    done
    python3 - "$raw/train.en.tmp" "$raw/train.de.tmp" "$raw/train.en" "$raw/train.de" <<'EOF' || return 1
import sys
src, tgt, out_src, out_tgt = sys.argv[1:]
kept = dropped = 0
with open(src, encoding="utf-8", errors="replace") as fs, open(tgt, encoding="utf-8", errors="replace") as ft, \
     open(out_src, "w", encoding="utf-8") as os_, open(out_tgt, "w", encoding="utf-8") as ot:
    for s, t in zip(fs, ft):
        s, t = " ".join(s.split()), " ".join(t.split())
        ns, nt = len(s.split()), len(t.split())
        if 1 <= ns <= 250 and 1 <= nt <= 250 and ns <= 1.5 * nt and nt <= 1.5 * ns:
            os_.write(s + "\n"); ot.write(t + "\n"); kept += 1
        else:
            dropped += 1
print(f"prepare.sh: clean: kept {kept} pairs, dropped {dropped}")
EOF
    rm -f "$raw/train.en.tmp" "$raw/train.de.tmp"
    cp "$orig/dev/newstest2013.en" "$raw/valid.en"
    cp "$orig/dev/newstest2013.de" "$raw/valid.de"
    # newstest2014 full (sacreBLEU wmt14/full): source side of the en-de direction and its reference
    sed -n 's/^<seg id="[0-9]*">[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*<\/seg>.*$/\1/p' \
        "$orig/test-full/newstest2014-deen-src.en.sgm" >"$raw/test.en"
    sed -n 's/^<seg id="[0-9]*">[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*<\/seg>.*$/\1/p' \
        "$orig/test-full/newstest2014-deen-ref.de.sgm" >"$raw/test.de"
    [[ $(wc -l <"$raw/test.en") -eq 3003 && $(wc -l <"$raw/test.de") -eq 3003 ]] ||
        { say "newstest2014 full should have 3003 lines"; return 1; }
    return 0
}

# ---- the offline copy --------------------------------------------------------------------------
use_offline() {
    [[ -d "$shared/train-mini" ]] ||
        die "$shared/train-mini not found (and no network): give the offline copy with --shared-data DIR"
    local files=(europarl-v7-first20k europarl-v7-docs wmt-sample-10k.tok newstest2008 newstest2009
                 newstest2010 newstest2011 newstest2012 newstest2015 newstest2016) f l
    for l in en de; do
        : >"$raw/train.$l"
        for f in "${files[@]}"; do
            [[ -f "$shared/train-mini/$f.$l" ]] || die "$shared/train-mini/$f.$l missing"
            if [[ "$f" == *.tok ]]; then   # Moses-tokenized with XML escapes: undo the escapes
                sed -e 's/&apos;/'"'"'/g' -e 's/&quot;/"/g' -e 's/&lt;/</g' -e 's/&gt;/>/g' \
                    -e 's/&#91;/[/g' -e 's/&#93;/]/g' -e 's/&#124;/|/g' -e 's/&amp;/\&/g' \
                    "$shared/train-mini/$f.$l" >>"$raw/train.$l"
            else
                cat "$shared/train-mini/$f.$l" >>"$raw/train.$l"
            fi
        done
    done
    for l in en de; do
        [[ -f "$shared/dev/newstest2013.$l" && -f "$shared/test/newstest2014-full.$l" ]] ||
            die "$shared/dev/newstest2013.$l or $shared/test/newstest2014-full.$l missing"
        cp "$shared/dev/newstest2013.$l" "$raw/valid.$l"
        cp "$shared/test/newstest2014-full.$l" "$raw/test.$l"
    done
}

source_kind=""
if [[ $offline -eq 0 ]] && download_full; then
    source_kind="full WMT'14 (downloaded)"
    [[ -n "$vocab" ]] || vocab=32000
else
    [[ $offline -eq 1 ]] || say "falling back to the offline copy $shared (train-mini)"
    use_offline
    source_kind="offline train-mini ($shared)"
    [[ -n "$vocab" ]] || { [[ $smoke -eq 1 ]] && vocab=2000 || vocab=16000; }
fi
if [[ $smoke -eq 1 ]]; then   # a 200-sentence test subset keeps decoding short
    for l in en de; do head -n 200 "$raw/test.$l" >"$raw/test.$l.tmp" && mv "$raw/test.$l.tmp" "$raw/test.$l"; done
fi
for s in train valid test; do
    [[ $(wc -l <"$raw/$s.en") -eq $(wc -l <"$raw/$s.de") ]] || die "$raw/$s.en and $raw/$s.de differ in line count"
done
say "data: $source_kind: train $(wc -l <"$raw/train.en"), valid $(wc -l <"$raw/valid.en"), test $(wc -l <"$raw/test.en") pairs"

say "luna-preprocess: joint BPE $vocab -> $work/data-bin"
"$preprocess" --source-lang en --target-lang de \
    --trainpref "$raw/train" --validpref "$raw/valid" --testpref "$raw/test" \
    --destdir "$work/data-bin" --joined-dictionary --bpe-vocab-size "$vocab" \
    --workers "$workers" --skip-empty 2>&1 | sed 's/^/  /' || die "luna-preprocess failed"
say "done: $work/data-bin (test source $raw/test.en, reference $raw/test.de)"
