"""Errors of honest and lower-precision variants of a bf16 Linear (1024 x 1024 by 1024 -> 2048, random
inputs), against the float64 oracle rounded to bf16, in bf16 epsilons times max|output|; the
tolerance.error_factor each would need to pass (negative: it passes on the floor alone); and whether
precision.compare passes it with today's settings.

    PYTHONPATH=src python3 benchmarks/results/2026-12-05-cpu-int8-on-bf16/variants.py 3
"""
import json, sys, warnings
import torch
import torch.nn.functional as F
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
from cuda_l1.evaluate.precision import compare, floor_epsilons
from cuda_l1.evaluate.tolerance import ToleranceConfig

B, K, N = 1024, 1024, 2048
def variants(x, w, b):
    xf, wf, bf = x.float(), w.float(), b.float()
    out = {}
    out["reference"] = F.linear(x, w, b)
    out["fp32_then_round"] = F.linear(xf, wf, bf).bfloat16()
    out["unfused_bias_bf16"] = (x @ w.T) + b
    out["splitK2_fp32"] = ((xf[:, :K//2] @ wf[:, :K//2].T) + (xf[:, K//2:] @ wf[:, K//2:].T) + bf).bfloat16()
    out["splitK2_bf16_partials"] = (x[:, :K//2] @ w[:, :K//2].T) + (x[:, K//2:] @ w[:, K//2:].T) + b
    out["splitK4_bf16_partials"] = sum(x[:, i*K//4:(i+1)*K//4] @ w[:, i*K//4:(i+1)*K//4].T for i in range(4)) + b
    out["fp16_compute"] = F.linear(x.half(), w.half(), b.half()).bfloat16()
    # int8, full range, per-channel weights, per-tensor activation (the reviewer's)
    scale = (wf.abs().amax(1) / 127).double()
    qw = torch.quantize_per_channel(wf, scale, torch.zeros(N, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(qw, bf)
    out["int8_dynamic_fullrange"] = torch.ops.quantized.linear_dynamic(xf, packed, False).bfloat16()
    # int8 per-row activations, per-channel weights, exact int32 accumulate (emulated in float64)
    sx = xf.abs().amax(1, keepdim=True) / 127
    sw = wf.abs().amax(1, keepdim=True) / 127
    qx = torch.round(xf / sx).clamp(-127, 127)
    qwt = torch.round(wf / sw).clamp(-127, 127)
    out["int8_rowwise_exact"] = ((qx.double() @ qwt.double().T) * sx.double() * sw.double().T + bf.double()).bfloat16()
    # fp8 e4m3 inputs, fp32 accumulate
    f8 = torch.float8_e4m3fn
    out["fp8_e4m3"] = F.linear(x.to(f8).float(), w.to(f8).float(), bf).bfloat16()
    return out

rows = {}  # name -> per seed: (max error in bf16 epsilons of max|output|, error_factor it needs, passes today)
for seed in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(K, N, dtype=torch.bfloat16)
    x = torch.randn(B, K, dtype=torch.bfloat16)
    w, b = lin.weight.detach(), lin.bias.detach()
    oracle = F.linear(x.double(), w.double(), b.double())
    vs = variants(x, w, b)
    ref = vs["reference"]
    cfg = ToleranceConfig()
    floor = floor_epsilons(torch.bfloat16, cfg)
    rounded = oracle.bfloat16().double()
    ref_err = (ref.double() - rounded).abs().max().item()
    scale = rounded.abs().max().item()
    ulp = 2 ** -7 * scale  # bf16 eps times max|o| (an upper-ulp unit at the max)
    for name, out in vs.items():
        c = compare(out, ref, oracle, cfg)
        err = (out.double() - rounded).abs().max().item()
        need = (err - floor * scale) / ref_err if ref_err else float("inf")
        rows.setdefault(name, []).append((round(err / ulp, 2), round(need, 2), c.ok))
    rows.setdefault("_ref_err_ulps", []).append(round(ref_err / ulp, 3))
for name, r in rows.items():
    print(f"{name:26s}", r)
