"""What a window's reply costs (a script, not a test): a side describing N calls' outputs, encoding and
sending them over the authenticated channel, and the parent receiving, authenticating and decoding
them. All of it lies inside the timed window of whichever side replies, so it is harness cost that
dilutes every speedup toward 1, and any difference between the two sides' replies is a bias.

    python benchmarks/reply_cost.py --calls 178 --repeats 30
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

from cuda_l1.evaluate import validate  # noqa: E402
from cuda_l1.evaluate.channel import Channel  # noqa: E402
from cuda_l1.evaluate.protocol import CallOutputs, LeafRef, Ran, encode  # noqa: E402


def _calls(n: int, handle: bool) -> list[CallOutputs]:
    calls = []
    for i in range(n):
        leaf = LeafRef("tensor", "torch.Tensor", "float32", [4096, 4096], [4096, 1], 0, 64 << 20, "cuda:0")
        if handle:
            leaf.handle, leaf.handle_offset = "ab" * 64, 1024 * i
        else:
            leaf.address = 0x7F0000000000 + i * (64 << 20)
        calls.append(CallOutputs("tensor", [leaf]))
    return calls


def measure(n: int, handle: bool, repeats: int) -> dict:
    """Side: encode + send into a pipe another process drains. Parent: receive, authenticate, parse and
    validate the same frames, read back from a file (no second thread to share the interpreter with)."""
    key = secrets.token_bytes(32)
    calls = _calls(n, handle)
    sink = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    side = Channel(-1, sink.stdin.fileno(), key, is_parent=False)
    sent = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        side.send(encode(Ran(True, calls=calls, signals=[])))
        sent.append(time.perf_counter() - t0)
    sink.stdin.close()
    sink.wait()

    with tempfile.TemporaryFile() as fh:
        writer = Channel(-1, fh.fileno(), key, is_parent=False)
        for _ in range(repeats):
            writer.send(encode(Ran(True, calls=calls, signals=[])))
        size = fh.tell() // repeats
        fh.seek(0)
        parent = Channel(fh.fileno(), -1, key, is_parent=True)
        received = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            got = parent.recv(timeout=30)
            validate.decode(got.header, from_side=True)
            received.append(time.perf_counter() - t0)
    return {"calls": n, "handles": handle, "side_encode_send_ms": round(statistics.median(sent) * 1e3, 3),
            "parent_receive_validate_ms": round(statistics.median(received) * 1e3, 3), "frame_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=178)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = [measure(args.calls, handle, args.repeats) for handle in (False, True)]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
