"""Independent PyTorch oracle of the Luna seq2seq model (luna-model.md) and of the transformer_base baseline.

Written from /work/shared/spec/luna-model.md; parameter names follow its section 7 (= the official fairseq
Luna state_dict).  The model is purely functional: a dict `params` {name: tensor} plus a config dict `cfg`
(the same keys as the fixtures' `__metadata__["config"]`).  Run it in float64 for golden values
(`to_dtype(params, torch.float64)`), in float32 for benchmarks.

Shapes are batch-first: x [B, T, d], P [B, L, d]; per head [B, H, T, d_h].

Causal Luna attention (section 3) has three interchangeable implementations (`causal_impl`):
  "cumsum"  the oracle: explicit running sums of outer products (torch.cumsum over s <= t), divided by t.
            packed keys Kbar_t = (1/t) sum_{s<=t} K_s Phi_s^T  [d_h, l],
            packed values Vbar_t = (1/t) sum_{s<=t} Phi_s^T V_s [l, d_h].
  "tril"    the same sums written as lower-triangular masked products:
            S = ((Q K^T) * M) Phi / t,  O = ((A Phi^T) * M) V / t   (M = [s <= t]).  O(n^2) but GEMM-shaped.
  "loop"    the incremental decoding recurrence, one step at a time (state P~, sum K Phi^T, sum Phi^T V, t).
"""
import math

import torch
import torch.nn.functional as F

PAD = 1
EOS = 2
LN_EPS = 1e-5
# FAST = True swaps the hand-written layer_norm / softmax / log-softmax for torch's fused kernels (same math);
# the benchmark sets it, the oracle and the fixtures do not.
FAST = False


# ----------------------------------------------------------------------------------------------------------
# configuration

def make_config(arch="luna", vocab_size=40624, d=512, ffn=2048, layers=6, heads=8, projection_length=32,
                untie_luna_kv=False, causal_activation="softplus", fix_projection_length=False,
                label_smoothing=0.1, dropout=0.0, encoder_layers=None, decoder_layers=None):
    return {
        "arch": arch,
        "vocab_size": vocab_size,
        "padding_idx": PAD,
        "encoder_embed_dim": d,
        "encoder_ffn_embed_dim": ffn,
        "encoder_layers": layers if encoder_layers is None else encoder_layers,
        "encoder_attention_heads": heads,
        "decoder_embed_dim": d,
        "decoder_ffn_embed_dim": ffn,
        "decoder_layers": layers if decoder_layers is None else decoder_layers,
        "decoder_attention_heads": heads,
        "projection_length": projection_length,
        "untie_luna_kv": bool(untie_luna_kv),
        "causal_activation": causal_activation,
        "fix_projection_length": bool(fix_projection_length),
        "label_smoothing": label_smoothing,
        "dropout": dropout,
    }


class Runtime:
    """Dropout probabilities, train/eval, and which causal implementation to use."""

    def __init__(self, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, training=False,
                 causal_impl="cumsum"):
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.training = training
        self.causal_impl = causal_impl

    def drop(self, x, p):
        if self.training and p > 0:
            return F.dropout(x, p, training=True)
        return x


EVAL = Runtime()


# ----------------------------------------------------------------------------------------------------------
# parameter names / shapes (section 7), counts (section 6), init (section 5)

def _lin(prefix, n_out, n_in):
    return [(prefix + ".weight", (n_out, n_in)), (prefix + ".bias", (n_out,))]


def _ln(prefix, d):
    return [(prefix + ".weight", (d,)), (prefix + ".bias", (d,))]


def luna_attn_proj_names(tied):
    return ["pq_proj", "q_proj", "pc_proj", "c_proj"] if tied else \
        ["pq_proj", "q_proj", "pk_proj", "pv_proj", "k_proj", "v_proj"]


def causal_proj_names(tied):
    return ["pq_proj", "q_proj", "pc_proj", "c_proj"] if tied else ["pq_proj", "q_proj", "pc_proj", "k_proj", "v_proj"]


