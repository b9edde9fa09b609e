#!/usr/bin/env python3
"""Translate a file with CTranslate2 the way luna-translate does (tools/bench/decode-vs-ct2.sh).

SentencePiece pieces of each line (the checkpoint's model), beam search on the model exported by
tools/scripts/export-ctranslate2.py with luna-translate's settings, the best hypothesis detokenized, one
line per input line. Prints to stderr, like luna-translate, the time of the search alone (model
load, tokenization and detokenization excluded, as luna-translate's figure excludes them):
  ct2: translated N sentences in S s: X sentences/s, Y target tokens/s (beam B, I x T threads)
Target tokens count </s>, as luna-translate's do.
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("spm_model")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--lenpen", type=float, default=0.6)
    ap.add_argument("--threads", type=int, default=1,
                    help="CTranslate2's intra_threads: threads of each batch's computations")
    ap.add_argument("--inter-threads", type=int, default=1,
                    help="CTranslate2's inter_threads: batches translated side by side (each "
                         "with --threads threads)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--compute-type", default="float32",
                    help="CTranslate2's compute type (int8 for a model exported with int8 weights)")
    ap.add_argument("--max-len-b", type=int, default=200,
                    help="luna-translate's --max-len-b (with --max-len-a 0)")
    args = ap.parse_args()

    import ctranslate2
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=args.spm_model)
    with open(args.input, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    keep = [i for i, l in enumerate(lines) if l.strip()]
    pieces = [sp.encode(lines[i], out_type=str) for i in keep]
    tr = ctranslate2.Translator(args.model_dir, device="cpu", compute_type=args.compute_type,
                                intra_threads=args.threads, inter_threads=args.inter_threads)
    t0, c0 = time.perf_counter(), time.process_time()
    # return_end_token: the length in the length penalty counts </s>, as fairseq's (and luna's).
    # Length limit: luna (like fairseq) lets a hypothesis reach max_len_b tokens and then forces
    # </s>, ranking such hypotheses by that </s>'s log-prob; CTranslate2 ends them at
    # max_decoding_length tokens without </s>. Translations that reach the limit (a degenerate
    # repetition) may therefore differ; all others follow the same search.
    res = tr.translate_batch(pieces, beam_size=args.beam, length_penalty=args.lenpen,
                             max_batch_size=args.batch_size, batch_type="examples",
                             return_end_token=True, max_decoding_length=args.max_len_b,
                             min_decoding_length=1, return_scores=False)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = [""] * len(lines)
    tokens = 0
    for i, r in zip(keep, res):
        hyp = r.hypotheses[0]
        tokens += len(hyp)
        if hyp and hyp[-1] == "</s>":
            hyp = hyp[:-1]
        out[i] = sp.decode_pieces(hyp)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("".join(l + "\n" for l in out))
    print(f"ct2: translated {len(lines)} sentences ({len(lines) - len(keep)} empty) in "
          f"{secs:.2f} s: {len(keep) / secs:.2f} sentences/s, {tokens / secs:.1f} target "
          f"tokens/s (beam {args.beam}, {args.inter_threads} x {args.threads} threads; "
          f"{cpu:.2f} s CPU)", file=sys.stderr)


if __name__ == "__main__":
    main()
