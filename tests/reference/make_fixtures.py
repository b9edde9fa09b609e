#!/usr/bin/python3
"""Regenerate tests/fixtures/model/*.safetensors from the float64 PyTorch oracle (luna_reference.py).

    /usr/bin/python3 tests/reference/make_fixtures.py [--out DIR] [--check]

Deterministic: every case seeds its own torch.Generator.  See tests/reference/README.md for the format.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import luna_reference as R  # noqa: E402
import safetensors_io as st  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name, config overrides, source lengths (incl. final </s>), target lengths (incl. final </s>), seed
# (the untied case uses ffn=20 so that the file, with its 7+13 attention Linears, stays under 150 KB)
CASES = [
    ("luna_tied_softplus", dict(vocab_size=45, projection_length=4), [9, 6, 4], [8, 5, 3], 1001),
    ("luna_untied_softplus", dict(vocab_size=37, ffn=20, projection_length=5, untie_luna_kv=True), [7, 9, 5], [6, 8, 4], 1002),
    ("luna_tied_elu", dict(vocab_size=53, projection_length=4, causal_activation="elu"), [8, 3, 6], [7, 8, 2], 1003),
    ("luna_fixed_projection", dict(vocab_size=37, projection_length=6, fix_projection_length=True),
     [5, 8, 3], [4, 6, 8], 1004),
    ("luna_pmask", dict(vocab_size=43, projection_length=6), [3, 5, 9], [5, 8, 6], 1005),
    ("luna_l_gt_src", dict(vocab_size=47, projection_length=12), [4, 7, 5], [8, 3, 5], 1006),
    ("transformer", dict(arch="transformer", vocab_size=47), [6, 9, 4], [5, 8, 7], 1007),
]
TINY = dict(d=16, ffn=32, layers=2, heads=4, label_smoothing=0.1, dropout=0.0)


def make_batch(g, V, src_lens, tgt_lens, pad=R.PAD, eos=R.EOS):
    B, m, n = len(src_lens), max(src_lens), max(tgt_lens)
    src = torch.full((B, m), pad, dtype=torch.long)
    tgt = torch.full((B, n), pad, dtype=torch.long)
    prev = torch.full((B, n), pad, dtype=torch.long)
    for b, (ls, lt) in enumerate(zip(src_lens, tgt_lens)):
        src[b, :ls - 1] = torch.randint(4, V, (ls - 1,), generator=g)
        src[b, ls - 1] = eos
        tgt[b, :lt - 1] = torch.randint(4, V, (lt - 1,), generator=g)
        tgt[b, lt - 1] = eos
        prev[b, 0] = eos
        prev[b, 1:lt] = tgt[b, :lt - 1]
    return src, torch.tensor(src_lens, dtype=torch.long), prev, tgt


def build_case(name, over, src_lens, tgt_lens, seed):
    kw = dict(TINY)
    kw.update(over)
    cfg = R.make_config(**kw)
    g = torch.Generator().manual_seed(seed)
    params32 = R.init_params(cfg, g, randomize_norms_and_biases=True, dtype=torch.float32)
    src, src_len, prev, tgt = make_batch(g, cfg["vocab_size"], src_lens, tgt_lens)
    p64 = R.to_dtype(params32, torch.float64, requires_grad=True)
    logits = R.forward(p64, cfg, src, src_len, prev)
    loss, nll = R.label_smoothed_loss(logits, tgt, cfg["label_smoothing"])
    names = list(p64.keys())
    grads = torch.autograd.grad(loss, [p64[k] for k in names], allow_unused=True)
    out = {}
    for k in names:
        out[k] = params32[k]
    out["input.src_tokens"] = src.to(torch.int32)
    out["input.src_lengths"] = src_len.to(torch.int32)
    out["input.prev_output_tokens"] = prev.to(torch.int32)
    out["input.target"] = tgt.to(torch.int32)
    out["output.logits"] = logits.detach().to(torch.float32)
    out["output.loss"] = loss.detach().reshape(1).to(torch.float32)
    out["output.nll"] = nll.detach().reshape(1).to(torch.float32)
    zero_grads = []
    for k, gr in zip(names, grads):
        if gr is None:
            gr = torch.zeros_like(p64[k])
            zero_grads.append(k)
        out["grad." + k] = gr.detach().to(torch.float32)
    meta = {"config": json.dumps(cfg, sort_keys=True),
            "description": f"luna oracle fixture '{name}' (tests/reference/make_fixtures.py, seed {seed}); "
                           "params F32, oracle computed in float64 and rounded to F32"}
    return cfg, out, meta, zero_grads, float(loss), float(nll)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "model"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # bit-reproducible reductions
    os.makedirs(args.out, exist_ok=True)
    for name, over, sl, tl, seed in CASES:
        cfg, out, meta, zero_grads, loss, nll = build_case(name, over, sl, tl, seed)
        path = os.path.join(args.out, name + ".safetensors")
        st.save_file(out, path, meta)
        ntok = int((out["input.target"] != R.PAD).sum())
        print(f"{name:24s} {os.path.getsize(path):7d} bytes  params {R.count_params(cfg):6d}  "
              f"loss {loss:.6f} nll {nll:.6f} ({ntok} tokens)  zero-grad tensors: {zero_grads}")


if __name__ == "__main__":
    main()
