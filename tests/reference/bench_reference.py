#!/usr/bin/python3
"""Time one training step (forward + label-smoothed loss + backward, float32, dropout on) of the PyTorch
reference on CPU -- the yardstick for the C implementation's throughput.

    /usr/bin/python3 tests/reference/bench_reference.py --threads 2 [--causal tril|cumsum] [--arch luna|transformer]
    python3 tests/reference/bench_reference.py --device cuda --amp bf16 --batch 1024   # PyTorch AMP on a GPU

Default model: luna_base_tied (d 512, FFN 2048, 6+6 layers, 8 heads, l = 32, V = 32000, shared embeddings),
one batch of 128 sentences x 32 target tokens (4096 target tokens) with 32-token sources, dropout /
attention dropout / activation dropout 0.1 (the WMT'14 recipe).  No optimizer step is timed.

--compile: the forward and loss through torch.compile (the backward then runs the compiled graph's
backward; the warm-up steps include compiling).

--device cuda: the same step on a GPU (eager PyTorch unless --compile, the yardstick for luna's CUDA backend); --amp bf16:
forward and loss under torch.autocast(bfloat16) with float32 parameters and gradients (PyTorch's automatic
mixed precision, as fairseq's --bf16/--amp), backward outside it.  Timed with the device synchronised
(loss.item()).

Causal attention form (flagged in the output):
  cumsum  running sums of outer products with torch.cumsum (the official `efficient_causal_attention_parallel`
          shape; memory B*H*n*d_h*l per layer), vectorised;
  tril    the same sums as lower-triangular masked GEMMs, S = ((Q K^T) * M) Phi / t, O = ((A Phi^T) * M) V / t
          (O(n^2) work, but GEMM-shaped and small for n = 32), vectorised.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import luna_reference as R  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", choices=["luna", "transformer"], default="luna")
    ap.add_argument("--untie-luna-kv", action="store_true")
    ap.add_argument("--causal", choices=["cumsum", "tril"], default="tril")
    ap.add_argument("--causal-activation", choices=["softplus", "elu"], default="softplus")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--projection-length", type=int, default=32)
    ap.add_argument("--embed-dim", type=int, default=512)
    ap.add_argument("--ffn-dim", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128, help="sentences per batch")
    ap.add_argument("--src-len", type=int, default=32)
    ap.add_argument("--tgt-len", type=int, default=32)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--attention-dropout", type=float, default=0.1)
    ap.add_argument("--activation-dropout", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps")
    ap.add_argument("--steps", type=int, default=2, help="timed steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="print the top operators of one timed step")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the forward and loss (the warm-up steps include the compilation)")
    ap.add_argument("--amp", choices=["none", "bf16"], default="none",
                    help="bf16: autocast the forward and loss (PyTorch AMP); parameters stay float32")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_reference: --device cuda, but PyTorch sees no GPU")
    dev = torch.device(a.device)

    torch.set_num_threads(a.threads)
    R.FAST = True  # fused layer_norm / softmax / log_softmax kernels
    torch.manual_seed(a.seed)
    cfg = R.make_config(arch=a.arch, vocab_size=a.vocab, d=a.embed_dim, ffn=a.ffn_dim, layers=a.layers,
                        heads=a.heads, projection_length=a.projection_length, untie_luna_kv=a.untie_luna_kv,
                        causal_activation=a.causal_activation, dropout=a.dropout)
    g = torch.Generator().manual_seed(a.seed)
    params = {k: v.detach().to(device=dev, dtype=torch.float32).requires_grad_(True)
              for k, v in R.init_params(cfg, g).items()}
    B, m, n = a.batch, a.src_len, a.tgt_len
    src = torch.randint(4, a.vocab, (B, m), generator=g)
    src[:, -1] = R.EOS
    tgt = torch.randint(4, a.vocab, (B, n), generator=g)
    tgt[:, -1] = R.EOS
    prev = torch.cat([torch.full((B, 1), R.EOS, dtype=torch.long), tgt[:, :-1]], dim=1)
    src_len = torch.full((B,), m, dtype=torch.long)
    ntok = int(tgt.ne(R.PAD).sum())
    src, tgt, prev, src_len = src.to(dev), tgt.to(dev), prev.to(dev), src_len.to(dev)
    rt = R.Runtime(dropout=a.dropout, attention_dropout=a.attention_dropout,
                   activation_dropout=a.activation_dropout, training=True, causal_impl=a.causal)

    def forward_loss(params, src, src_len, prev, tgt):
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.amp == "bf16"):
            logits = R.forward(params, cfg, src, src_len, prev, rt)
            loss, _ = R.label_smoothed_loss(logits, tgt, 0.1)
        return loss

    if a.compile:
        if not hasattr(torch, "compile"):
            sys.exit(f"bench_reference: --compile needs PyTorch >= 2.0 (this is {torch.__version__})")
        forward_loss = torch.compile(forward_loss)

    def step():
        for p in params.values():
            p.grad = None
        loss = forward_loss(params, src, src_len, prev, tgt)
        loss.backward()
        return loss.item()

    print(f"arch {a.arch}{'' if a.arch != 'luna' else (' untied' if a.untie_luna_kv else ' tied')} "
          f"params {R.count_params(cfg):,}  V {a.vocab} d {a.embed_dim} ffn {a.ffn_dim} layers {a.layers}+{a.layers} "
          f"heads {a.heads} l {a.projection_length}  batch {B}x{n} tgt tokens ({ntok}), src {m}  "
          f"dropout {a.dropout}/{a.attention_dropout}/{a.activation_dropout}  "
          f"causal form: {a.causal if a.arch == 'luna' else 'n/a (softmax)'}  threads {torch.get_num_threads()}  "
          f"torch {torch.__version__}  device {a.device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if a.device == 'cuda' else ''}  amp {a.amp}"
          f"  {'torch.compile' if a.compile else 'eager'}", flush=True)
    for _ in range(a.warmup):
        step()
    if a.profile:
        with torch.autograd.profiler.profile() as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    s = sum(times) / len(times)
    print(f"loss {loss / ntok:.4f} nats/token  steps {a.steps}  sec/step {s:.3f} (min {min(times):.3f})  "
          f"target tokens/s {ntok / s:.1f}")


if __name__ == "__main__":
    main()
