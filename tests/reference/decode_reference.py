"""PyTorch oracle decoding: beam search over a luna checkpoint with the same semantics as
decoding/beam_search.c (fairseq SequenceGenerator), for outputs and the throughput ratio.

  /usr/bin/python3 tests/reference/decode_reference.py CKPT --ids SRC_IDS [--beam 4] [--lenpen 0.6]
        [--max-len-a 0] [--max-len-b 200] [--min-len 1] [--batch-size 64] [--threads 2] [--float64]

SRC_IDS: one sentence per line, dictionary ids separated by spaces, without the final </s>
(bench-translate --dump-ids FILE writes them from raw text with the checkpoint's SentencePiece
model; the python `sentencepiece` package is not needed). Prints one line per sentence: the best
hypothesis ids (without </s>) and its score in base 2, then a throughput summary on stderr.
Luna checkpoints only (the transformer baseline's KV cache is not implemented here).
"""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import luna_reference as R  # noqa: E402
from safetensors_io import load_file  # noqa: E402

EOS, PAD, UNK = 2, 1, 3


class Decoder:
    """Incremental Luna decoder over rows (sentence x beam), reorderable with index_select."""

    def __init__(self, params, cfg):
        self.p, self.cfg = params, cfg
        self.H = cfg["decoder_attention_heads"]
        self.tied = not cfg["untie_luna_kv"]

    def begin(self, src, lengths, beam):
        p, cfg, H = self.p, self.cfg, self.H
        enc, P, src_pad, pmask = R.luna_encode(p, cfg, src, lengths)
        rep = torch.arange(src.shape[0]).repeat_interleave(beam)
        d = cfg["decoder_embed_dim"]
        dh = d // H
        self.pmask = None if pmask is None else pmask[rep]
        self.layers = []
        for i in range(cfg["decoder_layers"]):
            pre = f"decoder.layers.{i}."
            pt = R.heads(R.linear(P, p, pre + "self_attn.pq_proj"), H) * dh ** -0.5
            _, y_p = R.luna_attn(p, pre + "encoder_attn", P[:, :1], P, enc, src_pad, pmask, H, self.tied)
            if self.tied:
                kx = vx = R.heads(R.linear(y_p, p, pre + "encoder_attn.c_proj"), H)
            else:
                kx = R.heads(R.linear(y_p, p, pre + "encoder_attn.k_proj"), H)
                vx = R.heads(R.linear(y_p, p, pre + "encoder_attn.v_proj"), H)
            L = P.shape[1]
            rows = rep.numel()
            self.layers.append({"pt": pt[rep], "kx": kx[rep], "vx": vx[rep],
                                "ksum": P.new_zeros(rows, H, dh, L), "vsum": P.new_zeros(rows, H, L, dh)})
            P = R.layer_norm(P + y_p, p, pre + "encoder_atten_proj_layer_norm")
        self.t = 0

    def reorder(self, idx):
        for c in self.layers:
            for k in c:
                c[k] = c[k].index_select(0, idx)
        if self.pmask is not None:
            self.pmask = self.pmask.index_select(0, idx)

    def step(self, tokens):
        p, cfg, H = self.p, self.cfg, self.H
        E = p["encoder.embed_tokens.weight"]
        d = E.shape[1]
        dh = d // H
        pos = torch.full((1,), PAD + 1 + self.t, dtype=torch.long)
        x = (math.sqrt(d) * E[tokens] + R.sinusoid(pos, d, E.dtype)).unsqueeze(1)  # [B,1,d]
        self.t += 1
        for i, c in enumerate(self.layers):
            pre = f"decoder.layers.{i}."
            kc = R.heads(R.linear(x, p, pre + "self_attn.pc_proj"), H)
            ph = R.phi(kc.matmul(c["pt"].transpose(-1, -2)), cfg["causal_activation"])
            q = R.heads(R.linear(x, p, pre + "self_attn.q_proj"), H) * dh ** -0.5
            if self.tied:
                k = v = R.heads(R.linear(x, p, pre + "self_attn.c_proj"), H)
            else:
                k = R.heads(R.linear(x, p, pre + "self_attn.k_proj"), H)
                v = R.heads(R.linear(x, p, pre + "self_attn.v_proj"), H)
            o, c["ksum"], c["vsum"] = R.causal_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], ph[:, :, 0],
                                                    c["ksum"], c["vsum"], self.t, self.pmask)
            x = R.layer_norm(x + R.linear(R.merge(o.unsqueeze(2)), p, pre + "self_attn.out_proj"),
                             p, pre + "self_attn_layer_norm")
            qx = R.heads(R.linear(x, p, pre + "encoder_attn.q_proj"), H) * dh ** -0.5
            a = R.softmax(R.masked_fill_slots(qx.matmul(c["kx"].transpose(-1, -2)), self.pmask))
            y = R.linear(R.merge(a.matmul(c["vx"])), p, pre + "encoder_attn.out_proj")
            x = R.layer_norm(x + y, p, pre + "encoder_attn_layer_norm")
            x = R.layer_norm(x + R.ffn(p, pre, x, R.EVAL), p, pre + "final_layer_norm")
        return torch.log_softmax(x[:, 0].matmul(E.t()).double(), dim=-1)


