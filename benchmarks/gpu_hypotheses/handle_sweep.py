"""What every byte of a legacy CUDA IPC handle does, seen from another process: the premise of allocations.py.

allocations.py tells allocations apart by their memory, testing input buffers whatever size a mapping
reports, and outputs of one size against each other. That holds if every name of an allocation maps it
whole, from its start. This sweep checks it: an exporter process makes allocations A and B of one size,
C of another, and D, which it never exports, each filled with its own byte. The opener edits each byte
of A's handle with several values, opens each edit, and records whether it opened, where, the size the
driver reports for the mapping, whose bytes it shows, and whether allocations.same_memory finds it to
be A's mapping (a read that faults is recorded as such, and the next opener process goes on after
it). It also records whether exporting A again gives the same string, and whether any edit
reaches D (memory no handle was made for).

    python3 benchmarks/gpu_hypotheses/handle_sweep.py --out OUT/handle_sweep.json     (a GPU, about 30 s)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import sys
import time
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


EDIT_LIST = [(i, x) for i in range(64) for x in EDITS]


def _opener(handles: dict, first: int, rows) -> None:
    """Opens the edits from `first` on, one row each. A read that faults leaves this process's CUDA
    context unusable: the fault is reported and the process ends, and the next opener goes on after it."""
    from cuda_l1.evaluate import cudadrv
    from cuda_l1.evaluate.allocations import same_memory

    view = lambda ptr, n: cudadrv.tensor_at(DEVICE, ptr, n)  # noqa: E731
    tag_names = {v: k for k, v in TAGS.items()}
    base_a = cudadrv.open_handle(DEVICE, handles["A"])
    rows.put(("a_mapping", {"base": base_a, "size": cudadrv.allocation_size(base_a)}))
    for k in range(first, len(EDIT_LIST)):
        i, x = EDIT_LIST[k]
        raw = bytearray.fromhex(handles["A"])
        raw[i] ^= x
        row = {"byte": i, "xor": x}
        rows.put(("opening", k, dict(row)))  # an opener that dies here is not sent back to this edit
        try:
            base = cudadrv.open_handle(DEVICE, raw.hex())
        except cudadrv.CudaDriverError as exc:
            row["error"] = str(exc)[:80]
            rows.put(("row", k, row))
            continue
        row.update(base_is_a=base == base_a, size=cudadrv.allocation_size(base))
        rows.put(("opened", k, row))  # what is known before anything is read
        try:
            row.update(shows=tag_names.get(int(view(base, 1).item()), "other"),
                       same_memory_as_a=base != base_a and same_memory(view, base, [base_a]) == 0)
        except Exception as exc:  # noqa: BLE001 - a fault ends this context: reported, then the next opener
            row["read_fault"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
            rows.put(("row", k, row))
            return
        rows.put(("row", k, row))


def _sweep(handles: dict, ctx, deadline_s: float) -> dict:
    """Every edit, each opener process going on after the last edit whose read faulted (or that the
    opener died on)."""
    report = {"export_deterministic": handles["A"] == handles["A_again"],
              "bytes_differing_a_b": [i for i in range(64) if handles["A"][2 * i:2 * i + 2] != handles["B"][2 * i:2 * i + 2]],
              "openers": 0, "edits": []}
    done: dict[int, dict] = {}
    stop_at = time.monotonic() + deadline_s
    first = 0
    while first < len(EDIT_LIST) and time.monotonic() < stop_at:
        rows = ctx.Queue()
        opener = ctx.Process(target=_opener, args=(handles, first, rows))
        opener.start()
        report["openers"] += 1
        pending = None
        while time.monotonic() < stop_at:
            try:
                msg = rows.get(timeout=2)
            except queue.Empty:
                if not opener.is_alive():
                    break
                continue
            if msg[0] == "a_mapping":
                report.setdefault("a_mapping", msg[1])
            elif msg[0] in ("opening", "opened"):
                pending = (msg[1], msg[2])
            else:
                done[msg[1]] = msg[2]
                pending = None
                if "read_fault" in msg[2]:
                    break
        opener.join(10)
        if opener.is_alive():
            opener.kill()
        if pending is not None:  # the opener died reading it, without a word
            done[pending[0]] = {**pending[1], "read_fault": f"the opener ended (exit code {opener.exitcode})"}
        elif opener.exitcode not in (0, None) and first == max(done, default=-1) + 1:
            break  # it died before any edit: nothing would change with another opener
        first = max(done, default=-1) + 1
    report["edits"] = [done[k] for k in sorted(done)]
    report["complete"] = len(done) == len(EDIT_LIST)
    opened = [r for r in report["edits"] if "error" not in r]
    size_a = report.get("a_mapping", {}).get("size")
    report["summary"] = {
        "edits_tried": len(report["edits"]), "of": len(EDIT_LIST), "opened": len(opened), "openers": report["openers"],
        "opened_bytes": sorted({r["byte"] for r in opened}),
        "other_size": [(r["byte"], r["xor"], r.get("size")) for r in opened if r.get("size") != size_a],
        "read_faults": [(r["byte"], r["xor"], r.get("size")) for r in opened if "read_fault" in r],
        "new_mapping_of_a": sorted({r["byte"] for r in opened if r.get("same_memory_as_a")}),
        "reached_other": [(r["byte"], r["xor"], r["shows"]) for r in opened if r.get("shows") not in (None, "A")],
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=240, help="stop opening edits after this long")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    handles, done = ctx.Queue(), ctx.Event()
    exporter = ctx.Process(target=_exporter, args=(handles, done))
    exporter.start()
    try:
        report = _sweep(handles.get(timeout=120), ctx, args.deadline_s)
    finally:
        done.set()
        exporter.join(30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
