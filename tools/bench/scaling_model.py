#!/usr/bin/env python3
"""A scaling model, on paper, of luna-train's data parallelism (docs/gpu.md, "Multi-GPU and
multi-node").

PREDICTED figures: multi-GPU data parallelism has not run on real GPUs. Per update every rank
computes forward + backward on its own tokens, then the fp32 gradients (4 bytes x parameters) are
summed by NCCL all-reduce in buckets
(--bucket-size-mb, default 25); with overlap a bucket starts as soon as the backward pass has
finished its layers (trainer/grad_buckets.c), so only what is left when the backward ends is
exposed: the last bucket (the shared embedding, reported when the backward ends) and any backlog.

  compute   t_c = 6 * P * T / (peak * MFU)          (6 FLOPs per parameter per target token; the
                                                      encoder's tokens ~ the decoder's in WMT)
  backward  t_b = 2/3 * t_c
  bucket    t(S) = alpha(W) + S * 2 (W-1)/W / busbw  (ring all-reduce; NCCL's bus bandwidth
                                                      definition, nccl-tests doc/PERFORMANCE.md)
  no overlap  t = t_c + sum t(bucket)
  overlap     t = t_c + t(last) + max(0, sum t(others) - t_b)
  efficiency  = t_c / t

Constants (sources):
  H100 SXM bf16 dense peak 989 TFLOP/s (NVIDIA H100 datasheet); MFU 0.40 (luna's GPU target);
  8 GPUs on NVLink: busbw 480 GB/s with NVLink SHARP, 370 GB/s ring
  (NVIDIA/nccl-tests#212, S. Jeaugey; 475 GB/s measured on 8 x H200, nccl-tests#272); across
  nodes, 8 x 400 Gb/s NDR per node at 46-48 GB/s per NIC (NVIDIA/nccl-tests#290, D. Addison):
  busbw 8 x 47 = 376 GB/s; latency alpha(W) = 10 us launch + 2 log2(W) x 5 us (tree hops).
"""
import argparse
import math

PEAK_BF16 = 989e12
MFU = 0.40
NVLINK_BUSBW = 480e9
NVLINK_RING_BUSBW = 370e9
IB_BUSBW = 8 * 47e9
LAUNCH = 10e-6
HOP = 5e-6


def alpha(w):
    return LAUNCH + (2 * math.log2(w) * HOP if w > 1 else 0)


def allreduce(size, w, busbw):
    return alpha(w) + size * 2 * (w - 1) / w / busbw


def buckets(tensors, bucket_bytes):
    """Bucket sizes in bytes, last (embedding, exposed) first in the returned list."""
    emb, layers = tensors
    out, cur = [], 0
    for t in layers:
        if cur and cur + t > bucket_bytes:
            out.append(cur)
            cur = 0
        cur += t
    if cur:
        out.append(cur)
    return [emb] + out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=int, default=65278976,
                    help="parameters (luna_base_tied, V = 32000: 65278976, as bench-model prints)")
    ap.add_argument("--embedding", type=int, default=32000 * 512, help="shared embedding parameters")
    ap.add_argument("--layers", type=int, default=12, help="encoder + decoder layers")
    ap.add_argument("--bucket-mb", type=float, default=25)
    args = ap.parse_args()
    P = args.params
    layer_bytes = 4 * (P - args.embedding) / args.layers
    tensors = (4 * args.embedding, [layer_bytes] * args.layers)
    bks = buckets(tensors, args.bucket_mb * 1024 * 1024)
    print(f"PREDICTED (no GPU measurement): luna_base_tied, {P} parameters = {4 * P / 1e6:.0f} MB of fp32 "
          f"gradients per update in {len(bks)} buckets (<= {args.bucket_mb:g} MB; the last, the "
          f"shared embedding, {bks[0] / 1e6:.1f} MB); H100 bf16 at {MFU:.0%} MFU")
    print(f"{'GPUs':>5} {'network':<26} {'tokens/GPU':>10} {'compute ms':>10} {'comm ms':>8} "
          f"{'eff. no overlap':>15} {'eff. overlap':>12} {'tok/s (overlap)':>16}")
    for w in (8, 64, 512):
        net = ("NVLink (SHARP) 480 GB/s", NVLINK_BUSBW) if w <= 8 else ("8x NDR IB/node 376 GB/s", IB_BUSBW)
        for tokens in (8192, 32768):
            tc = 6 * P * tokens / (PEAK_BF16 * MFU)
            tb = tc * 2 / 3
            times = [allreduce(b, w, net[1]) for b in bks]
            comm = sum(times)
            t_no = tc + comm
            t_ov = tc + times[0] + max(0.0, sum(times[1:]) - tb)
            print(f"{w:>5} {net[0]:<26} {tokens:>10} {tc * 1e3:>10.2f} {comm * 1e3:>8.2f} "
                  f"{tc / t_no:>15.1%} {tc / t_ov:>12.1%} {w * tokens / t_ov:>16,.0f}")
    ring = allreduce(4 * P, 8, NVLINK_RING_BUSBW)
    print(f"check: one 8-GPU ring all-reduce of all {4 * P / 1e6:.0f} MB at 370 GB/s busbw = "
          f"{ring * 1e3:.2f} ms (nccl-tests: time = size x 2(n-1)/n / busbw)")


if __name__ == "__main__":
    main()
