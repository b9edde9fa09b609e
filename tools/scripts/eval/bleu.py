"""BLEU for tools/scripts/evaluate.sh (runs inside the evaluation venv).

  bleu.py HYP REF [--tokenized-bleu] [--lang de]

Prints sacreBLEU (13a tokenization, mixed case) with its signature; with --tokenized-bleu also
the "tokenized BLEU with compound splitting" of the Transformer/Luna papers (tensor2tensor's
get_ende_bleu.sh): Moses tokenization of hypotheses and references (sacremoses, as
tokenizer.perl -l LANG), hyphenated compounds split as  a-b -> a ##AT##-##AT## b, then
multi-bleu.perl-style BLEU (case-sensitive, no further tokenization). That number is NOT
comparable with sacreBLEU and is labelled as such.
"""
import argparse
import re
import sys

import sacrebleu


def read(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hyp")
    ap.add_argument("ref")
    ap.add_argument("--tokenized-bleu", action="store_true")
    ap.add_argument("--lang", default="de")
    a = ap.parse_args()
    hyp, ref = read(a.hyp), read(a.ref)
    if len(hyp) != len(ref):
        sys.exit(f"bleu.py: {a.hyp} has {len(hyp)} lines but {a.ref} has {len(ref)}")
    metric = sacrebleu.metrics.BLEU()
    score = metric.corpus_score(hyp, [ref])
    print(f"sacreBLEU: {score.score:.2f}")
    print(f"  {score}")
    print(f"  signature: {metric.get_signature()}")
    if a.tokenized_bleu:
        try:
            from sacremoses import MosesTokenizer
            mt = MosesTokenizer(lang=a.lang)
            tok = lambda s: mt.tokenize(s, return_str=True, escape=True)  # noqa: E731
            how = f"sacremoses MosesTokenizer(lang={a.lang}), as tokenizer.perl -l {a.lang}"
        except ImportError:  # fall back to sacreBLEU's international tokenizer
            from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International
            tok = TokenizerV14International()
            how = "sacreBLEU intl tokenizer (sacremoses not installed)"
        split = lambda s: re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", s)  # noqa: E731
        th = [split(tok(h)) for h in hyp]
        tr = [split(tok(r)) for r in ref]
        t = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(th, [tr])
        print(f"tokenized BLEU with compound splitting (NOT sacreBLEU; {how}, "
              f"##AT##-##AT## split, multi-bleu style): {t.score:.2f}")
        print(f"  {t}")


if __name__ == "__main__":
    main()
