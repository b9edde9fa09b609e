#!/usr/bin/python3
"""Self-checks of the PyTorch oracle (run manually; prints OK lines, exits 1 on the first failure).

    /usr/bin/python3 tests/reference/check_reference.py

1. parameter counts of luna-model.md section 6 (V = 40,624);
2. the causal Luna attention: cumsum (oracle) == tril form == step-by-step incremental recurrence, and
   full-model incremental decoding == full forward;
3. cross-checks of small pieces against torch built-ins / literal fairseq formulas (softplus, elu,
   sinusoid table, loss, one LunaAttn head by explicit loops);
4. autograd gradients == central finite differences (float64) on tiny models;
5. the fixtures in tests/fixtures/model reproduce (float64) and how far a float32 evaluation is from them.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import luna_reference as R  # noqa: E402
import make_fixtures as MF  # noqa: E402
import safetensors_io as st  # noqa: E402

torch.set_num_threads(1)
F64 = torch.float64


def ok(msg):
    print("OK  " + msg)


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def close(a, b, tol, what):
    err = (a - b).abs().max().item()
    scale = max(1.0, b.abs().max().item())
    if not err <= tol * scale:
        fail(f"{what}: max abs err {err:.3e} (scale {scale:.3e}, tol {tol:.1e})")
    return err


# ------------------------------------------------------------------------------------------- 1. counts
def check_counts():
    rows = [("luna_base_tied l=16", dict(projection_length=16), 69686272),
            ("luna_base_tied l=32", dict(projection_length=32), 69694464),
            ("luna_base_untied l=16", dict(projection_length=16, untie_luna_kv=True), 77565952),
            ("luna_base_untied l=32", dict(projection_length=32, untie_luna_kv=True), 77574144),
            ("transformer_base", dict(arch="transformer"), 64937984)]
    for name, over, want in rows:
        cfg = R.make_config(vocab_size=40624, **over)
        got = R.count_params(cfg)
        if got != want:
            fail(f"param count {name}: {got} != {want}")
        ok(f"param count {name}: {got:,}")
    # the tiny fixture architectures, by hand: embeddings + P + per-layer Linears/FFN/LNs
    d, f = 16, 32
    lin, ffn, ln = d * d + d, d * f + f + f * d + d, 2 * d
    cfg = R.make_config(vocab_size=45, d=d, ffn=f, layers=2, heads=4, projection_length=4)
    want = 45 * d + 4 * d + 2 * (5 * lin + ffn + 3 * ln) + 2 * (10 * lin + ffn + 4 * ln)
    if R.count_params(cfg) != want:
        fail("tiny count")
    ok(f"param count tiny tied (V=45 d=16 ffn=32 l=4 2+2): {want}")


# ------------------------------------------------------------------------------------------- 2. causal
def check_causal():
    g = torch.Generator().manual_seed(7)
    B, H, n, dh, L = 3, 2, 7, 5, 4
    q = torch.randn(B, H, n, dh, generator=g, dtype=F64)
    k = torch.randn(B, H, n, dh, generator=g, dtype=F64)
    v = torch.randn(B, H, n, dh, generator=g, dtype=F64)
    for act in ("softplus", "elu"):
        ph = R.phi(torch.randn(B, H, n, L, generator=g, dtype=F64) * 2, act)
        for pmask in (None, torch.tensor([[False, False, True, True], [False] * 4, [False, True, True, True]])):
            o_cum = R.causal_core(q, k, v, ph, pmask, "cumsum")
            o_tril = R.causal_core(q, k, v, ph, pmask, "tril")
            o_loop = R.causal_core(q, k, v, ph, pmask, "loop")
            e1 = close(o_tril, o_cum, 1e-12, "causal tril vs cumsum")
            e2 = close(o_loop, o_cum, 1e-12, "causal incremental vs cumsum")
            # literal formula of section 3 for one (b, h, t)
            b, h, t = 2, 1, 5
            S = sum((q[b, h, t] @ k[b, h, s]) * ph[b, h, s] for s in range(t + 1)) / (t + 1)
            if pmask is not None:
                S = S.masked_fill(pmask[b], float("-inf"))
            A = torch.softmax(S, -1)
            O = sum((A @ ph[b, h, s]) * v[b, h, s] for s in range(t + 1)) / (t + 1)
            close(o_cum[b, h, t], O, 1e-12, "causal literal formula")
            ok(f"causal {act:8s} pmask={'yes' if pmask is not None else 'no '}: cumsum == tril ({e1:.1e}) "
               f"== incremental state recurrence ({e2:.1e}) == literal sum")
    # whole model: incremental decoding with cached cross-attention K/V and per-layer state
    for name, over, sl, tl, seed in MF.CASES:
        if over.get("arch", "luna") != "luna":
            continue
        cfg, out, meta, _, _, _ = MF.build_case(name, over, sl, tl, seed)
        p = {k: torch.from_numpy(np.asarray(out[k].numpy())).to(F64) for k, _ in R.param_shapes(cfg)}
        src, sl_, prev = (out["input.src_tokens"].long(), out["input.src_lengths"].long(),
                          out["input.prev_output_tokens"].long())
        full = R.luna_forward(p, cfg, src, sl_, prev)
        inc = R.luna_decode_incremental(p, cfg, src, sl_, prev)
        e = close(inc, full, 1e-11, f"incremental decode {name}")
        tr = R.luna_forward(p, cfg, src, sl_, prev, R.Runtime(causal_impl="tril"))
        e2 = close(tr, full, 1e-11, f"tril model {name}")
        ok(f"model {name:22s}: incremental decoding == full forward ({e:.1e}); tril form ({e2:.1e})")


# ------------------------------------------------------------------------------------------- 3. pieces
def fairseq_sinusoid_table(num_embeddings, embedding_dim, padding_idx):
    # fairseq/modules/sinusoidal_positional_embedding.py get_embedding (float32, as fairseq computes it)
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.float) * -emb)
    emb = torch.arange(num_embeddings, dtype=torch.float).unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num_embeddings, -1)
    if padding_idx is not None:
        emb[padding_idx, :] = 0
    return emb


def check_pieces():
    z = torch.linspace(-40, 40, 2001, dtype=F64)
    close(R.phi(z, "softplus"), F.softplus(z, beta=math.log(2.0), threshold=20), 1e-14, "softplus")
    close(R.phi(z, "softplus")[:1000], torch.log2(1 + torch.pow(2.0, z[:1000])), 1e-12, "log2(1+2^z)")
    close(R.phi(z, "elu"), F.elu(z) + 1.0, 1e-14, "elu+1")
    ok("phi: softplus(beta=ln2, threshold 20) == log2(1+2^z); elu(z)+1")
    tokens = torch.tensor([[5, 6, 7, 2, 1, 1], [2, 9, 9, 9, 9, 2]])
    pos = R.make_positions(tokens, 1)
    if pos.tolist() != [[2, 3, 4, 5, 1, 1], [2, 3, 4, 5, 6, 7]]:
        fail(f"make_positions {pos.tolist()}")
    for d in (16, 24, 512):
        tab = fairseq_sinusoid_table(40, d, 1).to(F64)
        pe = R.sinusoid(pos, d, F64) * tokens.ne(1).unsqueeze(-1)
        close(pe, tab[pos], 1e-5, f"sinusoid d={d}")  # fairseq builds the table in fp32
        close(R.sinusoid(torch.arange(32), d, F64), fairseq_sinusoid_table(32, d, None).to(F64), 1e-5, "P positions")
    ok("positions: make_positions + fairseq sinusoid table (pad row zero); P uses positions 0..l-1")
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 11, generator=g, dtype=F64) * 3
    target = torch.tensor([[4, 5, 2, 1, 1], [7, 8, 9, 10, 2]])
    loss, nll = R.label_smoothed_loss(logits, target, 0.1)
    lp = F.log_softmax(logits, -1).view(-1, 11)
    t = target.view(-1)
    keep = t != 1
    nll2 = F.nll_loss(lp, t, ignore_index=1, reduction="sum")
    loss2 = 0.9 * nll2 + 0.1 / 11 * (-lp[keep].sum())
    close(loss, loss2, 1e-13, "loss")
    close(nll, nll2, 1e-13, "nll")
    ok("label-smoothed loss == (1-eps) nll + eps/V sum_v -log p_v over non-pad tokens")
    # one LunaAttn (tied) evaluated with explicit per-head, per-position loops
    d, H = 8, 2
    cfg = R.make_config(vocab_size=11, d=d, ffn=12, layers=1, heads=H, projection_length=3)
    params = R.to_dtype(R.init_params(cfg, g, True), F64)
    x = torch.randn(2, 4, d, generator=g, dtype=F64)
    p = torch.randn(2, 3, d, generator=g, dtype=F64)
    c_pad = torch.tensor([[False, False, True, True], [False] * 4])
    pmask = torch.tensor([[False, False, True], [False] * 3])
    pre = "encoder.layers.0.self_attn"
    yx, yp = R.luna_attn(params, pre, x, p, x, c_pad, pmask, H, True)

    def lin(v, name):
        return params[f"{pre}.{name}.weight"] @ v + params[f"{pre}.{name}.bias"]
    dh = d // H
    for b in range(2):
        yp2 = torch.zeros(3, d, dtype=F64)
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            for j in range(3):
                qj = lin(p[b, j], "pq_proj")[sl] / math.sqrt(dh)
                sc = [qj @ lin(x[b, i], "pc_proj")[sl] if not c_pad[b, i] else float("-inf") for i in range(4)]
                a = torch.softmax(torch.tensor(sc, dtype=F64), 0)
                yp2[j, sl] = sum(a[i] * lin(x[b, i], "pc_proj")[sl] for i in range(4))
        close(yp[b], yp2, 1e-12, "LunaAttn pack loops")
        for i in range(4):
            o = torch.zeros(d, dtype=F64)
            for h in range(H):
                sl = slice(h * dh, (h + 1) * dh)
                qi = lin(x[b, i], "q_proj")[sl] / math.sqrt(dh)
                kv = [lin(yp2[j], "c_proj")[sl] for j in range(3)]
                sc = torch.tensor([qi @ kv[j] if not pmask[b, j] else float("-inf") for j in range(3)], dtype=F64)
                a = torch.softmax(sc, 0)
                o[sl] = sum(a[j] * kv[j] for j in range(3))
            close(yx[b, i], lin(o, "out_proj"), 1e-12, "LunaAttn unpack loops")
    ok("LunaAttn (tied) == explicit per-head loops (pack with context pad mask, unpack with P mask)")


# ------------------------------------------------------------------------------------------- 4. grads
def fd_check(name, cfg, src_lens, tgt_lens, seed, per_tensor=4, h=1e-6, tol=1e-6):
    g = torch.Generator().manual_seed(seed)
    params = R.to_dtype(R.init_params(cfg, g, True), F64)
    src, sl, prev, tgt = MF.make_batch(g, cfg["vocab_size"], src_lens, tgt_lens)

    def f(pp):
        return R.label_smoothed_loss(R.forward(pp, cfg, src, sl, prev), tgt, cfg["label_smoothing"])[0]
    pg = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    names = list(pg)
    grads = torch.autograd.grad(f(pg), [pg[k] for k in names], allow_unused=True)
    worst, n_checked = 0.0, 0
    for k, gr in zip(names, grads):
        gr = torch.zeros_like(params[k]) if gr is None else gr
        flat = params[k].view(-1)
        idx = torch.randperm(flat.numel(), generator=g)[:per_tensor].tolist()
        if k == "encoder.embed_tokens.weight":
            idx += [cfg["padding_idx"] * params[k].shape[1]]  # the pad row (output-projection gradient only)
        for i in idx:
            old = flat[i].item()
            flat[i] = old + h
            fp = f(params).item()
            flat[i] = old - h
            fm = f(params).item()
            flat[i] = old
            fd = (fp - fm) / (2 * h)
            an = gr.view(-1)[i].item()
            err = abs(fd - an) / max(1.0, abs(an))
            worst = max(worst, err)
            n_checked += 1
            if err > tol:
                fail(f"finite differences {name} {k}[{i}]: autograd {an:.10e} fd {fd:.10e}")
    ok(f"grad == finite differences, {name:34s} {n_checked:4d} elements, worst rel err {worst:.1e}")


def check_grads():
    tiny = dict(vocab_size=13, d=8, ffn=12, layers=2, heads=2, label_smoothing=0.1)
    fd_check("luna tied softplus, P mask active", R.make_config(projection_length=5, **tiny), [3, 6], [4, 3], 11)
    fd_check("luna untied elu, dynamic, l > src", R.make_config(projection_length=9, untie_luna_kv=True,
                                                                causal_activation="elu", **tiny), [4, 6], [5, 2], 12)
    fd_check("luna tied softplus, fixed projection", R.make_config(projection_length=4, fix_projection_length=True,
                                                                   **tiny), [2, 5], [3, 5], 13)
    fd_check("transformer", R.make_config(arch="transformer", **tiny), [3, 6], [5, 3], 14)


# ------------------------------------------------------------------------------------------- 5. fixtures
def rel_err(a, b):
    """max |a-b| / max(|b|_inf, tiny): norm-wise relative error"""
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def check_fixtures():
    fdir = os.path.join(MF.ROOT, "tests", "fixtures", "model")
    for name, *_ in MF.CASES:
        path = os.path.join(fdir, name + ".safetensors")
        if not os.path.exists(path):
            fail(f"{path} missing: run make_fixtures.py")
        t, meta = st.load_file(path)
        cfg = json.loads(meta["config"])
        names = [k for k, _ in R.param_shapes(cfg)]
        for k, shape in R.param_shapes(cfg):
            if tuple(t[k].shape) != tuple(shape) or t[k].dtype != np.float32:
                fail(f"{name}: {k} shape {t[k].shape} dtype {t[k].dtype}")
            if tuple(t["grad." + k].shape) != tuple(shape):
                fail(f"{name}: grad.{k} shape")
        extra = set(t) - set(names) - {"grad." + k for k in names} - {
            "input.src_tokens", "input.src_lengths", "input.prev_output_tokens", "input.target",
            "output.logits", "output.loss", "output.nll"}
        if extra:
            fail(f"{name}: unexpected tensors {extra}")
        if np.any(t["encoder.embed_tokens.weight"][cfg["padding_idx"]] != 0):
            fail(f"{name}: pad embedding row not zero")
        src = torch.from_numpy(t["input.src_tokens"]).long()
        sl = torch.from_numpy(t["input.src_lengths"]).long()
        prev = torch.from_numpy(t["input.prev_output_tokens"]).long()
        tgt = torch.from_numpy(t["input.target"]).long()
        res = {}
        for dt in (F64, torch.float32):
            p = {k: torch.from_numpy(t[k]).to(dt).requires_grad_(True) for k in names}
            logits = R.forward(p, cfg, src, sl, prev)
            loss, nll = R.label_smoothed_loss(logits, tgt, cfg["label_smoothing"])
            grads = torch.autograd.grad(loss, [p[k] for k in names], allow_unused=True)
            grads = [torch.zeros_like(p[k]) if gr is None else gr for k, gr in zip(names, grads)]
            res[dt] = (logits.detach(), loss.detach(), nll.detach(), grads)
        lg, ls, nl, gr = res[F64]
        close(lg, torch.from_numpy(t["output.logits"]).to(F64), 1e-7, f"{name} logits reproduce")
        close(ls.reshape(1), torch.from_numpy(t["output.loss"]).to(F64), 1e-7, f"{name} loss reproduce")
        close(nl.reshape(1), torch.from_numpy(t["output.nll"]).to(F64), 1e-7, f"{name} nll reproduce")
        for k, g64 in zip(names, gr):
            ref = torch.from_numpy(t["grad." + k]).to(F64)
            if (g64 - ref).abs().max().item() > 1e-7 * max(1.0, ref.abs().max().item()):
                fail(f"{name}: grad.{k} does not reproduce")
        # float32 evaluation against the float64 oracle (what a fp32 C implementation can expect)
        lg32, ls32, _, gr32 = res[torch.float32]
        e_logit = rel_err(lg32.to(F64), lg)
        e_loss = abs(ls32.item() - ls.item()) / abs(ls.item())
        G = max(b.abs().max().item() for b in gr)
        # recommended metric: per tensor, max|a-b| / max(max|b|, 1e-3 * max over all gradients) -- the floor
        # covers tensors whose gradient is mathematically zero (see README: k_proj/pk_proj biases, last P LN)
        e_grad = max((a.to(F64) - b).abs().max().item() / max(b.abs().max().item(), 1e-3 * G)
                     for a, b in zip(gr32, gr))
        worst_elem = max(((a.to(F64) - b).abs() / (b.abs() + 1e-3 * G)).max().item() for a, b in zip(gr32, gr))
        ok(f"fixture {name:22s} reproduces; fp32 vs fp64: logits {e_logit:.1e}, loss {e_loss:.1e}, "
           f"grads per-tensor {e_grad:.1e}, elementwise {worst_elem:.1e}")


def main():
    check_counts()
    check_causal()
    check_pieces()
    check_grads()
    check_fixtures()
    print("ALL OK")


if __name__ == "__main__":
    main()
