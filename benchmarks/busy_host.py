"""Honest candidates on a crowded CPU host (a script, not a test).

Starts `--busy` processes that spin on the CPU, then evaluates honest candidates of the adversarial
corpus (identical code and friends) `--repeats` times each with the CPU corpus settings, and reports
every verdict's status and its timing-consistency check (excess vs allowance). An honest candidate
must stay `ok` however busy the host is.

    python benchmarks/busy_host.py --busy 5 --repeats 4 --out busy.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "tests"))

from corpus_util import cases  # noqa: E402
from envinfo import environment  # noqa: E402

from cuda_l1.evaluate.config import EvalConfig, TimingConfig  # noqa: E402
from cuda_l1.evaluate.evaluator import Evaluator  # noqa: E402
from cuda_l1.evaluate.sandbox import SandboxConfig  # noqa: E402


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=5, help="spinning processes started alongside")
    parser.add_argument("--repeats", type=int, default=4, help="evaluations per candidate")
    parser.add_argument("--cases", default="identical,own_get_inputs", help="CPU corpus cases expected ok")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()

    corpus = {case.name: case for case in cases("cpu")}
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for proc in spinners:
        proc.start()
    rows = []
    try:
        for name in args.cases.split(","):
            case = corpus[name]
            timing = TimingConfig.quick()
            timing.max_time_s = 2.0
            config = EvalConfig(device="cpu", timing=timing, call_timeout_s=15.0, first_call_timeout_s=30.0,
                                sandbox=SandboxConfig(memory_bytes=3 * 2**30, max_processes=24))
            evaluator = Evaluator(case.task(), config)
            try:
                for repeat in range(args.repeats):
                    verdict = evaluator.evaluate(case.source())
                    check = verdict.check("timing_consistency")
                    row = {"case": name, "repeat": repeat, "status": verdict.status, "speedup": verdict.speedup,
                           "timing_consistency": check.detail if check else None, "reasons": verdict.reasons[:1]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                evaluator.close()
    finally:
        for proc in spinners:
            proc.kill()
    summary = {"busy_processes": args.busy, "evaluations": len(rows), "ok": sum(r["status"] == "ok" for r in rows)}
    print(json.dumps(summary))
    Path(args.out).write_text(json.dumps({"environment": environment(), "summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