def param_shapes(cfg):
    """Ordered list of (name, shape); the shared embedding is listed once (encoder.embed_tokens.weight)."""
    V, d = cfg["vocab_size"], cfg["encoder_embed_dim"]
    assert cfg["decoder_embed_dim"] == d, "shared embeddings need equal encoder/decoder dims"
    fe, fd = cfg["encoder_ffn_embed_dim"], cfg["decoder_ffn_embed_dim"]
    out = [("encoder.embed_tokens.weight", (V, d))]
    if cfg["arch"] == "luna":
        tied = not cfg["untie_luna_kv"]
        out.append(("encoder.projected_embeddings", (cfg["projection_length"], d)))
        for i in range(cfg["encoder_layers"]):
            p = f"encoder.layers.{i}."
            for n in luna_attn_proj_names(tied) + ["out_proj"]:
                out += _lin(p + "self_attn." + n, d, d)
            out += _ln(p + "self_attn_layer_norm", d) + _ln(p + "self_atten_proj_layer_norm", d)
            out += _lin(p + "fc1", fe, d) + _lin(p + "fc2", d, fe) + _ln(p + "final_layer_norm", d)
        for i in range(cfg["decoder_layers"]):
            p = f"decoder.layers.{i}."
            for n in causal_proj_names(tied) + ["out_proj"]:
                out += _lin(p + "self_attn." + n, d, d)
            out += _ln(p + "self_attn_layer_norm", d)
            for n in luna_attn_proj_names(tied) + ["out_proj"]:
                out += _lin(p + "encoder_attn." + n, d, d)
            out += _ln(p + "encoder_attn_layer_norm", d) + _ln(p + "encoder_atten_proj_layer_norm", d)
            out += _lin(p + "fc1", fd, d) + _lin(p + "fc2", d, fd) + _ln(p + "final_layer_norm", d)
    elif cfg["arch"] == "transformer":
        mha = ["k_proj", "v_proj", "q_proj", "out_proj"]  # fairseq MultiheadAttention registration order
        for i in range(cfg["encoder_layers"]):
            p = f"encoder.layers.{i}."
            for n in mha:
                out += _lin(p + "self_attn." + n, d, d)
            out += _ln(p + "self_attn_layer_norm", d)
            out += _lin(p + "fc1", fe, d) + _lin(p + "fc2", d, fe) + _ln(p + "final_layer_norm", d)
        for i in range(cfg["decoder_layers"]):
            p = f"decoder.layers.{i}."
            for n in mha:
                out += _lin(p + "self_attn." + n, d, d)
            out += _ln(p + "self_attn_layer_norm", d)
            for n in mha:
                out += _lin(p + "encoder_attn." + n, d, d)
            out += _ln(p + "encoder_attn_layer_norm", d)
            out += _lin(p + "fc1", fd, d) + _lin(p + "fc2", d, fd) + _ln(p + "final_layer_norm", d)
    else:
        raise ValueError(cfg["arch"])
    return out


def count_params(cfg):
    return sum(math.prod(s) for _, s in param_shapes(cfg))


def _uniform(shape, bound, g):
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * bound


def _xavier(shape, gain, g):
    fan_out, fan_in = shape
    return _uniform(shape, gain * math.sqrt(6.0 / (fan_in + fan_out)), g)


