"""Verdicts on the adversarial corpus, one line each (a script, not a test: tests/test_adversarial*.py
assert the expectations; this records what happened, with times, for results files).

    python benchmarks/corpus_verdicts.py --device cuda --kind gpu --out gpu-corpus.jsonl
    python benchmarks/corpus_verdicts.py --device cuda --kind cpu --names identical,timer_patch
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from corpus_util import cases, substitutions  # noqa: E402
from envinfo import environment  # noqa: E402

from cuda_l1.evaluate.config import EvalConfig, TimingConfig  # noqa: E402
from cuda_l1.evaluate.evaluator import Evaluator  # noqa: E402


def _meets(case, verdict) -> bool:
    if case.expect == "not_faster":
        return verdict.status != "ok" or verdict.raw_speedup <= 1.1
    if verdict.status != case.expect:
        return False
    if verdict.status == "ok":
        lo, hi = case.bounds.get("speedup_at_least"), case.bounds.get("speedup_at_most")
        return (lo is None or verdict.raw_speedup >= lo) and (hi is None or verdict.raw_speedup <= hi)
    return True


def listeners(workdir: Path) -> tuple[int, str, list]:
    """A TCP port on loopback and a Unix socket on the host, both listening, for the cases that try to
    reach them (network_access, unix_socket): they must run as written, not fail on a placeholder."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    path = workdir / "host.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(path))
    path.chmod(0o777)
    unix.listen(4)
    return tcp.getsockname()[1], str(path), [tcp, unix]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kind", default="gpu", help="corpus folder: gpu or cpu")
    parser.add_argument("--names", default="", help="only these cases (comma-separated)")
    parser.add_argument("--quick", action="store_true", help="quick timing")
    parser.add_argument("--out", default=None, help="JSON lines file to write")
    args = parser.parse_args()
    wanted = {n for n in args.names.split(",") if n}
    selected = [c for c in cases(args.kind) if not wanted or c.name in wanted]
    evaluators: dict[str, Evaluator] = {}
    out = open(args.out, "w") if args.out else None
    workdir = Path(tempfile.mkdtemp(prefix="cuda-l1-corpus-"))
    workdir.chmod(0o755)  # a side's unprivileged uid must reach the Unix socket in it
    port, unix_path, sockets = listeners(workdir)
    if out:
        out.write(json.dumps({"environment": environment()}) + "\n")
    try:
        for case in selected:
            t0 = time.perf_counter()
            try:
                if case.reference not in evaluators:
                    timing = TimingConfig.quick() if args.quick else TimingConfig()
                    evaluators[case.reference] = Evaluator(case.task(), EvalConfig(device=args.device, timing=timing,
                                                                                   call_timeout_s=30.0, first_call_timeout_s=90.0))
                source = case.source(**substitutions(case, workdir, port, unix_path))
                verdict = evaluators[case.reference].evaluate(source)
            except Exception as exc:  # noqa: BLE001 - recorded, then the next case
                row = {"case": case.name, "expect": case.expect, "error": f"{type(exc).__name__}: {exc}"}
            else:
                failed = [f"{c.name}: {c.detail[:200]}" for c in verdict.checks if c.passed is False]
                row = {"case": case.name, "expect": case.expect, "status": verdict.status, "met": _meets(case, verdict),
                       "raw": verdict.raw_speedup, "score": verdict.speedup, "ci": verdict.ci,
                       "reference_ms": verdict.reference_ms, "candidate_ms": verdict.candidate_ms,
                       "rounds": verdict.timing.get("rounds"), "calls_per_window": verdict.timing.get("calls_per_window"),
                       "window_overhead_ms": verdict.timing.get("window_overhead_ms"),
                       "launch_share": verdict.timing.get("launch_share"),
                       "process_spread": verdict.timing.get("process_spread"),
                       "replanned": verdict.timing.get("replanned"),
                       "failed_checks": failed,
                       # the whole reason where the verdict was unexpected (a traceback ends with its cause)
                       "reasons": [r[:300] if _meets(case, verdict) else r[-3000:] for r in verdict.reasons],
                       "sandbox": verdict.sandbox, "log_tail": verdict.log[-600:] if not _meets(case, verdict) else ""}
            row["seconds"] = round(time.perf_counter() - t0, 2)
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    finally:
        for ev in evaluators.values():
            ev.close()
        for sock in sockets:
            sock.close()
        shutil.rmtree(workdir, ignore_errors=True)
        if out:
            out.close()


if __name__ == "__main__":
    main()
