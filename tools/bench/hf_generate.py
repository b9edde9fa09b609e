#!/usr/bin/env python3
"""Hugging Face `generate` beam search on a Marian-style encoder-decoder of a given size, random
weights, for the side-by-side GPU decoding figure of `bench-translate --preset transformer_base`
(docs/gpu.md): the same sizes, the same number of sentences and mean source length (bench-translate
spreads its lengths around --src-len, here all have it), and a fixed output length (min = max new tokens, as bench-translate --min-len N --max-len-b N: both
run the same number of decoder steps whatever the weights say).

  hf_generate.py [--device cuda] [--dtype bf16|fp16|fp32] [--sentences 3000] [--src-len 27]
                 [--tgt-len 28] [--batch-size 128] [--beam 4] [--vocab 32000] [--d-model 512]
                 [--layers 6] [--heads 8] [--ffn 2048] [--warmup 1] [--json]

Prints target tokens/s (sentences × (tgt-len + 1) tokens, counting the end of sentence as
bench-translate does) and the wall time of the timed pass (after --warmup batches), with the
device synchronised before and after. Needs torch and transformers (the GPU machines have both).
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--sentences", type=int, default=3000)
    ap.add_argument("--src-len", type=int, default=27)
    ap.add_argument("--tgt-len", type=int, default=28)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        import torch
        from transformers import MarianConfig, MarianMTModel
    except ImportError as e:
        sys.exit(f"hf_generate.py: {e} (needs torch and transformers)")
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("hf_generate.py: no CUDA device")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    torch.manual_seed(1)
    cfg = MarianConfig(vocab_size=a.vocab, d_model=a.d_model, encoder_layers=a.layers,
                       decoder_layers=a.layers, encoder_attention_heads=a.heads,
                       decoder_attention_heads=a.heads, encoder_ffn_dim=a.ffn,
                       decoder_ffn_dim=a.ffn, max_position_embeddings=max(512, a.src_len + a.tgt_len + 8),
                       pad_token_id=a.vocab - 1, eos_token_id=0, decoder_start_token_id=a.vocab - 1,
                       share_encoder_decoder_embeddings=True, scale_embedding=True)
    model = MarianMTModel(cfg).to(a.device, dtype=dtype).eval()
    gen = torch.Generator().manual_seed(2)
    # sources: random ids (not pad, not eos), then eos, all of one length
    src = torch.randint(1, a.vocab - 1, (a.sentences, a.src_len), generator=gen)
    src[:, -1] = 0
    steps = a.tgt_len + 1  # tokens per output, the end of sentence included (bench-translate's count)

    def run(rows):
        ids = rows.to(a.device)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 num_beams=a.beam, num_return_sequences=1, min_new_tokens=steps,
                                 max_new_tokens=steps, do_sample=False, early_stopping=False,
                                 length_penalty=0.6)
        if out.shape[1] != steps + 1:  # the decoder start token, then `steps` generated ones
            sys.exit(f"hf_generate.py: generate returned {out.shape[1] - 1} tokens, not {steps}")

    batches = [src[i:i + a.batch_size] for i in range(0, a.sentences, a.batch_size)]
    for b in batches[:a.warmup]:
        run(b)
    if a.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in batches:
        run(b)
    if a.device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    tokens = a.sentences * steps
    out = {"program": "transformers generate", "transformers": __import__("transformers").__version__,
           "torch": torch.__version__, "device": a.device, "dtype": a.dtype, "beam": a.beam,
           "sentences": a.sentences, "src_len": a.src_len, "tgt_tokens": tokens, "seconds": secs,
           "tgt_tokens_per_s": tokens / secs, "batch_size": a.batch_size,
           "model": f"d{a.d_model} {a.layers}+{a.layers} ffn {a.ffn} heads {a.heads} V {a.vocab}"}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"hf_generate: {a.sentences} sentences, {tokens} target tokens, beam {a.beam}, "
              f"{a.dtype} on {a.device}: {secs:.2f} s, {tokens / secs:.0f} target tokens/s "
              f"[{out['model']}; transformers {out['transformers']}, torch {out['torch']}]")


if __name__ == "__main__":
    main()
