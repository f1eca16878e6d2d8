"""Writer process for the kill -9 test of the history store (run as a script, not collected by pytest).

usage: python store_writer.py DB TOTAL

Records verdicts for candidates 0..TOTAL-1 of one task in one run, resuming where an earlier
(killed) writer stopped. Protocol on stdout, one line each, flushed:
  start K        K verdicts of the run were already recorded when this writer began
  first I        the first candidate index this writer records itself
  recorded I ID  printed only after the verdict for candidate I (id ID) was committed
  done
"""

from __future__ import annotations

import sys

from cuda_l1.evaluate.verdict import Verdict
from cuda_l1.store import Store
from cuda_l1.tasks.task import Task

RUN_NAME = "kill-test"
DEVICE = "cpu"
CONFIG_KEY = "kill-test-config"
TASK = Task(name="1_Square", level=1, number=1, source="class Model:\n    pass\n")


def candidate_code(index: int) -> str:
    return f"class ModelNew:\n    index = {index}\n"


def main(db: str, total: int) -> None:
    with Store(db) as store:
        store.add_task(TASK)
        runs = store.runs(RUN_NAME)
        run_id = runs[0].id if runs else store.start_run(RUN_NAME, {"total": total})
        print(f"start {len(store.run_results(run_id))}", flush=True)
        first = None
        for index in range(total):
            cid, _ = store.add_candidate(TASK.id, candidate_code(index), {"kind": "manual"}, run_id)
            if store.verdict_for(cid, DEVICE, CONFIG_KEY) is not None:
                continue
            if first is None:
                first = index
                print(f"first {index}", flush=True)
            verdict = Verdict(status="ok", speedup=1.0 + index / 1000, device=DEVICE, task_id=TASK.id)
            store.record_verdict(cid, verdict, run_id=run_id, config_key=CONFIG_KEY)
            print(f"recorded {index} {cid}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
