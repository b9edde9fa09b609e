#!/usr/bin/env python3
"""Convert checkpoints between fairseq / the official Luna code (fairseq-apollo) and luna.

  convert-checkpoint.py MODEL.pt OUT.safetensors --src-dict dict.en.txt --tgt-dict dict.de.txt
                        [--spm-model spm.model] [--source-lang en --target-lang de]
                        [--causal-activation elu|softplus] [--source-revision auto|2021|2023] [--force]
  convert-checkpoint.py CHECKPOINT.safetensors OUT.pt [--target-revision 2021|2023]
                        [--dict-dir DIR]

The direction follows the input: a PyTorch .pt (fairseq checkpoint: {"args" or "cfg", "model"})
becomes a luna checkpoint that luna-translate, luna-average and luna-train --restore-file open;
a luna checkpoint becomes a .pt whose "model" state_dict loads into the official LunaModel
(or fairseq's TransformerModel for arch transformer) with strict=True.

.pt -> luna
  The configuration comes from the .pt's args (fairseq argument names): arch, dims, layers,
  heads, projection_length, fix_projection_length, untie_luna_kv, share_all_embeddings,
  share_decoder_input_output_embed, dropouts. What luna does not implement is refused with one
  line (pre-LayerNorm, layernorm_embedding, learned positions, adaptive softmax,
  projected-attention heads other than the attention heads, activations other than relu,
  different source and target vocabulary sizes with untied embeddings).
  Not recorded in any .pt: the causal activation φ of the decoder's causal attention. The
  official code at 035a360e hard-codes elu(z)+1; other revisions use softplus. Luna models need
  --causal-activation (the logits are wrong with the other φ; nothing in the weights tells).
  Buffers (version, _float_tensor, projected_positions) are dropped; the aliases
  decoder.embed_tokens.weight / decoder.output_projection.weight are checked to equal the
  table they alias when args say the embeddings are shared (an error otherwise) and kept as
  luna's untied tables when they are not.
  LayerNorm weights: the Luna-era code (2021) stores the gain γ, fairseq-apollo's 2023 revision
  stores γ - 1 under the same names, and nothing in its .pt says which. --source-revision auto
  (the default) takes the file's args.layernorm_revision when it has one (this converter writes
  it), else γ; weights whose mean is near 0 (γ - 1) without such a statement are refused: name
  the convention with --source-revision 2023. A stated convention that the weights contradict is
  refused unless --force. luna stores γ and records it in __metadata__.layernorm_weight.
  Every tensor is checked before anything is written: present, no extra, shapes agreeing with
  the args and the dictionaries, floating dtype, finite values; errors name the tensor.
  The dictionaries (fairseq dict.<lang>.txt) and the SentencePiece model are not in a .pt: name
  them; their sizes are checked against the embedding tables.

luna -> .pt
  Writes {"args": Namespace, "model": state_dict, "optimizer_history", "extra_state"}: every
  parameter, the buffers encoder.version / decoder.version (3, so the official loader's upgrade
  keeps the model as it is), encoder/decoder.embed_positions._float_tensor, encoder.
  projected_positions (the sinusoid of P), and the aliases of shared tables. LayerNorm weights
  as γ (--target-revision 2021, the default: the Luna-era code) or γ - 1 (2023). --dict-dir DIR
  also writes dict.<src>.txt, dict.<tgt>.txt and spm.model there (fairseq's data directory).

A .pt file is a Python pickle, and unpickling can run code: this converter never unpickles with
pickle's or torch's loader. It reads a .pt with tools/scripts/safe_pt.py, which builds only
tensors, containers, scalars and argparse.Namespace and refuses any other name in the pickle
(the list is in that file). .pt -> luna needs numpy only; luna -> .pt also python3-torch
(tools/ci/install-deps.sh --reference). Writes atomically (temporary sibling, fsync, rename; no
temporary file is left on any failure). Errors: one line naming the file and the problem, exit 1.
"""
import argparse
import base64
import io
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import checkpoint_schema  # noqa: E402
    import safe_pt  # noqa: E402
