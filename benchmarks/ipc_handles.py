"""What a CUDA IPC memory handle is made of: could a side guess another process's handle from its own?
(A script, not a test; needs a GPU.)

On a GPU the candidate's side exports an IPC handle for each output allocation so that the reference's
side can read it; the reference's side exports none, since a candidate that could name a handle to the
reference's outputs could open it and copy them. Whether a handle can be guessed decides whether the
reference's side may export handles too (which, in one ablation, removed a 1-3% bias on memory-bound
tasks). This script starts two processes, has each export handles for a few fresh allocations, and
writes the handles and which of their bytes differ within one process and between the two. It then
has the second process try to open handles made from its own by the smallest changes that would
reach the first's (each varying byte set to the first process's value, one field at a time), as a
candidate that had learned the layout would. The two processes are not confined: sides are, alike,
and the reference's side opens the candidate's handles, so confinement does not stop a side that
holds the right bytes; what matters is whether it can come by them.

    python benchmarks/ipc_handles.py --out OUT/ipc_handles.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

COUNT = 3  # allocations per process

EXPORTER = r"""
import json, sys, torch
from cuda_l1.evaluate import cudadrv
device = sys.argv[1]
ptrs = [cudadrv.alloc(device, 1 << 20) for _ in range(int(sys.argv[2]))]
for i, p in enumerate(ptrs):
    cudadrv.tensor_at(device, p, 1 << 20).fill_(0x5A + i)
torch.cuda.synchronize()
print(json.dumps([cudadrv.export_base(p) for p in ptrs]), flush=True)
for line in sys.stdin:  # handles to try: one per line; answers "opened" or the driver's error
    try:
        base = cudadrv.open_handle(device, line.strip())
        first = int(cudadrv.tensor_at(device, base, 1)[0])
        cudadrv.close_handle(base)
        print(json.dumps({"opened": True, "first_byte": first}), flush=True)
    except Exception as exc:  # noqa: BLE001 - the answer is the error
        print(json.dumps({"opened": False, "error": str(exc)[:120]}), flush=True)
"""


def start(device: str) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", EXPORTER, device, str(COUNT)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def differing(handles: list[str]) -> list[int]:
    """Byte positions at which the handles are not all equal."""
    raw = [bytes.fromhex(h) for h in handles]
    return [i for i in range(len(raw[0])) if len({r[i] for r in raw}) > 1]


def ask(proc: subprocess.Popen, handle: str) -> dict:
    proc.stdin.write(handle + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    victim, theirs = start(args.device)
    attacker, mine = start(args.device)
    try:
        within = differing(mine)
        between = differing([mine[0], theirs[0]])
        attempts = []
        # The exact bytes first (what possession of a handle gives), then guesses built from the
        # attacker's own handle with each run of differing bytes replaced by the victim's.
        attempts.append({"what": "the victim's handle, exact", **ask(attacker, theirs[0])})
        mine0, target = bytearray.fromhex(mine[0]), bytes.fromhex(theirs[0])
        runs, run = [], []
        for i in between:
            if run and i != run[-1] + 1:
                runs.append(run)
                run = []
            run.append(i)
        if run:
            runs.append(run)
        for run in runs:
            guess = bytearray(mine0)
            for i in run:
                guess[i] = target[i]
            attempts.append({"what": f"own handle with bytes {run[0]}-{run[-1]} set to the victim's",
                             **ask(attacker, guess.hex())})
        out = {"environment": environment(), "handle_bytes": len(bytes.fromhex(mine[0])),
               "own_handles": mine, "other_process_handles": theirs,
               "bytes_differing_within_one_process": within, "bytes_differing_between_processes": between,
               "attempts": attempts}
    finally:
        for proc in (victim, attacker):
            proc.stdin.close()
            proc.wait(timeout=30)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: v for k, v in out.items() if k != "environment"}, indent=1))


if __name__ == "__main__":
    main()