def init_params(cfg, generator, randomize_norms_and_biases=False, dtype=torch.float32):
    """Section 5 initialisation.  randomize_norms_and_biases: for test fixtures, also draw LayerNorm gains
    U(0.6, 1.4), LayerNorm biases N(0, 0.1^2) and out_proj biases U(+-1/sqrt(fan_in)) so they are exercised."""
    g = generator
    d = cfg["encoder_embed_dim"]
    params = {}
    for name, shape in param_shapes(cfg):
        leaf = name.rsplit(".", 1)[-1] if "." in name else name
        mod = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        if name == "encoder.embed_tokens.weight":
            t = torch.randn(shape, generator=g, dtype=torch.float64) * d ** -0.5
            t[cfg["padding_idx"]] = 0.0
        elif name == "encoder.projected_embeddings":
            t = torch.randn(shape, generator=g, dtype=torch.float64) * d ** -0.5
        elif mod.endswith("layer_norm"):
            if leaf == "weight":
                t = 0.6 + 0.8 * torch.rand(shape, generator=g, dtype=torch.float64) if randomize_norms_and_biases \
                    else torch.ones(shape, dtype=torch.float64)
            else:
                t = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64) if randomize_norms_and_biases \
                    else torch.zeros(shape, dtype=torch.float64)
        elif mod in ("fc1", "fc2"):
            fan_in = shape[1] if leaf == "weight" else _fan_in(params, name)
            t = _uniform(shape, fan_in ** -0.5, g)
        elif mod == "out_proj":
            if leaf == "weight":
                t = _xavier(shape, 1.0, g)
            else:
                t = _uniform(shape, d ** -0.5, g) if randomize_norms_and_biases else torch.zeros(shape, dtype=torch.float64)
        elif mod.endswith("_proj"):  # pq/q/pc/c/pk/pv/k/v (Luna) and q/k/v (transformer)
            if leaf == "weight":
                t = _xavier(shape, 1.0 / math.sqrt(2.0), g)
            else:
                t = _uniform(shape, d ** -0.5, g)
        else:
            raise ValueError(name)
        params[name] = t.to(dtype)
    return params


def _fan_in(params, bias_name):
    return params[bias_name[:-len("bias")] + "weight"].shape[1]


def to_dtype(params, dtype, requires_grad=False):
    return {k: v.detach().to(dtype).requires_grad_(requires_grad) for k, v in params.items()}


# ----------------------------------------------------------------------------------------------------------
# building blocks

def linear(x, params, prefix):
    return x.matmul(params[prefix + ".weight"].t()) + params[prefix + ".bias"]


def layer_norm(x, params, prefix):
    if FAST:
        return F.layer_norm(x, x.shape[-1:], params[prefix + ".weight"], params[prefix + ".bias"], LN_EPS)
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased variance, as torch.nn.LayerNorm
    return (x - mu) / torch.sqrt(var + LN_EPS) * params[prefix + ".weight"] + params[prefix + ".bias"]


def softmax(x, dim=-1):
    if FAST:
        return torch.softmax(x, dim)
    m = x.amax(dim, keepdim=True).detach()
    e = torch.exp(x - m)
    return e / e.sum(dim, keepdim=True)


def heads(x, H):
    """[B, T, d] -> [B, H, T, d_h]"""
    B, T, d = x.shape
    return x.view(B, T, H, d // H).transpose(1, 2)


def merge(x):
    """[B, H, T, d_h] -> [B, T, d]"""
    B, H, T, dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * dh)


def decoder_tables(params):
    """(decoder input table name, output projection name): a model converted from fairseq without
    --share-all-embeddings has decoder.embed_tokens.weight, and without
    --share-decoder-input-output-embed also decoder.output_projection.weight; otherwise both are the
    shared encoder.embed_tokens.weight."""
    dec = "decoder.embed_tokens.weight" if "decoder.embed_tokens.weight" in params else "encoder.embed_tokens.weight"
    out = "decoder.output_projection.weight" if "decoder.output_projection.weight" in params else dec
    return dec, out


def sinusoid(positions, d, dtype):
    """fairseq sinusoid of integer positions (any shape) -> [..., d]; first half sin, second half cos."""
    half = d // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float64, device=positions.device)
                     * -(math.log(10000.0) / (half - 1)))
    ang = positions.to(torch.float64).unsqueeze(-1) * freq
    emb = torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)
    if d % 2 == 1:
        emb = torch.cat([emb, torch.zeros_like(emb[..., :1])], dim=-1)
    return emb.to(dtype)


