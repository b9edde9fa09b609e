#!/usr/bin/python3
"""Train the PyTorch reference model on the batches luna-train takes, with Apollo, and time each
update: the yardstick for luna-train's training throughput (target tokens/s).

    build/bench-batching DATA-BIN --max-tokens 4096 --seed 1 --dump-batches B.jsonl --dump-count 8
    /usr/bin/python3 tests/reference/train_reference.py B.jsonl --vocab 31392 --threads 2 [--updates 8]

B.jsonl holds epoch 1's first batches exactly as luna-train (same --max-tokens, --seed, one rank)
collates them; compare with

    build/luna-train DATA-BIN --arch luna_base_tied <the same optimizer flags> --max-tokens 4096
        --seed 1 --max-update 8 --disable-validation --no-save --threads 2 --log-interval 1

One update, as luna-train does it (spec apollo.md "One update, in order"): forward with dropout
(0.1 / 0.1 / 0.1), label-smoothed loss (0.1) summed over target tokens, backward, gradients / ntokens,
per-tensor clipping to --clip-norm (clip mode "each"), L2 weight decay, Apollo step (constant
rebound, float32 state: the official apollo.py's vectorised torch form), milestone schedule with
linear warmup. The causal attention uses the vectorised `tril` form (faster than `cumsum`, whose
running sums cost memory traffic; timings in tests/reference/README.md).
The model is initialised by luna_reference.init_params (spec section 5), not from luna's own
initial weights, so the losses are comparable but not equal. The first --warmup updates are not
timed (allocator warm-up).
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


class ApolloFP32:
    """Apollo (spec apollo.md; constant rebound, L2 decay) on float32 tensors, vectorised the way
    the official implementation (XuezheMax/apollo, optim/apollo.py) writes it. The float64
    transcription in apollo_reference.py is the correctness oracle; this one is for timing."""

    SIGMA = 0.01

    def __init__(self, params, beta=0.9, eps=1e-4, weight_decay=0.0):
        self.params, self.beta, self.eps, self.wd = params, beta, eps, weight_decay
        self.state = {n: (torch.zeros_like(p), torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self, lr):
        self.t += 1
        alpha = (1 - self.beta) / (1 - self.beta ** self.t)
        eps_p = self.eps / self.SIGMA
        for name, p in self.params.items():
            m, B, d = self.state[name]
            g = p.grad
            if g is None:
                continue
            if self.wd != 0:
                g = g.add(p, alpha=self.wd)
            delta_grad = g - m
            m.add_(delta_grad, alpha=alpha)
            den = d.norm(p=4).add_(eps_p)
            d.div_(den)                                            # d is now v
            v_sq = d.mul(d)
            delta = delta_grad.mul_(d).sum().div_(den).neg_().mul_(alpha) - B.mul(v_sq).sum()
            B.addcmul_(v_sq, delta)
            torch.div(m, B.abs().clamp_(min=self.SIGMA), out=d)   # new update direction
            p.add_(d, alpha=-lr)


def milestone_lr(k, lr, warmup, init_lr, milestones, rate):
    """Learning rate of update k (0-based), apollo.md: linear warmup from init_lr, then lr * rate^j
    after the j-th milestone."""
    if k < warmup:
        return init_lr + (lr - init_lr) * k / warmup
    return lr * rate ** sum(1 for s in milestones if k >= s)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("batches", help="JSON lines from bench-batching --dump-batches")
    ap.add_argument("--vocab", type=int, required=True, help="dictionary size (luna-train prints it)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--updates", type=int, default=0, help="updates to run (default: one per batch in the file)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first updates")
    ap.add_argument("--causal", choices=["cumsum", "tril"], default="tril")
    ap.add_argument("--projection-length", type=int, default=32)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--warmup-updates", type=int, default=1000)
    ap.add_argument("--warmup-init-lr", type=float, default=1e-5)
    ap.add_argument("--clip-norm", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=1e-8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    R.FAST = True
    torch.manual_seed(a.seed)
    batches = []
    with open(a.batches) as f:
        for line in f:
            b = json.loads(line)
            batches.append({k: torch.tensor(b[k], dtype=torch.long)
                            for k in ("src_tokens", "prev_output_tokens", "target")}
                           | {"src_lengths": torch.tensor(b["src_lengths"][0], dtype=torch.long),
                              "ntokens": b["ntokens"]})
    updates = a.updates or len(batches)
    cfg = R.make_config(arch="luna", vocab_size=a.vocab, projection_length=a.projection_length, dropout=a.dropout)
    params = R.to_dtype(R.init_params(cfg, torch.Generator().manual_seed(a.seed)), torch.float32,
                        requires_grad=True)
    opt = ApolloFP32(params, weight_decay=a.weight_decay)
    rt = R.Runtime(dropout=a.dropout, attention_dropout=a.dropout, activation_dropout=a.dropout,
                   training=True, causal_impl=a.causal)
    print(f"luna_base_tied params {R.count_params(cfg):,} V {a.vocab} l {a.projection_length}; "
          f"{len(batches)} batches from {a.batches}; dropout {a.dropout}; Apollo fp32 lr {a.lr} "
          f"clip each {a.clip_norm}; causal {a.causal}; threads {torch.get_num_threads()}; "
          f"torch {torch.__version__}", flush=True)
    timed_tokens, timed_seconds = 0, 0.0
    for k in range(updates):
        b = batches[k % len(batches)]
        t0 = time.perf_counter()
        for p in params.values():
            p.grad = None
        logits = R.forward(params, cfg, b["src_tokens"], b["src_lengths"], b["prev_output_tokens"], rt)
        loss, nll = R.label_smoothed_loss(logits, b["target"], a.label_smoothing)
        loss.backward()
        with torch.no_grad():
            for p in params.values():
                if p.grad is None:  # not used by this batch's graph (skipped, as torch.optim does)
                    continue
                p.grad.div_(b["ntokens"])
                norm = float(p.grad.norm())
                if a.clip_norm > 0 and norm > a.clip_norm:
                    p.grad.mul_(a.clip_norm / (norm + 1e-6))
        opt.step(milestone_lr(k, a.lr, a.warmup_updates, a.warmup_init_lr, (300000, 450000), 0.1))
        sec = time.perf_counter() - t0
        if k >= a.warmup:
            timed_tokens += b["ntokens"]
            timed_seconds += sec
        print(json.dumps({"update": k + 1, "loss_bits": round(loss.item() / b["ntokens"] / math.log(2), 4),
                          "ntokens": b["ntokens"], "sec": round(sec, 3), "wps": round(b["ntokens"] / sec, 1),
                          "timed": k >= a.warmup}), flush=True)
    if timed_seconds > 0:
        print(f"timed updates {updates - a.warmup}: {timed_tokens} target tokens in {timed_seconds:.2f} s = "
              f"{timed_tokens / timed_seconds:.1f} target tokens/s", flush=True)


if __name__ == "__main__":
    main()
