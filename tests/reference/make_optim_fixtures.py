"""Writes tests/fixtures/optim/*.safetensors from apollo_reference.py (deterministic, seed 0).

inputs.safetensors   init.<name> F32 [shape]; grads.<name> F32 [20, shape...]; lr F64 [20]
                     metadata: names (JSON list), steps "20"
<case>.safetensors   param.<name> F32 and optimizer.<state>.<name> F32 after 20 steps
                     (state: exp_avg, approx_hessian, update for Apollo; exp_avg, exp_avg_sq for
                     Adam); metadata: config (JSON: optimizer, rebound, weight_decay_type,
                     weight_decay, beta, eps, adam_beta1, adam_beta2, adam_eps)
Cases: apollo_{constant,belief}_{L2,decoupled,stable} (weight_decay 0.05) and adam (0.05).
The stored results use the fp32-storage rule of the C kernels (storage="f32"); the script prints
how far they are from the pure float64 algorithm (storage="f64") for each case.
Run: /usr/bin/python3 tests/reference/make_optim_fixtures.py
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apollo_reference import Adam, Apollo  # noqa: E402
from safetensors_io import save_file  # noqa: E402

STEPS = 20
SHAPES = {"a.bias": [7], "b.weight": [5, 3], "c.weight": [33, 17], "d.scale": [1]}
WD = 0.05
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "optim")


def make_inputs():
    g = torch.Generator().manual_seed(0)
    init = {n: torch.randn(s, generator=g, dtype=torch.float32) for n, s in SHAPES.items()}
    grads = {}
    for i, (n, s) in enumerate(SHAPES.items()):
        scale = [1.0, 0.3, 0.05, 2.0][i]
        base = torch.randn(s, generator=g, dtype=torch.float32)
        seq = []
        for k in range(STEPS):
            noise = torch.randn(s, generator=g, dtype=torch.float32)
            # a persistent direction plus noise whose size varies with the step
            seq.append((scale * (0.7 * base + (0.5 + 0.5 * (k % 3)) * noise)).float())
        grads[n] = torch.stack(seq)
    # warmup-like: linear from 1e-3 to 0.05 over 8 steps, then 0.05/sqrt(k/8)
    lr = [1e-3 + k * (0.05 - 1e-3) / 8 if k < 8 else 0.05 * (8 / k) ** 0.5 for k in range(STEPS)]
    return init, grads, np.array(lr, dtype=np.float64)


def run(opt_factory, init, grads, lr, storage):
    params = {n: t.to(torch.float64).clone() for n, t in init.items()}
    opt = opt_factory(params, storage)
    for k in range(STEPS):
        opt.step({n: grads[n][k] for n in params}, float(lr[k]))
    return params, opt


def rel(a, b):
    m = b.abs().max().item()
    return (a - b).abs().max().item() / (m if m > 0 else 1.0)


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    init, grads, lr = make_inputs()
    tensors = {}
    for n in SHAPES:
        tensors["init." + n] = init[n].numpy()
    for n in SHAPES:
        tensors["grads." + n] = grads[n].numpy()
    tensors["lr"] = lr
    save_file(tensors, os.path.join(OUT, "inputs.safetensors"),
              {"names": json.dumps(list(SHAPES)), "steps": str(STEPS)})

    cases = []
    for rebound in ("constant", "belief"):
        for wdt in ("L2", "decoupled", "stable"):
            cfg = {"optimizer": "apollo", "rebound": rebound, "weight_decay_type": wdt,
                   "weight_decay": WD, "beta": 0.9, "eps": 1e-4}
            cases.append((f"apollo_{rebound}_{wdt}", cfg,
                          lambda p, s, r=rebound, w=wdt: Apollo(p, 0.9, 1e-4, r, WD, w, s),
                          ("exp_avg", "approx_hessian", "update")))
    cfg = {"optimizer": "adam", "weight_decay": WD, "adam_beta1": 0.9, "adam_beta2": 0.98,
           "adam_eps": 1e-8}
    cases.append(("adam", cfg, lambda p, s: Adam(p, (0.9, 0.98), 1e-8, WD, s),
                  ("exp_avg", "exp_avg_sq")))

    for name, cfg, factory, kinds in cases:
        p32, o32 = run(factory, init, grads, lr, "f32")
        p64, o64 = run(factory, init, grads, lr, "f64")
        out = {}
        worst = 0.0
        for n in SHAPES:
            out["param." + n] = p32[n].float().numpy()
            worst = max(worst, rel(p32[n], p64[n]))
        for k in kinds:
            for n in SHAPES:
                out[f"optimizer.{k}.{n}"] = o32.state[n][k].float().numpy()
                worst = max(worst, rel(o32.state[n][k], o64.state[n][k]))
        save_file(out, os.path.join(OUT, name + ".safetensors"), {"config": json.dumps(cfg)})
        print(f"{name}: fp32-storage vs pure float64 max rel error {worst:.3e}")


if __name__ == "__main__":
    main()
