"""What every byte of a legacy CUDA IPC handle does, seen from another process: the premise of allocations.py.

allocations.py tells allocations apart by their memory, testing input buffers whatever size a mapping
reports, and outputs of one size against each other. That holds if every name of an allocation maps it
whole, from its start. This sweep checks it: an exporter process makes allocations A and B of one size,
C of another, and D, which it never exports, each filled with its own byte. The opener edits each byte
of A's handle with several values, opens each edit, and records whether it opened, where, the size the
driver reports for the mapping, whose bytes it shows, and whether allocations.same_memory finds it to
be A's mapping. It also records whether exporting A again gives the same string, and whether any edit
reaches D (memory no handle was made for).

    python3 benchmarks/gpu_hypotheses/handle_sweep.py --out OUT/handle_sweep.json     (a GPU, about 30 s)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

DEVICE = "cuda:0"
SIZE = (50 << 20) + 4352  # not a multiple of the driver's granularity: its rounding shows in the sizes
TAGS = {"A": 17, "B": 34, "C": 51, "D": 68}
EDITS = (0x01, 0x02, 0x10, 0x80, 0xFF)


def _exporter(handles, done) -> None:
    from cuda_l1.evaluate import cudadrv

    sizes = {"A": SIZE, "B": SIZE, "C": 3 << 20, "D": SIZE}
    bases = {name: cudadrv.alloc(DEVICE, n) for name, n in sizes.items()}
    for name, base in bases.items():
        cudadrv.tensor_at(DEVICE, base, 4096).fill_(TAGS[name])
    import torch

    torch.cuda.synchronize()
    handles.put({"A": cudadrv.export_base(bases["A"]), "A_again": cudadrv.export_base(bases["A"]),
                 "B": cudadrv.export_base(bases["B"]), "C": cudadrv.export_base(bases["C"])})
    done.wait(300)  # alive while the opener works: its allocations must stay


def _sweep(handles: dict) -> dict:
    from cuda_l1.evaluate import cudadrv
    from cuda_l1.evaluate.allocations import same_memory

    view = lambda ptr, n: cudadrv.tensor_at(DEVICE, ptr, n)  # noqa: E731
    tag_names = {v: k for k, v in TAGS.items()}
    base_a = cudadrv.open_handle(DEVICE, handles["A"])
    report = {"export_deterministic": handles["A"] == handles["A_again"],
              "a_mapping": {"base": base_a, "size": cudadrv.allocation_size(base_a)},
              "bytes_differing_a_b": [i for i in range(64) if handles["A"][2 * i:2 * i + 2] != handles["B"][2 * i:2 * i + 2]],
              "edits": []}
    for i in range(64):
        for x in EDITS:
            raw = bytearray.fromhex(handles["A"])
            raw[i] ^= x
            row = {"byte": i, "xor": x}
            try:
                base = cudadrv.open_handle(DEVICE, raw.hex())
            except cudadrv.CudaDriverError as exc:
                row["error"] = str(exc)[:80]
                report["edits"].append(row)
                continue
            row.update(base_is_a=base == base_a, size=cudadrv.allocation_size(base),
                       shows=tag_names.get(int(view(base, 1).item()), "other"),
                       same_memory_as_a=base != base_a and same_memory(view, base, [base_a]) == 0)
            report["edits"].append(row)
    opened = [r for r in report["edits"] if "error" not in r]
    report["summary"] = {
        "edits_tried": len(report["edits"]), "opened": len(opened),
        "opened_bytes": sorted({r["byte"] for r in opened}),
        "other_size": [(r["byte"], r["xor"], r["size"]) for r in opened if r["size"] != report["a_mapping"]["size"]],
        "new_mapping_of_a": sorted({r["byte"] for r in opened if r["same_memory_as_a"]}),
        "reached_other": [(r["byte"], r["xor"], r["shows"]) for r in opened if r["shows"] not in ("A",)],
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    handles, done = ctx.Queue(), ctx.Event()
    exporter = ctx.Process(target=_exporter, args=(handles, done))
    exporter.start()
    try:
        report = _sweep(handles.get(timeout=120))
    finally:
        done.set()
        exporter.join(30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
