"""How long opening a schema-1 history store takes once it must be migrated (exact candidate ids).

Builds a store as schema 1 wrote it (candidate ids = the old normalised 12-digit `source_id`), with N
candidates spread over 50 tasks, each with a prompt listing two earlier candidates as exemplars, a run
entry, a verdict (4 KB log) and a completion. Then opens it with this code (which migrates it) and
checks every candidate's id is its code's exact id.

    python benchmarks/store_migration.py --candidates 5000 20000
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuda_l1.evaluate.verdict import Verdict  # noqa: E402
from cuda_l1.store import Store, schema  # noqa: E402
from cuda_l1.store.records import Origin  # noqa: E402
from cuda_l1.tasks import code_id, source_id  # noqa: E402

TASKS = 50


def build_schema_1(path: Path, n: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN")
    for step in schema.MIGRATIONS[0]:  # migrations are history: the first is schema 1 as it shipped
        conn.execute(step)
    conn.execute("PRAGMA user_version = 1")
    now = time.time()
    run = conn.execute("INSERT INTO runs (name, created_at) VALUES ('optimize', ?)", (now,)).lastrowid
    tasks = [f"{t:012x}" for t in range(TASKS)]
    for t, task in enumerate(tasks):
        conn.execute("INSERT INTO tasks VALUES (?, ?, 1, ?, 'source', '', '', ?)", (task, f"{t}_Task", t, now))
    rng = random.Random(0)
    seen: dict[str, list[str]] = {task: [] for task in tasks}
    for i in range(n):
        task = tasks[i % TASKS]
        code = f"import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * {i}   \n"
        cid = source_id(code)  # the schema-1 id: normalised text, 12 digits
        parents = rng.sample(seen[task], min(2, len(seen[task])))
        prompt = conn.execute("INSERT INTO prompts (run_id, task_id, messages, exemplar_ids, created_at)"
                              " VALUES (?, ?, ?, ?, ?)",
                              (run, task, json.dumps([{"role": "user", "content": "p" * 2000}]), json.dumps(parents),
                               now)).lastrowid
        origin = Origin(kind="llm", model="m", prompt_id=prompt, parent_ids=parents)
        conn.execute("INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (task, cid, code, cid, origin.to_json(), run, now))
        conn.execute("INSERT INTO run_candidates VALUES (?, ?, ?, ?)", (run, task, cid, i + 1))
        verdict = Verdict(status="ok", speedup=1.5, device="cpu", task_id=task, candidate_id=cid, log="x" * 4000)
        conn.execute("INSERT INTO verdicts (task_id, candidate_id, run_id, device, config_key, status, speedup, verdict,"
                     " created_at) VALUES (?, ?, ?, 'cpu', 'k', 'ok', 1.5, ?, ?)", (task, cid, run, verdict.to_json(), now))
        conn.execute("INSERT INTO completions (prompt_id, task_id, text, parse_status, candidate_id, created_at)"
                     " VALUES (?, ?, ?, 'ok', ?, ?)", (prompt, task, "answer " + code, cid, now))
        seen[task].append(cid)
    conn.execute("COMMIT")
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, nargs="+", default=[5000, 20000])
    args = parser.parse_args()
    for n in args.candidates:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "history.sqlite"
            build_schema_1(path, n)
            start = time.perf_counter()
            store = Store(path)
            seconds = time.perf_counter() - start
            rows = store._read("SELECT id, code FROM candidates")
            wrong = sum(code_id(row["code"]) != row["id"] for row in rows)
            store.close()
            print(json.dumps({"candidates": n, "migration_s": round(seconds, 2), "ids_not_exact": wrong}))


if __name__ == "__main__":
    main()