def make_positions(tokens, padding_idx):
    """fairseq.utils.make_positions: real tokens numbered padding_idx+1, ... ; pads get padding_idx."""
    mask = tokens.ne(padding_idx).long()
    return torch.cumsum(mask, dim=1) * mask + padding_idx


def embed(params, cfg, tokens, table="encoder.embed_tokens.weight"):
    """sqrt(d) * E[token] + sinusoid(position); pads get a zero position vector (fairseq zeroes that row)."""
    E = params[table]
    d = E.shape[1]
    pad = cfg["padding_idx"]
    pos = make_positions(tokens, pad)
    pe = sinusoid(pos, d, E.dtype) * tokens.ne(pad).unsqueeze(-1).to(E.dtype)
    return math.sqrt(d) * E[tokens] + pe


def phi(z, activation):
    if activation == "softplus":  # beta = ln 2: log2(1 + 2^z), linear above beta*z > 20 (torch threshold)
        beta = math.log(2.0)
        bz = beta * z
        return torch.where(bz > 20.0, z, torch.log1p(torch.exp(torch.clamp(bz, max=20.0))) / beta)
    if activation == "elu":
        return torch.where(z > 0, z + 1.0, torch.exp(torch.clamp(z, max=0.0)))
    raise ValueError(activation)


def masked_fill_slots(scores, pmask):
    """scores [B, H, T, L]; pmask [B, L] bool (True = hidden slot) or None."""
    if pmask is None:
        return scores
    return scores.masked_fill(pmask[:, None, None, :], float("-inf"))


# ----------------------------------------------------------------------------------------------------------
# Luna attention (section 2)

def luna_attn(params, prefix, x, p, c, c_pad, pmask, H, tied, rt=EVAL):
    """LunaAttn(X, P, C) -> (Y_X [B, n, d], Y_P [B, L, d]).
    c_pad [B, m] bool: context pads (masked in the pack softmax); pmask [B, L] bool: P mask (unpack)."""
    d = x.shape[-1]
    dh = d // H
    # pack
    qp = heads(linear(p, params, prefix + ".pq_proj"), H) * dh ** -0.5  # [B,H,L,dh]
    if tied:
        kc = vc = heads(linear(c, params, prefix + ".pc_proj"), H)       # [B,H,m,dh]
    else:
        kc = heads(linear(c, params, prefix + ".pk_proj"), H)
        vc = heads(linear(c, params, prefix + ".pv_proj"), H)
    s = qp.matmul(kc.transpose(-1, -2))                                   # [B,H,L,m]
    s = s.masked_fill(c_pad[:, None, None, :], float("-inf"))
    a = rt.drop(softmax(s), rt.attention_dropout)
    y_p = merge(a.matmul(vc))                                            # [B,L,d], no output projection
    # unpack
    q = heads(linear(x, params, prefix + ".q_proj"), H) * dh ** -0.5     # [B,H,n,dh]
    if tied:
        k = v = heads(linear(y_p, params, prefix + ".c_proj"), H)        # [B,H,L,dh]
    else:
        k = heads(linear(y_p, params, prefix + ".k_proj"), H)
        v = heads(linear(y_p, params, prefix + ".v_proj"), H)
    s = masked_fill_slots(q.matmul(k.transpose(-1, -2)), pmask)          # [B,H,n,L]
    a = rt.drop(softmax(s), rt.attention_dropout)
    y_x = linear(merge(a.matmul(v)), params, prefix + ".out_proj")
    return y_x, y_p


# ----------------------------------------------------------------------------------------------------------
# causal Luna attention (section 3)