except ImportError:  # numpy missing: main() says so
    safe_pt = checkpoint_schema = None

PROG = "convert-checkpoint"
LUNA_FORMAT = "luna-checkpoint-1"
BUFFER_SUFFIXES = (".version", "._float_tensor", ".projected_positions")


from safetensors_file import ConvertError, atomic_write, fail, read_safetensors, write_safetensors  # noqa: E402


# ---- shared helpers ----------------------------------------------------------------------------------

def is_layernorm_weight(name):
    return name.endswith("layer_norm.weight")


def sinusoid(length, d):
    """fairseq-apollo's get_sinusoidal_positional_embedding (float32): positions 0..length-1,
    sin half then cos half."""
    import torch
    half = d // 2
    emb = math.log(10000) / (half - 1)
    emb = torch.exp(torch.arange(half, dtype=torch.float) * -emb)
    emb = torch.arange(length, dtype=torch.float).unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(length, -1)
    if d % 2 == 1:
        emb = torch.cat([emb, torch.zeros(length, 1)], dim=1)
    return emb


def dict_size(path):
    """Symbols of a fairseq dict.txt (+ the 4 implicit specials <s> <pad> </s> <unk>)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        fail(path, f"cannot read: {e.strerror}")
    except UnicodeDecodeError as e:
        fail(path, f"not UTF-8 (byte {e.start})")
    lines = [ln for ln in text.split("\n") if ln.strip()]
    for i, ln in enumerate(lines):
        if len(ln.rsplit(" ", 1)) != 2:
            fail(path, f"line {i + 1}: expected 'token count', got {ln[:40]!r}")
    return text, 4 + len(lines)


# ---- .pt -> luna -----------------------------------------------------------------------------------

def args_of(path, ckpt):
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        fail(path, "not a fairseq checkpoint (no 'model' state_dict)")
    args = ckpt.get("args")
    if args is None and ckpt.get("cfg") is not None:
        cfg = ckpt["cfg"]
        model = cfg.get("model") if isinstance(cfg, dict) else None
        if isinstance(model, argparse.Namespace):
            model = vars(model)
        if not isinstance(model, dict):
            fail(path, "cfg has no 'model' section (a dict)")
        return dict(model)
    if args is None:
        fail(path, "neither 'args' nor 'cfg': the model configuration is not in the file")
    if not isinstance(args, argparse.Namespace):
        fail(path, f"'args' is a {type(args).__name__}, not an argparse.Namespace")
    return dict(vars(args))


def state_of(path, ckpt):
    """The state_dict as {name: float64 array} (buffers as stored), types checked."""
    import numpy as np
    model = ckpt["model"]
    if not isinstance(model, dict):
        fail(path, f"'model' is a {type(model).__name__}, not a state_dict")
    state = {}
    for k, v in model.items():
        if not isinstance(k, str):
            fail(path, f"'model' has a key of type {type(k).__name__}, not a tensor name")
        if not isinstance(v, np.ndarray):
            fail(path, f"'model' entry '{k}' is a {type(v).__name__}, not a tensor")
        if k.endswith(BUFFER_SUFFIXES):
            state[k] = v
        elif v.dtype.kind != "f":
            fail(path, f"tensor '{k}' has dtype {v.dtype}, not a floating type")
        else:
            state[k] = v.astype(np.float64)
    if "encoder.embed_tokens.weight" not in state or state["encoder.embed_tokens.weight"].ndim != 2:
        fail(path, "no 'encoder.embed_tokens.weight' [dictionary size, embed_dim]: not a fairseq "
                   "translation model")
    return state


def pt_to_luna(opt):
    import numpy as np
    path = opt.input
    try:
        ckpt = safe_pt.load(path)
    except safe_pt.PtError as e:
        fail(path, str(e))
    except OSError as e:
        fail(path, f"cannot read: {e.strerror}")
    a = args_of(path, ckpt)
    state = state_of(path, ckpt)
    luna = "encoder.projected_embeddings" in state

    def get(key, default=None):
        v = a.get(key, default)
        return default if v is None else v

    def refuse(key, why):
        fail(path, f"args.{key} = {a.get(key)!r}: {why}")

    def number(key, default, kind=int):
        v = get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and v != int(v)):
            refuse(key, f"not {'an integer' if kind is int else 'a number'}")
        if kind is int and v < 0:
            refuse(key, "negative")
        return kind(v)

    def shape0(name):
        t = state.get(name)
        return int(t.shape[0]) if t is not None and t.ndim >= 1 else None

    for key in ("encoder_normalize_before", "decoder_normalize_before"):
        if get(key, False):
            refuse(key, "luna implements the post-LayerNorm model only (no final LayerNorm)")
    for key in ("layernorm_embedding", "no_scale_embedding", "encoder_learned_pos",
                "decoder_learned_pos", "no_token_positional_embeddings"):
        if get(key, False):
            refuse(key, "not implemented by luna (scaled embeddings with sinusoidal positions only)")
    if get("adaptive_softmax_cutoff") is not None:
        refuse("adaptive_softmax_cutoff", "adaptive softmax is not implemented by luna")
    if get("activation_fn", "relu") != "relu":
        refuse("activation_fn", "luna's FFN is relu only")
    d = int(state["encoder.embed_tokens.weight"].shape[1])
    V = int(state["encoder.embed_tokens.weight"].shape[0])
    for key in ("encoder_embed_dim", "decoder_embed_dim", "decoder_output_dim", "decoder_input_dim"):
        if number(key, d) != d:
            refuse(key, f"luna needs every model dimension equal to the embedding's ({d})")
    for side in ("encoder", "decoder"):
        heads = number(f"{side}_attention_heads", 8)
        if heads < 1 or d % heads != 0:
            refuse(f"{side}_attention_heads", f"the embedding dimension {d} is not a multiple of it")
        ph = number(f"{side}_projected_attention_heads", heads)
        if luna and ph != heads:
            refuse(f"{side}_projected_attention_heads",
                   f"luna uses the attention heads ({heads}) for packing too")
    share_all = bool(get("share_all_embeddings", False))
    share_dec = share_all or bool(get("share_decoder_input_output_embed", False))

    def layers(prefix):
        ids = set()
        for k in state:
            parts = k.split(".")
            if k.startswith(prefix + ".layers.") and len(parts) > 3 and parts[2].isdigit():
                ids.add(int(parts[2]))
        return max(ids) + 1 if ids else 0
    # Dimensions from args where fairseq records them (so a transposed or mis-sized tensor is
    # reported against them), else from the state_dict.
    cfg = {
        "arch": "luna" if luna else "transformer",
        "vocab_size": V, "padding_idx": 1,
        "encoder_embed_dim": d,
        "encoder_ffn_embed_dim": number("encoder_ffn_embed_dim", shape0("encoder.layers.0.fc1.weight") or 0),
        "encoder_layers": number("encoder_layers", layers("encoder")),
        "encoder_attention_heads": number("encoder_attention_heads", 8),
        "decoder_embed_dim": d,
        "decoder_ffn_embed_dim": number("decoder_ffn_embed_dim", shape0("decoder.layers.0.fc1.weight") or 0),
        "decoder_layers": number("decoder_layers", layers("decoder")),
        "decoder_attention_heads": number("decoder_attention_heads", 8),
        "projection_length": number("projection_length", shape0("encoder.projected_embeddings")) if luna else 0,
        "untie_luna_kv": "encoder.layers.0.self_attn.pk_proj.weight" in state,
        "fix_projection_length": bool(get("fix_projection_length", False)),
        "label_smoothing": number("label_smoothing", 0.1, float),
        "dropout": number("dropout", 0.1, float),
        "attention_dropout": number("attention_dropout", 0.0, float),
        "activation_dropout": number("activation_dropout", get("relu_dropout", 0.0), float),
    }
    for key in ("encoder_layers", "decoder_layers", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim"):
        if cfg[key] < 1:
            refuse(key, "the model needs at least one layer of a positive width")
    for key in ("encoder_layers", "decoder_layers"):
        if cfg[key] != layers(key.split("_")[0]):
            refuse(key, f"the state_dict has {layers(key.split('_')[0])} layers")
    if luna:
        if bool(get("untie_luna_kv", False)) != cfg["untie_luna_kv"]:
            refuse("untie_luna_kv", "the state_dict's projections say otherwise")
        if opt.causal_activation is None:
            fail(path, "--causal-activation elu|softplus is required: the decoder's causal "
                       "activation is not recorded in a .pt (fairseq-apollo 035a360e uses elu)")
        cfg["causal_activation"] = opt.causal_activation
    if not share_all:
        cfg["share_all_embeddings"] = False
        cfg["share_decoder_input_output_embed"] = share_dec

    # the tensors: buffers dropped, aliases checked, untied tables kept
    def alias(name, target):
        if name not in state:
            return
        if state[name].shape != state[target].shape or not np.array_equal(state[name], state[target]):
            diff = (float(np.abs(state[name] - state[target]).max())
                    if state[name].shape == state[target].shape else "shape")
            fail(path, f"'{name}' differs from '{target}' (max |difference| {diff}) but args say "
                       "they are shared (share_all_embeddings / share_decoder_input_output_embed)")
    if share_all:
        alias("decoder.embed_tokens.weight", "encoder.embed_tokens.weight")
        alias("decoder.output_projection.weight", "encoder.embed_tokens.weight")
    else:
        if "decoder.embed_tokens.weight" not in state:
            fail(path, "no 'decoder.embed_tokens.weight' although args say the embeddings are not shared")
        if state["decoder.embed_tokens.weight"].shape != (V, d):
            fail(path, f"decoder.embed_tokens.weight is {list(state['decoder.embed_tokens.weight'].shape)} "
                       f"but encoder.embed_tokens.weight is [{V}, {d}]: luna needs one vocabulary size")
        if share_dec:
            alias("decoder.output_projection.weight", "decoder.embed_tokens.weight")
        elif "decoder.output_projection.weight" not in state:
            if "decoder.embed_out" in state:  # older fairseq name
                state["decoder.output_projection.weight"] = state.pop("decoder.embed_out")
            else:
                fail(path, "no 'decoder.output_projection.weight' for the untied output projection")
    out = {}
    for name, t in state.items():
        if name.endswith(BUFFER_SUFFIXES):
            continue
        if share_all and name in ("decoder.embed_tokens.weight", "decoder.output_projection.weight"):
            continue
        if share_dec and not share_all and name == "decoder.output_projection.weight":
            continue
        if name in ("encoder.layer_norm.weight", "encoder.layer_norm.bias"):
            fail(path, f"'{name}': a final LayerNorm (pre-norm model), which luna does not implement")
        out[name] = t

    src_text, src_n = dict_size(opt.src_dict)
    tgt_text, tgt_n = dict_size(opt.tgt_dict)
    for p, n in ((opt.src_dict, src_n), (opt.tgt_dict, tgt_n)):
        if n != V:
            fail(p, f"{n - 4} symbols + 4 specials = {n}, but the model's embedding tables have {V} rows")

    problem = checkpoint_schema.check_tensors(out, cfg)
    if problem:
        fail(path, problem)

    # LayerNorm convention: the weights' mean tells γ (near 1) from γ - 1 (near 0), but only a
    # statement decides: γ - 1 read as γ (or the reverse) converts without error into a model
    # whose every translation is wrong.
    ln = [out[k].ravel() for k in out if is_layernorm_weight(k)]
    mean = float(np.concatenate(ln).mean()) if ln else 1.0
    looks = "2023" if abs(mean) < 0.5 else "2021"
    stated = get("layernorm_revision")  # written by this converter's luna -> .pt direction
    if stated is not None and stated not in ("2021", "2023"):
        refuse("layernorm_revision", "expected '2021' (gamma) or '2023' (gamma - 1)")
    said = {"2021": "gamma", "2023": "gamma - 1"}
    revision = opt.source_revision
    if revision == "auto":
        if stated is None and looks == "2023":
            fail(path, f"the LayerNorm weights have mean {mean:.3f}, as if stored as gamma - 1 "
                       "(fairseq-apollo's 2023 revision), but nothing in the file says so: state "
                       "the convention with --source-revision 2023 (or --source-revision 2021 --force)")
        revision = stated or "2021"
        source = f"args.layernorm_revision = {stated}" if stated else "fairseq's convention"
    else:
        source = "--source-revision"
        if stated is not None and stated != revision and not opt.force:
            fail(path, f"--source-revision {revision} contradicts args.layernorm_revision = {stated} "
                       "(pass --force to convert anyway)")
    if revision != looks and not opt.force:
        fail(path, f"{source} says {said[revision]} ({revision}), but the LayerNorm weights have mean "
                   f"{mean:.3f}, which looks like {said[looks]} ({looks}): pass --source-revision "
                   f"{looks}, or --force to convert as {revision} anyway")
    layernorm_note = f"LayerNorm weights read as {said[revision]} ({revision} convention, from {source}; mean {mean:.3f})"
    if revision == "2023":
        for k in out:
            if is_layernorm_weight(k):
                out[k] = out[k] + 1.0

    spm = b""
    if opt.spm_model:
        try:
            with open(opt.spm_model, "rb") as f:
                spm = f.read()
        except OSError as e:
            fail(opt.spm_model, f"cannot read: {e.strerror}")
    src_lang = opt.source_lang or get("source_lang") or "src"
    tgt_lang = opt.target_lang or get("target_lang") or "tgt"
    meta = {
        "format": LUNA_FORMAT,
        "config": json.dumps(cfg, separators=(",", ":")),
        "layernorm_weight": "gamma",
        "src_dict": src_text, "tgt_dict": tgt_text,
        "spm_model": base64.b64encode(spm).decode("ascii"),
        "source_lang": src_lang, "target_lang": tgt_lang,
        "training_state": "",
        "converted_from": f"{os.path.basename(path)} (fairseq .pt, LayerNorm {revision} convention)",
    }
    write_safetensors(opt.output, out, meta)
    n = sum(t.size for t in out.values())
    print(f"{PROG}: wrote {opt.output}: {cfg['arch']}, {len(out)} tensors, {n} parameters, "
          f"{'shared' if share_all else 'untied'} embeddings; {layernorm_note}", file=sys.stderr)


# ---- luna -> .pt -----------------------------------------------------------------------------------

def luna_to_pt(opt):
    import torch
    path = opt.input
    tensors, meta = read_safetensors(path)
    if meta.get("format") != LUNA_FORMAT:
        fail(path, f"__metadata__.format is {meta.get('format')!r}, expected {LUNA_FORMAT!r} "
                   "(not a luna checkpoint)")
    try:
        cfg = json.loads(meta["config"])
    except (KeyError, json.JSONDecodeError) as e:
        fail(path, f"__metadata__.config is missing or not JSON ({e})")
    conv = meta.get("layernorm_weight", "gamma")
    if conv not in ("gamma", "gamma_minus_1"):
        fail(path, f"__metadata__.layernorm_weight is {conv!r}; expected 'gamma' or 'gamma_minus_1'")
    luna = cfg.get("arch", "luna") == "luna"
    share_all = cfg.get("share_all_embeddings", True)
    share_dec = share_all or cfg.get("share_decoder_input_output_embed", True)
    d = int(cfg["encoder_embed_dim"])
    sd = {}
    params = {k: torch.from_numpy(v.astype("float32")) for k, v in tensors.items()
              if (k.startswith("encoder.") or k.startswith("decoder.")) and not k.endswith(BUFFER_SUFFIXES)}
    for k, t in params.items():
        if is_layernorm_weight(k):
            gamma = t + 1.0 if conv == "gamma_minus_1" else t
            t = gamma - 1.0 if opt.target_revision == "2023" else gamma
        sd[k] = t.contiguous()
    # buffers and aliases, as the official modules register them
    sd["encoder.version"] = torch.Tensor([3])
    sd["encoder.embed_positions._float_tensor"] = torch.zeros(1)
    if luna:
        sd["encoder.projected_positions"] = sinusoid(int(cfg["projection_length"]), d)
    sd["decoder.version"] = torch.Tensor([3])
    sd["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    if share_all:
        sd["decoder.embed_tokens.weight"] = sd["encoder.embed_tokens.weight"]
    if share_dec:
        sd["decoder.output_projection.weight"] = sd["decoder.embed_tokens.weight"]
    for k in ("decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        if k not in sd:
            fail(path, f"no '{k}' although the configuration does not share it")
    heads_e, heads_d = int(cfg["encoder_attention_heads"]), int(cfg["decoder_attention_heads"])
    args = argparse.Namespace(
        arch=("luna_base_untied" if cfg.get("untie_luna_kv") else "luna_base") if luna else "transformer",
        task="translation", criterion="label_smoothed_cross_entropy",
        source_lang=meta.get("source_lang"), target_lang=meta.get("target_lang"),
        encoder_embed_dim=d, encoder_ffn_embed_dim=int(cfg["encoder_ffn_embed_dim"]),
        encoder_layers=int(cfg["encoder_layers"]), encoder_attention_heads=heads_e,
        decoder_embed_dim=int(cfg["decoder_embed_dim"]), decoder_ffn_embed_dim=int(cfg["decoder_ffn_embed_dim"]),
        decoder_layers=int(cfg["decoder_layers"]), decoder_attention_heads=heads_d,
        decoder_output_dim=d, decoder_input_dim=d,
        encoder_normalize_before=False, decoder_normalize_before=False,
        encoder_learned_pos=False, decoder_learned_pos=False, no_token_positional_embeddings=False,
        layernorm_embedding=False, no_scale_embedding=False, adaptive_softmax_cutoff=None,
        activation_fn="relu", share_all_embeddings=share_all, share_decoder_input_output_embed=share_dec,
        dropout=float(cfg.get("dropout", 0.1)), attention_dropout=float(cfg.get("attention_dropout", 0.0)),
        activation_dropout=float(cfg.get("activation_dropout", 0.0)),
        label_smoothing=float(cfg.get("label_smoothing", 0.1)),
        max_source_positions=1024, max_target_positions=1024,
    )
    if luna:
        args.projection_length = int(cfg["projection_length"])
        args.fix_projection_length = bool(cfg.get("fix_projection_length", False))
        args.untie_luna_kv = bool(cfg.get("untie_luna_kv", False))
        args.encoder_projected_attention_heads = heads_e
        args.decoder_projected_attention_heads = heads_d
        args.causal_activation = cfg.get("causal_activation", "softplus")  # informative: not an official option
    args.layernorm_revision = opt.target_revision  # informative: how the LayerNorm weights are stored
    ckpt = {
        "args": args,
        "model": sd,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                               "optimizer_name": "converted", "lr_scheduler_state": {"best": None},
                               "num_updates": 0}],
        "extra_state": {"epoch": 1, "train_iterator": {"epoch": 1}, "val_loss": None},
        "last_optimizer_state": None,
    }
    # torch.save into memory first: its own writer aborts the process on a full disk, Python's
    # file write reports ENOSPC as an OSError that atomic_write handles.
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    atomic_write(opt.output, lambda f: f.write(buf.getbuffer()))
    if opt.dict_dir:
        os.makedirs(opt.dict_dir, exist_ok=True)
        for lang, key in ((args.source_lang, "src_dict"), (args.target_lang, "tgt_dict")):
            text = meta.get(key, "")
            atomic_write(os.path.join(opt.dict_dir, f"dict.{lang}.txt"), lambda f: f.write(text.encode()))
        spm = base64.b64decode(meta.get("spm_model", ""))
        if spm:
            atomic_write(os.path.join(opt.dict_dir, "spm.model"), lambda f: f.write(spm))
    print(f"{PROG}: wrote {opt.output}: {args.arch}, {len(sd)} state_dict entries, LayerNorm "
          f"{opt.target_revision} convention ({'gamma - 1' if opt.target_revision == '2023' else 'gamma'})",
          file=sys.stderr)


def main(argv):
    ap = argparse.ArgumentParser(
        prog="convert-checkpoint.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert fairseq / official Luna (fairseq-apollo) .pt checkpoints to luna "
                    "checkpoints and back; the direction follows INPUT (.pt or luna .safetensors).",
        epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("input", help="MODEL.pt (fairseq) or CHECKPOINT (luna safetensors)")
    ap.add_argument("output", help="OUT.safetensors (luna) or OUT.pt (fairseq)")
    g = ap.add_argument_group(".pt -> luna")
    g.add_argument("--src-dict", help="the source dictionary, fairseq dict.<src>.txt (required)")
    g.add_argument("--tgt-dict", help="the target dictionary, dict.<tgt>.txt (required)")
    g.add_argument("--spm-model", help="the SentencePiece model of the data (optional: without it "
                                       "luna-translate reads pre-tokenized text)")
    g.add_argument("--source-lang", help="default: args.source_lang, else 'src'")
    g.add_argument("--target-lang", help="default: args.target_lang, else 'tgt'")
    g.add_argument("--causal-activation", choices=["elu", "softplus"],
                   help="the decoder's causal φ (required for Luna models: not in the .pt)")
    g.add_argument("--source-revision", choices=["auto", "2021", "2023"], default="auto",
                   help="LayerNorm weights stored as γ (2021) or γ-1 (2023); auto: as the file's "
                        "args.layernorm_revision says, else γ (weights that look like γ-1 are refused)")
    g.add_argument("--force", action="store_true",
                   help="convert even when the stated LayerNorm convention contradicts the weights")
    g = ap.add_argument_group("luna -> .pt")
    g.add_argument("--target-revision", choices=["2021", "2023"], default="2021",
                   help="write LayerNorm weights as γ (2021, default) or γ-1 (2023)")
    g.add_argument("--dict-dir", help="also write dict.<lang>.txt (and spm.model) into this directory")
    opt = ap.parse_args(argv)
    try:
        with open(opt.input, "rb") as f:
            head = f.read(16)
    except OSError as e:
        print(f"{PROG}: {opt.input}: cannot read: {e.strerror}", file=sys.stderr)
        return 1
    try:
        # a zip (torch >= 1.6) or legacy pickle is a .pt; a safetensors file starts with a u64 length and '{'
        is_st = len(head) >= 9 and head[8:9] == b"{"
        try:
            import numpy  # noqa: F401 (a check: every direction needs it)
            if is_st:
                import torch  # noqa: F401  (torch.save writes the .pt)
        except ImportError as e:
            raise ConvertError(f"{opt.input}: needs the Python module '{e.name}' "
                               "(tools/ci/install-deps.sh --reference installs python3-torch and python3-numpy "
                               "for Debian's /usr/bin/python3: run the converter with that python)")
        if is_st:
            luna_to_pt(opt)
        else:
            for flag in ("src_dict", "tgt_dict"):
                if getattr(opt, flag) is None:
                    raise ConvertError(f"{opt.input}: --{flag.replace('_', '-')} FILE is required "
                                       "(a .pt carries no dictionary)")
            pt_to_luna(opt)
    except ConvertError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # an input no check above foresaw: still one line, never a traceback
        print(f"{PROG}: {opt.input}: cannot convert ({type(e).__name__}: "
              f"{(str(e).splitlines() or [''])[0][:160]})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
