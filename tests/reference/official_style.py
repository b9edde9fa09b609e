"""A PyTorch module with the state_dict conventions of the official Luna code (fairseq-apollo,
fairseq/models/luna.py at 035a360e; fairseq's TransformerModel for arch transformer), for testing
tools/scripts/convert-checkpoint.py where the official code cannot be installed (no GitHub access here).

What it reproduces from the official build_model / LunaEncoder / LunaDecoder (read, not imported):
  - module attribute names and nesting, hence every state_dict key and shape: encoder.embed_tokens,
    encoder.projected_embeddings, encoder.layers.N.{self_attn.*, self_attn_layer_norm,
    self_atten_proj_layer_norm, fc1, fc2, final_layer_norm}, decoder.layers.N.{self_attn.*,
    self_attn_layer_norm, encoder_attn.*, encoder_attn_layer_norm, encoder_atten_proj_layer_norm,
    fc1, fc2, final_layer_norm};
  - buffers: encoder.version / decoder.version = [3], encoder/decoder.embed_positions._float_tensor
    [1] (SinusoidalPositionalEmbedding), encoder.projected_positions [l, d] (the sinusoid of P);
  - embedding sharing: with share_all_embeddings the decoder's embed_tokens IS the encoder's
    module and output_projection.weight IS its weight (so the state_dict holds the table three
    times); with share_decoder_input_output_embed only the decoder's two; otherwise three tables;
  - the LayerNorm convention: revision "2021" stores γ, revision "2023" stores γ − 1 and its
    forward uses weight + 1;
  - the upgrade the official loader applies before load_state_dict (upgrade_state_dict_named):
    a missing `<encoder|decoder>.version` < 2 drops the final LayerNorm of a pre-norm model.
    load_official() applies it, then load_state_dict(strict=True).
Its arithmetic is NOT the official code's: forward() maps its parameters to luna's names (γ
restored, the decoder's own tables when untied) and runs tests/reference/luna_reference.py in
float64, the oracle the C model is tested against. So a test through this module checks names,
shapes, buffers, aliases and conventions — the converter's job — not the official kernels.
"""
import argparse
import math

import torch
import torch.nn as nn

import luna_reference as ref


class Sinusoidal(nn.Module):
    """fairseq SinusoidalPositionalEmbedding: its only state_dict entry is _float_tensor [1]."""

    def __init__(self):
        super().__init__()
        self.register_buffer("_float_tensor", torch.FloatTensor(1))


class LayerNorm(nn.Module):
    def __init__(self, d, revision):
        super().__init__()
        self.revision = revision
        self.weight = nn.Parameter(torch.zeros(d) if revision == "2023" else torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def gamma(self):
        return self.weight + 1.0 if self.revision == "2023" else self.weight


def _linears(names, d, bias=True):
    m = nn.Module()
    for n in names:
        setattr(m, n, nn.Linear(d, d, bias=bias))
    return m


class Layer(nn.Module):
    def __init__(self, args, decoder, luna, revision):
        super().__init__()
        d, untied = args.encoder_embed_dim, getattr(args, "untie_luna_kv", False)
        if luna:
            cross = ["pq_proj", "q_proj"] + (["pk_proj", "pv_proj", "k_proj", "v_proj"] if untied
                                             else ["pc_proj", "c_proj"])
            causal = ["pq_proj", "q_proj"] + (["pc_proj", "k_proj", "v_proj"] if untied else ["pc_proj", "c_proj"])
            self.self_attn = _linears((causal if decoder else cross) + ["out_proj"], d)
        else:
            self.self_attn = _linears(["k_proj", "v_proj", "q_proj", "out_proj"], d)
        self.self_attn_layer_norm = LayerNorm(d, revision)
        if luna and not decoder:
            self.self_atten_proj_layer_norm = LayerNorm(d, revision)
        if decoder:
            self.encoder_attn = _linears((cross if luna else ["k_proj", "v_proj", "q_proj"]) + ["out_proj"], d)
            self.encoder_attn_layer_norm = LayerNorm(d, revision)
            if luna:
                self.encoder_atten_proj_layer_norm = LayerNorm(d, revision)
        ffn = args.decoder_ffn_embed_dim if decoder else args.encoder_ffn_embed_dim
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)
        self.final_layer_norm = LayerNorm(d, revision)


class Side(nn.Module):
    """LunaEncoder / LunaDecoder: the attributes that make state_dict entries, in their order."""

    def __init__(self, args, decoder, luna, revision, embed_tokens, vocab):
        super().__init__()
        d = args.encoder_embed_dim
        self.register_buffer("version", torch.Tensor([3]))
        self.embed_tokens = embed_tokens
        self.embed_positions = Sinusoidal()
        if luna and not decoder:
            self.projected_embeddings = nn.Parameter(torch.randn(args.projection_length, d) * d ** -0.5)
            self.register_buffer("projected_positions", ref.sinusoid(torch.arange(args.projection_length), d,
                                                                     torch.float32))
        layers = args.decoder_layers if decoder else args.encoder_layers
        self.layers = nn.ModuleList([Layer(args, decoder, luna, revision) for _ in range(layers)])
        self.layer_norm = LayerNorm(d, revision) if getattr(args, f"{'de' if decoder else 'en'}coder_normalize_before",
                                                            False) else None
        if decoder:
            if args.share_decoder_input_output_embed or args.share_all_embeddings:
                self.output_projection = nn.Linear(d, vocab, bias=False)
                self.output_projection.weight = embed_tokens.weight
            else:
                self.output_projection = nn.Linear(d, vocab, bias=False)
                nn.init.normal_(self.output_projection.weight, mean=0, std=d ** -0.5)