def causal_core(q, k, v, ph, pmask, impl="cumsum", rt=EVAL):
    """q, k, v [B,H,n,dh] (q already scaled), ph = dropped Phi [B,H,n,L] -> O [B,H,n,dh]."""
    n = q.shape[2]
    t = torch.arange(1, n + 1, dtype=q.dtype, device=q.device).view(1, 1, n, 1)
    if impl == "cumsum":
        kbar = torch.cumsum(k.unsqueeze(-1) * ph.unsqueeze(-2), dim=2) / t.unsqueeze(-1)  # [B,H,n,dh,L]
        s = torch.einsum("bhtd,bhtdl->bhtl", q, kbar)
        a = rt.drop(softmax(masked_fill_slots(s, pmask)), rt.attention_dropout)
        vbar = torch.cumsum(ph.unsqueeze(-1) * v.unsqueeze(-2), dim=2) / t.unsqueeze(-1)  # [B,H,n,L,dh]
        return torch.einsum("bhtl,bhtld->bhtd", a, vbar)
    if impl == "tril":
        M = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        qk = q.matmul(k.transpose(-1, -2)).masked_fill(~M, 0.0)            # [B,H,n(t),n(s)]
        s = qk.matmul(ph) / t
        a = rt.drop(softmax(masked_fill_slots(s, pmask)), rt.attention_dropout)
        ap = a.matmul(ph.transpose(-1, -2)).masked_fill(~M, 0.0)         # [B,H,t,s] = A_t . Phi_s
        return ap.matmul(v) / t
    if impl == "loop":
        B, H, _, dh = q.shape
        L = ph.shape[-1]
        ksum = q.new_zeros(B, H, dh, L)
        vsum = q.new_zeros(B, H, L, dh)
        outs = []
        for i in range(n):
            st = causal_step(q[:, :, i], k[:, :, i], v[:, :, i], ph[:, :, i], ksum, vsum, i + 1, pmask, rt)
            o, ksum, vsum = st
            outs.append(o)
        return torch.stack(outs, dim=2)
    raise ValueError(impl)


def causal_step(q_t, k_t, v_t, ph_t, ksum, vsum, t, pmask, rt=EVAL):
    """One incremental step.  q_t,k_t,v_t [B,H,dh], ph_t [B,H,L]; state ksum = sum K_s Phi_s^T [B,H,dh,L],
    vsum = sum Phi_s^T V_s [B,H,L,dh], t = 1-based step.  Returns (O_t [B,H,dh], ksum', vsum')."""
    ksum = ksum + k_t.unsqueeze(-1) * ph_t.unsqueeze(-2)
    vsum = vsum + ph_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    s = torch.einsum("bhd,bhdl->bhl", q_t, ksum) / t
    if pmask is not None:
        s = s.masked_fill(pmask[:, None, :], float("-inf"))
    a = rt.drop(softmax(s), rt.attention_dropout)
    o = torch.einsum("bhl,bhld->bhd", a, vsum) / t
    return o, ksum, vsum


def causal_luna_qkvphi(params, prefix, x, p, H, tied, activation, rt=EVAL):
    """Projections of section 3 steps 1-3: returns q (scaled), k, v [B,H,n,dh] and dropped Phi [B,H,n,L]."""
    d = x.shape[-1]
    dh = d // H
    pt = heads(linear(p, params, prefix + ".pq_proj"), H) * dh ** -0.5   # P~ [B,H,L,dh]
    kc = heads(linear(x, params, prefix + ".pc_proj"), H)                # [B,H,n,dh]
    ph = rt.drop(phi(kc.matmul(pt.transpose(-1, -2)), activation), rt.attention_dropout)  # [B,H,n,L]
    q = heads(linear(x, params, prefix + ".q_proj"), H) * dh ** -0.5
    if tied:
        k = v = heads(linear(x, params, prefix + ".c_proj"), H)
    else:
        k = heads(linear(x, params, prefix + ".k_proj"), H)
        v = heads(linear(x, params, prefix + ".v_proj"), H)
    return q, k, v, ph


def causal_luna(params, prefix, x, p, pmask, H, tied, activation, rt=EVAL):
    q, k, v, ph = causal_luna_qkvphi(params, prefix, x, p, H, tied, activation, rt)
    o = causal_core(q, k, v, ph, pmask, rt.causal_impl, rt)
    return linear(merge(o), params, prefix + ".out_proj")


