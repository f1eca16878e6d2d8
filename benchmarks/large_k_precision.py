"""How far honest float32 arithmetic and reduced-precision operands stray from float64 on a long reduction of
positive products (KernelBench's large-K matmul with `torch.rand` inputs), against the oracle policy's
allowance (10 x the reference's own error + 64 float32 epsilons x max|output|). A script, not a test:

    python benchmarks/large_k_precision.py --k 131072 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402


def tf32(t: torch.Tensor) -> torch.Tensor:
    """Operands rounded to TF32 (10 explicit mantissa bits, round to nearest), held in float32."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=131072)
    parser.add_argument("--outputs", type=int, default=16, help="rows and columns of the product (M = N)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    m = n = args.outputs
    a, b = torch.rand(m, args.k), torch.rand(args.k, n)
    exact = a.double() @ b.double()

    def error(x: torch.Tensor) -> float:
        return (x.double() - exact).abs().max().item()

    products = (a[:, :, None] * b[None, :, :]).numpy()
    sequential = np.zeros((m, n), dtype=np.float32)  # one thread per output, adding in order (a plain CUDA kernel)
    for k in range(args.k):
        sequential += products[:, k, :]
    chunk = args.k // 64
    reference = error(a @ b)
    rows = {
        "reference (torch.matmul, float32)": reference,
        "float32, sequential (one accumulator per output)": error(torch.from_numpy(sequential)),
        "float32, split-K over 64 parts": error(sum(a[:, i:i + chunk] @ b[i:i + chunk] for i in range(0, args.k, chunk))),
        "float32, pairwise (torch.sum of the products)": error(torch.from_numpy(products).sum(dim=1)),
        "TF32 operands, float32 accumulation": error(tf32(a) @ tf32(b)),
        "float16 operands, float32 accumulation": error(a.half().float() @ b.half().float()),
        "bfloat16 operands, float32 accumulation": error(a.bfloat16().float() @ b.bfloat16().float()),
    }
    allowed = 10 * reference + 64 * torch.finfo(torch.float32).eps * exact.abs().max().item()
    for name, value in rows.items():
        print(f"{name:52s} {value:10.4f}  {'passes' if value <= allowed else 'fails'}")
    print(f"{'allowance':52s} {allowed:10.4f}")
    Path(args.out).write_text(json.dumps({"environment": environment(), "k": args.k, "outputs": m,
                                          "max_abs_error_vs_float64": rows, "allowance": allowed}, indent=2))


if __name__ == "__main__":
    main()
