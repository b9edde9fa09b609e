"""The tensors a luna model of a given configuration has: names and shapes, as luna's parameter
table (model/param_table.c) lays them out for the architectures the converter produces (Luna and
the transformer, post-LayerNorm, sinusoidal positions). The converter checks a fairseq state_dict
against it before writing anything, so that a missing, extra, transposed or mis-sized tensor is
reported by name here rather than by luna-translate later."""
import numpy as np


def expected_tensors(cfg):
    """{name: (shape, meaning)} for the configuration `cfg` (luna's __metadata__.config keys)."""
    luna = cfg["arch"] == "luna"
    d, V = cfg["encoder_embed_dim"], cfg["vocab_size"]
    out = {}

    def add(name, shape, meaning):
        out[name] = (tuple(shape), meaning)

    def linear(prefix, name, n_in, n_out, what_in, what_out):
        add(f"{prefix}.{name}.weight", (n_out, n_in), f"[{what_out}, {what_in}]")
        add(f"{prefix}.{name}.bias", (n_out,), f"[{what_out}]")

    def norm(prefix, name):
        add(f"{prefix}.{name}.weight", (d,), "[embed_dim]")
        add(f"{prefix}.{name}.bias", (d,), "[embed_dim]")

    def attention(prefix, causal):
        names = ["k_proj", "v_proj", "q_proj"]
        if luna:
            names = ["pq_proj", "q_proj"]
            if not cfg["untie_luna_kv"]:
                names += ["pc_proj", "c_proj"]
            elif causal:
                names += ["pc_proj", "k_proj", "v_proj"]
            else:
                names += ["pk_proj", "pv_proj", "k_proj", "v_proj"]
        for n in names + ["out_proj"]:
            linear(prefix, n, d, d, "embed_dim", "embed_dim")

    add("encoder.embed_tokens.weight", (V, d), "[dictionary size, embed_dim]")
    if luna:
        add("encoder.projected_embeddings", (cfg["projection_length"], d), "[projection_length, embed_dim]")
    for side in ("encoder", "decoder"):
        ffn = cfg[f"{side}_ffn_embed_dim"]
        if side == "decoder" and not cfg.get("share_all_embeddings", True):
            add("decoder.embed_tokens.weight", (V, d), "[dictionary size, embed_dim]")
        for i in range(cfg[f"{side}_layers"]):
            p = f"{side}.layers.{i}"
            attention(f"{p}.self_attn", side == "decoder")
            norm(p, "self_attn_layer_norm")
            if side == "encoder" and luna:
                norm(p, "self_atten_proj_layer_norm")
            if side == "decoder":
                attention(f"{p}.encoder_attn", False)
                norm(p, "encoder_attn_layer_norm")
                if luna:
                    norm(p, "encoder_atten_proj_layer_norm")
            linear(p, "fc1", d, ffn, "embed_dim", f"{side}_ffn_embed_dim")
            linear(p, "fc2", ffn, d, f"{side}_ffn_embed_dim", "embed_dim")
            norm(p, "final_layer_norm")
    if not cfg.get("share_all_embeddings", True) and not cfg.get("share_decoder_input_output_embed", True):
        add("decoder.output_projection.weight", (V, d), "[dictionary size, embed_dim]")
    return out


def check_tensors(tensors, cfg):
    """None when `tensors` ({name: ndarray}) is exactly the model of `cfg` with finite values,
    else one line naming the first tensor that is not."""
    want = expected_tensors(cfg)
    for name, (shape, meaning) in want.items():
        if name not in tensors:
            return f"tensor '{name}' {meaning} is missing"
    for name, t in tensors.items():
        if name not in want:
            return (f"tensor '{name}' is not a parameter of this {cfg['arch']} model "
                    f"({cfg['encoder_layers']}+{cfg['decoder_layers']} layers)")
        shape, meaning = want[name]
        if tuple(t.shape) != shape:
            hint = " (transposed?)" if tuple(t.shape) == shape[::-1] and len(shape) == 2 else ""
            return f"tensor '{name}' has shape {list(t.shape)}, expected {list(shape)} = {meaning}{hint}"
        if not np.all(np.isfinite(t)):
            bad = int(np.size(t) - np.count_nonzero(np.isfinite(t)))
            return f"tensor '{name}' has {bad} non-finite values"
    return None