# ----------------------------------------------------------------------------------------------------------
# Luna layers and model (sections 1, 4)

def ffn(params, prefix, x, rt):
    h = rt.drop(torch.relu(linear(x, params, prefix + "fc1")), rt.activation_dropout)
    return linear(h, params, prefix + "fc2")


def luna_encoder_layer(params, i, x, p, src_pad, pmask, cfg, rt=EVAL):
    pre = f"encoder.layers.{i}."
    H = cfg["encoder_attention_heads"]
    xh, ph = luna_attn(params, pre + "self_attn", x, p, x, src_pad, pmask, H, not cfg["untie_luna_kv"], rt)
    x = layer_norm(x + rt.drop(xh, rt.dropout), params, pre + "self_attn_layer_norm")
    p = layer_norm(p + rt.drop(ph, rt.dropout), params, pre + "self_atten_proj_layer_norm")
    x = layer_norm(x + rt.drop(ffn(params, pre, x, rt), rt.dropout), params, pre + "final_layer_norm")
    return x, p


def luna_decoder_layer(params, i, x, p, enc, src_pad, pmask, cfg, rt=EVAL):
    pre = f"decoder.layers.{i}."
    H = cfg["decoder_attention_heads"]
    tied = not cfg["untie_luna_kv"]
    y = causal_luna(params, pre + "self_attn", x, p, pmask, H, tied, cfg["causal_activation"], rt)
    x = layer_norm(x + rt.drop(y, rt.dropout), params, pre + "self_attn_layer_norm")
    xh, ph = luna_attn(params, pre + "encoder_attn", x, p, enc, src_pad, pmask, H, tied, rt)
    x = layer_norm(x + rt.drop(xh, rt.dropout), params, pre + "encoder_attn_layer_norm")
    p = layer_norm(p + rt.drop(ph, rt.dropout), params, pre + "encoder_atten_proj_layer_norm")
    x = layer_norm(x + rt.drop(ffn(params, pre, x, rt), rt.dropout), params, pre + "final_layer_norm")
    return x, p


def projection_slots(cfg, src_lengths):
    """Returns (L_b, pmask [B, L_b] bool or None) -- section 1, dynamic vs fixed projection."""
    l = cfg["projection_length"]
    if cfg["fix_projection_length"]:
        return l, None
    L = min(l, int(src_lengths.max()))
    pmask = torch.arange(L, device=src_lengths.device).unsqueeze(0) >= src_lengths.unsqueeze(1)
    return L, pmask


def luna_encode(params, cfg, src_tokens, src_lengths, rt=EVAL):
    """-> (enc_out [B,m,d], encoder-packed P [B,L,d], src_pad [B,m], pmask [B,L] or None)"""
    d = cfg["encoder_embed_dim"]
    B = src_tokens.shape[0]
    x = rt.drop(embed(params, cfg, src_tokens), rt.dropout)
    L, pmask = projection_slots(cfg, src_lengths)
    P = params["encoder.projected_embeddings"][:L]
    p0 = math.sqrt(d) * P + sinusoid(torch.arange(L, device=P.device), d, P.dtype)
    p = rt.drop(p0.unsqueeze(0).expand(B, L, d), rt.dropout)  # dropout drawn per sentence
    src_pad = src_tokens.eq(cfg["padding_idx"])
    for i in range(cfg["encoder_layers"]):
        x, p = luna_encoder_layer(params, i, x, p, src_pad, pmask, cfg, rt)
    return x, p, src_pad, pmask


def luna_forward(params, cfg, src_tokens, src_lengths, prev_output_tokens, rt=EVAL):
    """-> logits [B, n, V]"""
    enc, p, src_pad, pmask = luna_encode(params, cfg, src_tokens, src_lengths, rt)
    dec, out = decoder_tables(params)
    x = rt.drop(embed(params, cfg, prev_output_tokens, dec), rt.dropout)
    for i in range(cfg["decoder_layers"]):
        x, p = luna_decoder_layer(params, i, x, p, enc, src_pad, pmask, cfg, rt)
    return x.matmul(params[out].t())


