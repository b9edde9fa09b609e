"""Independent PyTorch transcription of the Apollo optimizer (spec /work/shared/spec/apollo.md)
and of fairseq's Adam (FairseqAdam: AdamW-style decoupled weight decay), in float64.

Written from the spec, line by line, NOT from the C kernels: v = d/den and delta are computed as the
spec writes them (the C code uses the equivalent Σ Δg·d / den², Σ B·d² / den²).

`storage` selects how state and parameters are kept between sub-steps:
  "f64": pure float64 throughout (the mathematical algorithm);
  "f32": every stored quantity (m, B, d, theta; Adam m, v, theta) is rounded to float32 when it is
         written and later sub-steps read the rounded value -- the C/GPU storage rule (fp32 state,
         double arithmetic per element; model/kernels/cpu/optimizer_kernels.c).
"""
import math

import torch

SIGMA = 0.01


def _store(x, storage):
    return x.to(torch.float32).to(torch.float64) if storage == "f32" else x


class Apollo:
    def __init__(self, params, beta=0.9, eps=1e-4, rebound="constant", weight_decay=0.0,
                 weight_decay_type="L2", storage="f64"):
        assert rebound in ("constant", "belief")
        assert weight_decay_type in ("L2", "decoupled", "stable")
        self.params = params  # dict name -> float64 tensor (updated in place)
        self.beta, self.eps, self.rebound = beta, eps, rebound
        self.wd, self.wd_type, self.storage = weight_decay, weight_decay_type, storage
        self.state = {n: {"step": 0,
                          "exp_avg": torch.zeros_like(p),
                          "approx_hessian": torch.zeros_like(p),
                          "update": torch.zeros_like(p)} for n, p in params.items()}

    def step(self, grads, lr):
        s_ = self.storage
        for name, theta in self.params.items():
            g = grads[name].to(torch.float64)
            st = self.state[name]
            m, B, d = st["exp_avg"], st["approx_hessian"], st["update"]
            # 1. L2
            if self.wd_type == "L2" and self.wd != 0:
                g = g + self.wd * theta
            # 2. step and bias-corrected alpha
            st["step"] += 1
            t = st["step"]
            beta = self.beta
            alpha = (1 - beta) / (1 - beta ** t)
            # 3. delta-g, rebound
            delta_grad = g - m
            if self.rebound == "constant":
                eps_p = self.eps / SIGMA
            else:
                r = delta_grad.abs().max().item()
                eps_p = self.eps
            # 4. first moment
            m_new = _store(m + alpha * delta_grad, s_)
            # 5. normalised previous update
            den = (d ** 4).sum().item() ** 0.25 + eps_p
            v = d / den
            # 6. the scalar
            delta = -alpha * (delta_grad * v).sum().item() / den - (B * v * v).sum().item()
            # 7. Hessian approximation
            B_new = _store(B + delta * v * v, s_)
            # 8. rectified denominator
            if self.rebound == "constant":
                D = B_new.abs().clamp(min=SIGMA)
            else:
                D = torch.maximum(B_new.abs(), torch.full_like(B_new, r)) + self.eps / alpha
            # 9. update direction
            d_new = m_new / D
            # 10. decoupled / stable decay
            if self.wd != 0 and self.wd_type == "decoupled":
                d_new = d_new + self.wd * theta
            elif self.wd != 0 and self.wd_type == "stable":
                d_new = d_new + (self.wd / D.mean().item()) * theta
            d_new = _store(d_new, s_)
            # 11. parameter
            theta.copy_(_store(theta - lr * d_new, s_))
            st["exp_avg"], st["approx_hessian"], st["update"] = m_new, B_new, d_new


class Adam:
    """fairseq/optim/adam.py (class Adam): m, v EMAs; denom = sqrt(v) + eps;
    step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t); p -= lr*wd*p; p -= step_size * m / denom."""

    def __init__(self, params, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0, storage="f64"):
        self.params = params
        self.b1, self.b2 = betas
        self.eps, self.wd, self.storage = eps, weight_decay, storage
        self.state = {n: {"step": 0, "exp_avg": torch.zeros_like(p),
                          "exp_avg_sq": torch.zeros_like(p)} for n, p in params.items()}

    def step(self, grads, lr):
        s_ = self.storage
        for name, p in self.params.items():
            g = grads[name].to(torch.float64)
            st = self.state[name]
            st["step"] += 1
            t = st["step"]
            m = _store(st["exp_avg"] * self.b1 + (1 - self.b1) * g, s_)
            v = _store(st["exp_avg_sq"] * self.b2 + (1 - self.b2) * g * g, s_)
            denom = v.sqrt() + self.eps
            step_size = lr * math.sqrt(1 - self.b2 ** t) / (1 - self.b1 ** t)
            p_new = p - self.wd * lr * p
            p_new = p_new - step_size * m / denom
            p.copy_(_store(p_new, s_))
            st["exp_avg"], st["exp_avg_sq"] = m, v


def _self_check():
    """Adam with storage f64 equals torch.optim.AdamW up to fairseq's eps placement when eps is
    negligible; Apollo's first step is theta -= lr * g / sigma (constant rebound, no decay)."""
    torch.manual_seed(0)
    p0 = torch.randn(5, 3, dtype=torch.float64)
    g = torch.randn(5, 3, dtype=torch.float64)
    ap = Apollo({"w": p0.clone()})
    ap.step({"w": g}, 0.01)
    assert torch.allclose(ap.params["w"], p0 - 0.01 * g / SIGMA, rtol=0, atol=1e-15)
    w = p0.clone().requires_grad_(True)
    ref = torch.optim.AdamW([w], lr=1e-3, betas=(0.9, 0.98), eps=1e-30, weight_decay=0.1)
    ad = Adam({"w": p0.clone()}, eps=1e-30, weight_decay=0.1)
    for k in range(5):
        gk = torch.randn(5, 3, dtype=torch.float64)
        w.grad = gk.clone()
        ref.step()
        ad.step({"w": gk}, 1e-3)
    assert torch.allclose(ad.params["w"], w.detach(), rtol=1e-12, atol=1e-14)
    print("apollo_reference self-check OK")


if __name__ == "__main__":
    _self_check()
