"""How long a side takes to start: a fresh interpreter against one forked by the fork server
(SandboxConfig.fork_server). Measures, for each, the time from SideProcess.start until the side is
ready for work (its harness took the channel key: confined, torch imported, the device context up
on a GPU), one side at a time and several at once. A script, not a test:

    python benchmarks/side_start.py --device cuda --count 8 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

from cuda_l1.evaluate import fork_server  # noqa: E402
from cuda_l1.evaluate.config import SandboxConfig  # noqa: E402
from cuda_l1.evaluate.sandbox import SideProcess  # noqa: E402


def ready_times(config: SandboxConfig, device: str, count: int, together: bool) -> list[float]:
    """Seconds until each of `count` sides was ready, started one after another or all at once."""
    times = []
    batches = [count] if together else [1] * count
    for size in batches:
        started = time.perf_counter()
        sides = [SideProcess.start(config, device, [], None) for _ in range(size)]
        pending = {id(s): s for s in sides}
        while pending and time.perf_counter() - started < 300:
            for key, side in list(pending.items()):
                if side.started():
                    times.append(time.perf_counter() - started)
                    del pending[key]
            time.sleep(0.002)
        for side in sides:
            side.close(graceful=False)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--count", type=int, default=6)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.device == "cuda":
        args.device = "cuda:0"  # a side is given one device, by index
    server_started = time.perf_counter()
    usable = fork_server.shared().usable()
    server_s = time.perf_counter() - server_started
    results = {}
    for name, fork in (("fresh", False), ("forked", True)):
        config = SandboxConfig(fork_server=fork)
        for together in (False, True):
            times = ready_times(config, args.device, args.count, together)
            key = f"{name}_{'together' if together else 'one_by_one'}"
            results[key] = {"median_s": statistics.median(times) if times else None,
                            "max_s": max(times) if times else None, "ready": len(times)}
            print(key, json.dumps(results[key]), flush=True)
    out = {"environment": environment(), "device": args.device, "count": args.count,
           "fork_server_usable": usable, "fork_server_start_s": server_s, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