def luna_decode_incremental(params, cfg, src_tokens, src_lengths, prev_output_tokens):
    """Teacher-forced incremental decoding (section 3 state, section 2 cache): one target position at a time.
    Returns logits [B, n, V]; must equal luna_forward (eval mode)."""
    enc, p, src_pad, pmask = luna_encode(params, cfg, src_tokens, src_lengths)
    Ld = cfg["decoder_layers"]
    H = cfg["decoder_attention_heads"]
    tied = not cfg["untie_luna_kv"]
    d = cfg["decoder_embed_dim"]
    dh = d // H
    B, n = prev_output_tokens.shape
    # per-layer source-only quantities: decoder P entering each layer, P~, cached unpack K/V
    layer_p, cache = [], []
    for i in range(Ld):
        pre = f"decoder.layers.{i}."
        layer_p.append(p)
        pt = heads(linear(p, params, pre + "self_attn.pq_proj"), H) * dh ** -0.5
        # cross-attention pack (depends on source only) and its unpack keys/values
        _, y_p = luna_attn(params, pre + "encoder_attn", p[:, :1], p, enc, src_pad, pmask, H, tied)
        if tied:
            kx = vx = heads(linear(y_p, params, pre + "encoder_attn.c_proj"), H)
        else:
            kx = heads(linear(y_p, params, pre + "encoder_attn.k_proj"), H)
            vx = heads(linear(y_p, params, pre + "encoder_attn.v_proj"), H)
        L = p.shape[1]
        cache.append({"pt": pt, "kx": kx, "vx": vx, "ksum": p.new_zeros(B, H, dh, L), "vsum": p.new_zeros(B, H, L, dh)})
        p = layer_norm(p + y_p, params, pre + "encoder_atten_proj_layer_norm")
    # positions of the full prefix are the same as in training (make_positions on the whole row)
    dec, out = decoder_tables(params)
    x_all = embed(params, cfg, prev_output_tokens, dec)
    outs = []
    for t in range(n):
        x = x_all[:, t:t + 1]
        for i in range(Ld):
            pre = f"decoder.layers.{i}."
            c = cache[i]
            kc = heads(linear(x, params, pre + "self_attn.pc_proj"), H)            # [B,H,1,dh]
            ph = phi(kc.matmul(c["pt"].transpose(-1, -2)), cfg["causal_activation"])  # [B,H,1,L]
            q = heads(linear(x, params, pre + "self_attn.q_proj"), H) * dh ** -0.5
            if tied:
                k = v = heads(linear(x, params, pre + "self_attn.c_proj"), H)
            else:
                k = heads(linear(x, params, pre + "self_attn.k_proj"), H)
                v = heads(linear(x, params, pre + "self_attn.v_proj"), H)
            o, c["ksum"], c["vsum"] = causal_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], ph[:, :, 0],
                                                  c["ksum"], c["vsum"], t + 1, pmask)
            y = linear(merge(o.unsqueeze(2)), params, pre + "self_attn.out_proj")
            x = layer_norm(x + y, params, pre + "self_attn_layer_norm")
            qx = heads(linear(x, params, pre + "encoder_attn.q_proj"), H) * dh ** -0.5
            a = softmax(masked_fill_slots(qx.matmul(c["kx"].transpose(-1, -2)), pmask))
            y = linear(merge(a.matmul(c["vx"])), params, pre + "encoder_attn.out_proj")
            x = layer_norm(x + y, params, pre + "encoder_attn_layer_norm")
            x = layer_norm(x + ffn(params, pre, x, EVAL), params, pre + "final_layer_norm")
        outs.append(x.matmul(params[out].t()))
    return torch.cat(outs, dim=1)


# ----------------------------------------------------------------------------------------------------------
# transformer_base baseline (fairseq TransformerModel, post-LN, shared embeddings)