def _embedding(V, d):
    m = nn.Embedding(V, d, padding_idx=1)
    nn.init.normal_(m.weight, mean=0, std=d ** -0.5)
    with torch.no_grad():
        m.weight[1].zero_()
    return m


class OfficialStyleModel(nn.Module):
    def __init__(self, args, vocab, revision="2021", causal_activation="elu"):
        super().__init__()
        self.args, self.revision, self.causal_activation = args, revision, causal_activation
        self.luna = str(args.arch).startswith("luna")
        d = args.encoder_embed_dim
        enc_emb = _embedding(vocab, d)
        dec_emb = enc_emb if args.share_all_embeddings else _embedding(vocab, d)
        self.encoder = Side(args, False, self.luna, revision, enc_emb, vocab)
        self.decoder = Side(args, True, self.luna, revision, dec_emb, vocab)

    def randomize(self, generator):
        """Everything random (LayerNorm gains in U(0.6, 1.4) stored per the revision, biases
        non-zero), so that a wrong convention or a dropped table changes the outputs."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layer_norm.weight"):
                    g = 0.6 + 0.8 * torch.rand(p.shape, generator=generator)
                    p.copy_(g - 1.0 if self.revision == "2023" else g)
                elif name.endswith(".bias"):
                    p.copy_(0.2 * torch.randn(p.shape, generator=generator))
                elif "embed_tokens" in name or "output_projection" in name or "projected_embeddings" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * p.shape[1] ** -0.5)
                    if "embed_tokens" in name:
                        p[1].zero_()
                else:
                    bound = math.sqrt(6.0 / (p.shape[0] + p.shape[1]))
                    p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)

    def luna_config(self):
        a = self.args
        return ref.make_config(arch="luna" if self.luna else "transformer", vocab_size=self.encoder.embed_tokens.num_embeddings,
                               d=a.encoder_embed_dim, ffn=a.encoder_ffn_embed_dim, heads=a.encoder_attention_heads,
                               projection_length=getattr(a, "projection_length", 0),
                               untie_luna_kv=getattr(a, "untie_luna_kv", False),
                               causal_activation=self.causal_activation,
                               fix_projection_length=getattr(a, "fix_projection_length", False),
                               encoder_layers=a.encoder_layers, decoder_layers=a.decoder_layers) | {
            "decoder_ffn_embed_dim": a.decoder_ffn_embed_dim, "decoder_attention_heads": a.decoder_attention_heads}

    def luna_params(self):
        """The parameters under luna's names, float64, γ restored, untied tables as luna names them."""
        mods = dict(self.named_modules())
        out = {}
        buffers = {n for n, _ in self.named_buffers()}
        for name, p in self.state_dict(keep_vars=True).items():  # aliases included
            if name in buffers:
                continue
            owner = mods.get(name.rsplit(".", 1)[0]) if "." in name else self
            t = owner.gamma() if isinstance(owner, LayerNorm) and name.endswith(".weight") else p
            out[name] = t.detach().to(torch.float64)
        if self.args.share_all_embeddings:
            out.pop("decoder.embed_tokens.weight", None)
            out.pop("decoder.output_projection.weight", None)
        elif self.args.share_decoder_input_output_embed:
            out.pop("decoder.output_projection.weight", None)
        return out

    def forward(self, src_tokens, src_lengths, prev_output_tokens):
        if self.encoder.layer_norm is not None:
            raise NotImplementedError("pre-norm: not modelled here (luna is post-LN)")
        return ref.forward(self.luna_params(), self.luna_config(), src_tokens, src_lengths, prev_output_tokens)


def load_official(model, state_dict):
    """The official loader's path: upgrade_state_dict_named (version rule), then strict load."""
    sd = dict(state_dict)
    for side in ("encoder", "decoder"):
        key = f"{side}.version"
        if float(sd.get(key, torch.Tensor([1]))[0]) < 2:
            getattr(model, side).layer_norm = None  # earlier checkpoints did not normalize after the stack
            sd[key] = torch.Tensor([1])
    model.load_state_dict(sd, strict=True)


# args of an official-style .pt, as fairseq's argparse would give them (tests' small defaults)
def official_args(arch="luna_base", d=16, ffn=24, layers=2, heads=4, l=4, untie=False, share_all=True,
                  share_dec=False, **extra):
    a = argparse.Namespace(arch=arch, encoder_embed_dim=d, decoder_embed_dim=d, encoder_ffn_embed_dim=ffn,
                           decoder_ffn_embed_dim=ffn, encoder_layers=layers, decoder_layers=layers,
                           encoder_attention_heads=heads, decoder_attention_heads=heads,
                           encoder_projected_attention_heads=heads, decoder_projected_attention_heads=heads,
                           projection_length=l, fix_projection_length=False, untie_luna_kv=untie,
                           share_all_embeddings=share_all, share_decoder_input_output_embed=share_dec,
                           encoder_normalize_before=False, decoder_normalize_before=False,
                           activation_fn="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                           source_lang="en", target_lang="de", adaptive_softmax_cutoff=None)
    for k, v in extra.items():
        setattr(a, k, v)
    return a
