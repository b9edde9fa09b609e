#!/usr/bin/env python3
"""Export a luna transformer checkpoint (.safetensors) to a CTranslate2 model directory.

luna's softmax transformer follows fairseq's conventions (post-LayerNorm with eps 1e-5,
sinusoidal positions starting at padding_idx + 1, embeddings scaled by sqrt(d), ReLU FFN,
</s> appended to the source and used as the decoder's start token), so the export fills
CTranslate2's TransformerSpec the way CTranslate2's own fairseq converter does, from the
checkpoint's tensors and its __metadata__ (configuration and dictionaries). The vocabularies are
fairseq's order: <s>, <pad> (written as CTranslate2's <blank>), </s>, <unk>, then the
dictionary's tokens, then madeupwordNNNN up to the model's vocabulary size.

The output is written into a temporary directory beside OUTPUT_DIR and renamed into place, so an
interrupted export leaves no partial model. Luna and Linformer checkpoints are refused
(CTranslate2 has no Luna or Linformer attention).

Requires: ctranslate2 (tested with 4.8.5), numpy, safetensors.

Example (then translate SentencePiece pieces with ctranslate2.Translator(OUTPUT_DIR)):
  python3 tools/scripts/export-ctranslate2.py checkpoints/checkpoint_best.safetensors ct2-model
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile

PROG = "export-ctranslate2"
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq's Dictionary: ids 0..3


class ExportError(Exception):
    pass


def read_header(path):
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ExportError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > 1 << 30:
                raise ExportError(f"{path}: not a safetensors file (header size {n})")
            header = json.loads(f.read(n))
    except OSError as e:
        raise ExportError(f"{path}: {e.strerror}")
    except (ValueError, UnicodeDecodeError):
        raise ExportError(f"{path}: not a safetensors file (bad JSON header)")
    meta = header.get("__metadata__") or {}
    if "config" not in meta:
        raise ExportError(f"{path}: no __metadata__.config: not a luna checkpoint")
    try:
        config = json.loads(meta["config"])
    except ValueError:
        raise ExportError(f"{path}: __metadata__.config is not JSON")
    return meta, config


def parse_dict(text, name):
    """fairseq dict.txt lines 'token count [#fairseq:overwrite]' -> tokens."""
    tokens = []
    for i, line in enumerate(text.split("\n")):
        if not line:
            continue
        fields = line.rstrip().rsplit(" ", 1)
        if fields[-1] == "#fairseq:overwrite":
            fields = fields[0].rsplit(" ", 1)
        if len(fields) != 2:
            raise ExportError(f"{name}: line {i + 1}: expected 'token count'")
        tokens.append(fields[0])
    return tokens


def vocabulary(tokens, size, name):
    vocab = SPECIALS + tokens
    if len(vocab) > size:
        raise ExportError(
            f"{name}: {len(vocab)} entries with the 4 specials, more than the model's "
            f"vocab_size {size}")
    vocab += [f"madeupword{i:04d}" for i in range(size - len(vocab))]  # fairseq's pad_to_multiple
    if len(set(vocab)) != len(vocab):
        raise ExportError(f"{name}: duplicate tokens")
    return ["<blank>" if t == "<pad>" else t for t in vocab]


def sinusoids(num, dim, first):
    """luna's (fairseq's) table for positions first..first+num-1: [sin | cos], angles in double
    (luna evaluates them in double and rounds once: libm's sin/cos, as Python's math)."""
    import numpy as np

    half = dim // 2
    c = math.log(10000.0) / (half - 1) if half > 1 else 0.0
    f = [math.exp(i * -c) for i in range(half)]
    out = np.zeros((num, dim), dtype=np.float32)
    for j in range(num):
        pos = float(first + j)
        out[j, :half] = [math.sin(pos * fi) for fi in f]
        out[j, half:2 * half] = [math.cos(pos * fi) for fi in f]
    return out


def build_spec(path, meta, config, max_positions):
    import numpy as np
    from safetensors.numpy import load_file
    from ctranslate2.specs import common_spec, transformer_spec
    from ctranslate2.converters import utils

    arch = config.get("arch")
    if arch == "luna":
        raise ExportError(
            f"{path}: a Luna checkpoint (arch luna); CTranslate2 has no Luna attention, only "
            "transformer checkpoints can be exported")
    if arch != "transformer":
        raise ExportError(f"{path}: unknown arch {arch!r}")
    if config.get("linformer_k", 0):
        raise ExportError(
            f"{path}: a Linformer checkpoint (linformer_k {config['linformer_k']}); CTranslate2 "
            "has no Linformer attention")
    for k in ("encoder_embed_dim", "encoder_attention_heads"):
        if config[k] != config[k.replace("encoder", "decoder")]:
            raise ExportError(f"{path}: {k} differs between encoder and decoder; CTranslate2's "
                              "Transformer needs the same")
    for k in ("src_dict", "tgt_dict"):
        if k not in meta:
            raise ExportError(f"{path}: no __metadata__.{k}: the checkpoint carries no vocabulary "
                              "(use one written by luna-train or luna-average)")
    V, pad, d = config["vocab_size"], config["padding_idx"], config["encoder_embed_dim"]
    H = config["encoder_attention_heads"]
    if pad != 1:
        raise ExportError(f"{path}: padding_idx {pad}; the export expects fairseq's 1")
    src_vocab = vocabulary(parse_dict(meta["src_dict"], "src_dict"), V, "src_dict")
    tgt_vocab = vocabulary(parse_dict(meta["tgt_dict"], "tgt_dict"), V, "tgt_dict")

    try:
        t = load_file(path)
    except Exception as e:  # safetensors raises its own error types
        raise ExportError(f"{path}: cannot read the tensors: {e}")

    gamma_minus_1 = meta.get("layernorm_weight") == "gamma_minus_1"

    def get(name):
        if name not in t:
            raise ExportError(f"{path}: no tensor {name}")
        return np.ascontiguousarray(t[name], dtype=np.float32)

    def linear(spec, name):
        spec.weight = get(name + ".weight")
        spec.bias = get(name + ".bias")

    def layer_norm(spec, name):
        g = get(name + ".weight")
        spec.gamma = g + 1.0 if gamma_minus_1 else g
        spec.beta = get(name + ".bias")

    def attention(spec, name, self_attention):
        parts = [common_spec.LinearSpec() for _ in range(3 if self_attention else 2)]
        projs = ["q_proj", "k_proj", "v_proj"] if self_attention else ["k_proj", "v_proj"]
        for p, proj in zip(parts, projs):
            linear(p, f"{name}.{proj}")
        if self_attention:
            utils.fuse_linear(spec.linear[0], parts)
        else:
            linear(spec.linear[0], f"{name}.q_proj")
            utils.fuse_linear(spec.linear[1], parts)
        linear(spec.linear[-1], f"{name}.out_proj")

    spec = transformer_spec.TransformerSpec.from_config(
        (config["encoder_layers"], config["decoder_layers"]),
        H,
        pre_norm=False,
        activation=common_spec.Activation.RELU,
    )
    enc_table = get("encoder.embed_tokens.weight")
    if enc_table.shape != (V, d):
        raise ExportError(f"{path}: encoder.embed_tokens.weight is {list(enc_table.shape)}, "
                          f"expected [{V}, {d}]")
    dec_table = get("decoder.embed_tokens.weight") if "decoder.embed_tokens.weight" in t \
        else enc_table
    out_table = get("decoder.output_projection.weight") \
        if "decoder.output_projection.weight" in t else dec_table
    positions = sinusoids(max_positions, d, pad + 1)

    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = enc_table
    enc.scale_embeddings = True
    enc.position_encodings.encodings = positions
    for i, ls in enumerate(enc.layer):
        p = f"encoder.layers.{i}"
        attention(ls.self_attention, f"{p}.self_attn", True)
        layer_norm(ls.self_attention.layer_norm, f"{p}.self_attn_layer_norm")
        linear(ls.ffn.linear_0, f"{p}.fc1")
        linear(ls.ffn.linear_1, f"{p}.fc2")
        layer_norm(ls.ffn.layer_norm, f"{p}.final_layer_norm")
    dec.embeddings.weight = dec_table
    dec.scale_embeddings = True
    dec.position_encodings.encodings = positions
    dec.projection.weight = out_table
    for i, ls in enumerate(dec.layer):
        p = f"decoder.layers.{i}"
        attention(ls.self_attention, f"{p}.self_attn", True)
        layer_norm(ls.self_attention.layer_norm, f"{p}.self_attn_layer_norm")
        attention(ls.attention, f"{p}.encoder_attn", False)
        layer_norm(ls.attention.layer_norm, f"{p}.encoder_attn_layer_norm")
        linear(ls.ffn.linear_0, f"{p}.fc1")
        linear(ls.ffn.linear_1, f"{p}.fc2")
        layer_norm(ls.ffn.layer_norm, f"{p}.final_layer_norm")

    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True  # luna (fairseq) appends </s> to the source
    spec.config.bos_token = "<s>"
    spec.config.eos_token = "</s>"
    spec.config.unk_token = "<unk>"
    spec.config.decoder_start_token = "</s>"  # fairseq starts the target with </s>
    spec.config.layer_norm_epsilon = 1e-5
    return spec


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="export-ctranslate2.py",
        description=__doc__.split("\n\n")[0],
        epilog="Translate with CTranslate2 on the SentencePiece pieces of the checkpoint's own "
        "model (__metadata__.spm_model, base64; --spm-model writes it out): "
        "ctranslate2.Translator(OUTPUT_DIR).translate_batch(pieces, beam_size=4, "
        "length_penalty=0.6, return_end_token=True) matches luna-translate --beam 4 --lenpen 0.6 "
        "(return_end_token=True makes CTranslate2 count </s> in the length, as fairseq and luna "
        "do). See docs/benchmarks.md, 'CPU decoding vs CTranslate2'.")
    ap.add_argument("checkpoint", help="luna transformer checkpoint (.safetensors)")
    ap.add_argument("output_dir", help="CTranslate2 model directory to create")
    ap.add_argument("--force", action="store_true", help="replace OUTPUT_DIR if it exists")
    ap.add_argument("--max-positions", type=int, default=1024,
                    help="rows of the sinusoidal position table (longest source or target in "
                    "tokens, </s> included; default 1024, luna's default maximum)")
    ap.add_argument("--quantization", default=None,
                    help="CTranslate2 weight type (int8, int16, float16, ...; default: keep fp32)")
    ap.add_argument("--spm-model", metavar="FILE",
                    help="also write the checkpoint's SentencePiece model to FILE")
    args = ap.parse_args(argv)
    try:
        if args.max_positions < 1:
            raise ExportError("--max-positions must be positive")
        try:
            import ctranslate2  # noqa: F401
            import numpy  # noqa: F401
            import safetensors  # noqa: F401
        except ImportError as e:
            raise ExportError(f"{e.name} is not installed (pip install ctranslate2 numpy "
                              "safetensors)")
        out = os.path.abspath(args.output_dir)
        if os.path.exists(out) and not args.force:
            raise ExportError(f"{args.output_dir} exists (--force replaces it)")
        meta, config = read_header(args.checkpoint)
        spec = build_spec(args.checkpoint, meta, config, args.max_positions)
        spec.validate()
        spec.optimize(quantization=args.quantization)
        parent = os.path.dirname(out)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".export-ct2-", dir=parent)
        try:
            spec.save(tmp)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
            if os.path.exists(out):
                old = tempfile.mkdtemp(prefix=".export-ct2-old-", dir=parent)
                os.rename(out, os.path.join(old, "x"))
                os.rename(tmp, out)
                shutil.rmtree(old)
            else:
                os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if args.spm_model:
            import base64

            if "spm_model" not in meta:
                raise ExportError(f"{args.checkpoint}: no SentencePiece model in the checkpoint")
            tmpf = args.spm_model + ".tmp"
            with open(tmpf, "wb") as f:
                f.write(base64.b64decode(meta["spm_model"]))
            os.replace(tmpf, args.spm_model)
        print(f"{PROG}: wrote {args.output_dir} ({config['encoder_layers']}+"
              f"{config['decoder_layers']} layers, d {config['encoder_embed_dim']}, vocabulary "
              f"{config['vocab_size']})", file=sys.stderr)
        return 0
    except ExportError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