def mha(params, prefix, xq, xkv, key_pad, causal, H, rt=EVAL):
    d = xq.shape[-1]
    dh = d // H
    q = heads(linear(xq, params, prefix + ".q_proj"), H) * dh ** -0.5
    k = heads(linear(xkv, params, prefix + ".k_proj"), H)
    v = heads(linear(xkv, params, prefix + ".v_proj"), H)
    s = q.matmul(k.transpose(-1, -2))                                  # [B,H,n,m]
    if causal:
        n, m = s.shape[-2], s.shape[-1]
        fut = torch.ones(n, m, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(fut, float("-inf"))
    if key_pad is not None:
        s = s.masked_fill(key_pad[:, None, None, :], float("-inf"))
    a = rt.drop(softmax(s), rt.attention_dropout)
    return linear(merge(a.matmul(v)), params, prefix + ".out_proj")


def transformer_forward(params, cfg, src_tokens, src_lengths, prev_output_tokens, rt=EVAL):
    pad = cfg["padding_idx"]
    He, Hd = cfg["encoder_attention_heads"], cfg["decoder_attention_heads"]
    x = rt.drop(embed(params, cfg, src_tokens), rt.dropout)
    src_pad = src_tokens.eq(pad)
    for i in range(cfg["encoder_layers"]):
        pre = f"encoder.layers.{i}."
        x = layer_norm(x + rt.drop(mha(params, pre + "self_attn", x, x, src_pad, False, He, rt), rt.dropout),
                       params, pre + "self_attn_layer_norm")
        x = layer_norm(x + rt.drop(ffn(params, pre, x, rt), rt.dropout), params, pre + "final_layer_norm")
    enc = x
    dec, out = decoder_tables(params)
    y = rt.drop(embed(params, cfg, prev_output_tokens, dec), rt.dropout)
    # fairseq TransformerDecoder: self_attn_padding_mask only when the batch has target pads
    tgt_pad = prev_output_tokens.eq(pad)
    tgt_pad = tgt_pad if bool(tgt_pad.any()) else None
    for i in range(cfg["decoder_layers"]):
        pre = f"decoder.layers.{i}."
        y = layer_norm(y + rt.drop(mha(params, pre + "self_attn", y, y, tgt_pad, True, Hd, rt), rt.dropout),
                       params, pre + "self_attn_layer_norm")
        y = layer_norm(y + rt.drop(mha(params, pre + "encoder_attn", y, enc, src_pad, False, Hd, rt), rt.dropout),
                       params, pre + "encoder_attn_layer_norm")
        y = layer_norm(y + rt.drop(ffn(params, pre, y, rt), rt.dropout), params, pre + "final_layer_norm")
    return y.matmul(params[out].t())


def forward(params, cfg, src_tokens, src_lengths, prev_output_tokens, rt=EVAL):
    if cfg["arch"] == "luna":
        return luna_forward(params, cfg, src_tokens, src_lengths, prev_output_tokens, rt)
    return transformer_forward(params, cfg, src_tokens, src_lengths, prev_output_tokens, rt)


# ----------------------------------------------------------------------------------------------------------
# loss (section 8)

def label_smoothed_loss(logits, target, eps, padding_idx=PAD):
    """Sum over non-pad target tokens, in nats: (1-eps)*(-log p_y) + (eps/V)*sum_v(-log p_v).
    Returns (loss, nll) as 0-dim tensors."""
    V = logits.shape[-1]
    if FAST:
        lprobs = F.log_softmax(logits, -1)
    else:
        m = logits.amax(-1, keepdim=True).detach()
        lprobs = logits - m - torch.log(torch.exp(logits - m).sum(-1, keepdim=True))
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.sum(-1)
    keep = target.ne(padding_idx)
    zero = torch.zeros((), dtype=logits.dtype, device=logits.device)
    nll = torch.where(keep, nll, zero)
    smooth = torch.where(keep, smooth, zero)
    loss = (1.0 - eps) * nll.sum() + (eps / V) * smooth.sum()
    return loss, nll.sum()