def beam_search(dec, srcs, a):
    """fairseq SequenceGenerator semantics, one batch; returns [(tokens, score)] per sentence."""
    S, beam, K = len(srcs), a.beam, 2 * a.beam
    m = max(len(s) for s in srcs)
    src = torch.full((S, m), PAD, dtype=torch.long)
    for i, s in enumerate(srcs):
        src[i, :len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in srcs])
    max_len = [min(int(a.max_len_a * len(s) + a.max_len_b), 1023) for s in srcs]
    dec.begin(src, lengths, beam)
    active = list(range(S))
    toks = [[EOS] for _ in range(S * beam)]
    scores = [[] for _ in range(S * beam)]
    ignore = [False] * (S * beam)
    fin = [[] for _ in range(S)]
    step = 0
    while True:
        lp = dec.step(torch.tensor([t[step] for t in toks]))
        lp[torch.isnan(lp)] = -math.inf
        lp[:, PAD] = -math.inf
        lp[:, UNK] -= a.unkpen
        for r in range(lp.shape[0]):
            b = active[r // beam]
            if step >= max_len[b]:
                keep = lp[r, EOS].item()
                lp[r] = -math.inf
                lp[r, EOS] = keep
            elif step < a.min_len:
                lp[r, EOS] = -math.inf
        V = lp.shape[1]
        new_active, rows, ntoks, nscores, nignore = [], [], [], [], []
        for s, b in enumerate(active):
            nb = 1 if step == 0 else beam
            base = torch.tensor([scores[s * beam + k][-1] if step else 0.0 for k in range(nb)], dtype=torch.float64)
            flat = (lp[s * beam:s * beam + nb] + base[:, None]).reshape(-1)
            # top K, ties by index: stable sort of -score
            order = torch.sort(-flat, stable=True).indices[:K].tolist()
            cands = [(flat[j].item(), j // V, j % V) for j in order]
            cands += [(-math.inf, 0, UNK)] * (K - len(cands))
            eos = [c[2] == EOS and c[0] != -math.inf for c in cands]
            for j in range(beam):
                if eos[j] and not ignore[s * beam + j] and len(fin[b]) < beam:
                    r = s * beam + cands[j][1]
                    fin[b].append((toks[r][1:] + [EOS], cands[j][0] / (step + 1) ** a.lenpen))
                eos[j] = eos[j] or ignore[s * beam + j]
            if step >= max_len[b] or len(fin[b]) == beam:
                continue
            new_active.append(b)
            picked = [j for j in range(K) if not eos[j]] + [j for j in range(K) if eos[j]]
            for j in picked[:beam]:
                parent = s * beam + cands[j][1]
                rows.append(parent)
                ntoks.append(toks[parent] + [cands[j][2]])
                nscores.append(scores[parent] + [cands[j][0]])
                nignore.append(eos[j])
        if not new_active:
            break
        dec.reorder(torch.tensor(rows))
        active, toks, scores, ignore = new_active, ntoks, nscores, nignore
        step += 1
    out = []
    for f in fin:
        f.sort(key=lambda h: -h[1])
        out.append(f[0] if f else ([], -math.inf))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--lenpen", type=float, default=0.6)
    ap.add_argument("--max-len-a", type=float, default=0.0)
    ap.add_argument("--max-len-b", type=int, default=200)
    ap.add_argument("--min-len", type=int, default=1)
    ap.add_argument("--unkpen", type=float, default=0.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--float64", action="store_true", help="compute in float64 (default float32)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    R.FAST = not a.float64
    tensors, meta = load_file(a.checkpoint)
    cfg = json.loads(meta["config"])
    if cfg.get("arch", "luna") != "luna":
        sys.exit("decode_reference.py: only Luna checkpoints are supported")
    dtype = torch.float64 if a.float64 else torch.float32
    params = {k: torch.from_numpy(v).to(dtype) for k, v in tensors.items() if not k.startswith("optimizer.")}
    with open(a.ids) as f:
        srcs = [[int(t) for t in line.split()] + [EOS] for line in f]
    order = sorted(range(len(srcs)), key=lambda i: (len(srcs[i]), i))
    dec = Decoder(params, cfg)
    results = [None] * len(srcs)
    t0 = time.time()
    with torch.no_grad():
        for i in range(0, len(order), a.batch_size):
            idx = order[i:i + a.batch_size]
            for j, r in zip(idx, beam_search(dec, [srcs[j] for j in idx], a)):
                results[j] = r
    secs = time.time() - t0
    tokens = sum(len(r[0]) for r in results)
    for toks, score in results:
        print(" ".join(str(t) for t in toks[:-1]) + "\t" + repr(score / math.log(2)))
    print(f"decode_reference: {len(srcs)} sentences, {tokens} target tokens, beam {a.beam}, {a.threads} threads: "
          f"{secs:.2f} s, {len(srcs) / secs:.2f} sentences/s, {tokens / secs:.1f} target tokens/s", file=sys.stderr)


if __name__ == "__main__":
    main()
