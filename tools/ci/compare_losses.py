#!/usr/bin/env python3
"""Compare two luna-train loss curves logged at every update (--log-format json --log-interval 1):
the CPU's (fp32, the specification) and the GPU's (bf16) on the same batches, seeds and dropout
streams. Prints the losses side by side at a few updates and the windowed means; exits 1 when the
curves disagree beyond the bound:

  - the first 10 updates: |loss_gpu - loss_cpu| <= 2% of loss_cpu at each (the same weights up to
    bf16 rounding: the difference is bf16's ~3 significant digits in every activation, not yet
    moved by the optimizer);
  - each window of 50 updates: |mean_gpu - mean_cpu| <= 3% of mean_cpu (the trajectories part as
    rounding differences pass through the updates; what must hold is that both learn alike).

usage: compare_losses.py CPU.jsonl GPU.jsonl"""
import json
import sys

FIRST, FIRST_REL, WINDOW, WINDOW_REL = 10, 0.02, 50, 0.03


def read(path):
    losses = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{") and '"num_updates"' in line:
            row = json.loads(line)
            losses[int(row["num_updates"])] = float(row["loss"])
    return losses


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    cpu, gpu = read(argv[1]), read(argv[2])
    common = sorted(set(cpu) & set(gpu))
    if len(common) < FIRST:
        print(f"compare_losses: only {len(common)} updates in both logs", file=sys.stderr)
        return 1
    bad = []
    print("update  loss cpu (fp32)  loss gpu (bf16)  rel. difference")
    for u in common:
        rel = abs(gpu[u] - cpu[u]) / abs(cpu[u])
        if u <= FIRST and rel > FIRST_REL:
            bad.append(f"update {u}: {rel:.2%} > {FIRST_REL:.0%}")
        if u <= 3 or u in (10, 50, 100, 150, 200) or u == common[-1]:
            print(f"{u:6d}  {cpu[u]:15.4f}  {gpu[u]:15.4f}  {rel:15.2%}")
    print(f"window  mean cpu  mean gpu  rel. difference (bound {WINDOW_REL:.0%})")
    for w0 in range(0, common[-1], WINDOW):
        us = [u for u in common if w0 < u <= w0 + WINDOW]
        if not us:
            continue
        mc, mg = sum(cpu[u] for u in us) / len(us), sum(gpu[u] for u in us) / len(us)
        rel = abs(mg - mc) / abs(mc)
        print(f"{w0 + 1:4d}-{us[-1]:<4d} {mc:8.4f}  {mg:8.4f}  {rel:8.2%}")
        if rel > WINDOW_REL:
            bad.append(f"updates {w0 + 1}-{us[-1]}: means differ by {rel:.2%} > {WINDOW_REL:.0%}")
    for b in bad:
        print(f"compare_losses: {b}", file=sys.stderr)
    print("compare_losses: " + ("the curves disagree" if bad else "the curves agree within the bound"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
