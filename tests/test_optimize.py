"""The optimisation loop end to end on CPU: a real scripted chat server, the real evaluator (sandboxed
children), a real SQLite store, and the `cuda-l1 optimize` command in subprocesses for kill -9 and
credential checks."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chat_server import ChatServer, Reply
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.llm import EndpointConfig
from cuda_l1.search import SearchConfig, run_optimize
from cuda_l1.search.ledger import read_events
from cuda_l1.store import Store, candidate_id
from cuda_l1.tasks import load_solutions_jsonl

MODEL = "test-model"

# A tall input through two projections: (x @ A) @ B costs ROWS*DIM*DIM; x @ (A @ B) about DIM/OUT times less.
CHAIN_TASK = '''"""Two chained projections of a tall input: (x @ A) @ B."""

import torch
import torch.nn as nn

ROWS = 2048
DIM = 256
OUT = 8


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(DIM, DIM) / DIM ** 0.5)
        self.b = nn.Parameter(torch.randn(DIM, OUT) / DIM ** 0.5)

    def forward(self, x):
        return (x @ self.a) @ self.b


def get_inputs():
    return [torch.randn(ROWS, DIM)]


def get_init_inputs():
    return []
'''

SCALE_TASK = '''"""Scale and shift: y = 2x + 1."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return []
'''

CHAIN_FAST = '''import torch
import torch.nn as nn

DIM = 256
OUT = 8


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(DIM, DIM) / DIM ** 0.5)
        self.b = nn.Parameter(torch.randn(DIM, OUT) / DIM ** 0.5)

    def forward(self, x):
        return x @ (self.a @ self.b)
'''

# The model repeats itself word for word: the same source is not evaluated a second time. (One that
# differs in comments or spacing is: a program can read its own layout.)
CHAIN_FAST_AGAIN = CHAIN_FAST

CHAIN_SYNTAX_ERROR = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x)
        return x
'''

SCALE_MUTATES_INPUT = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        x.mul_(2.0).add_(1.0)
        return x
'''

SCALE_RAISES = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        raise RuntimeError("scale kernel exploded: marker-41")
'''

SCALE_OK = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.add(x * 2.0, 1.0)
'''

CHATTER = "I believe the reference is already optimal, so I will not change anything."
TRUNCATED = ("The shift can be fused into the scale.\n```python\nimport torch\nimport torch.nn as nn\n\n"
             "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n    def forw")


def answer(code: str, note: str = "Analysis: the faster version does less work.") -> str:
    return f"{note}\n\n```python\n{code}```\n"


def write_tasks(root: Path, **sources: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        (root / f"{name}.py").write_text(source)
    return root


class Script:
    """Scripted answers per task (found by the task name the prompt carries), in call order."""

    def __init__(self, per_task: dict[str, list], default=CHATTER):
        self.per_task = per_task
        self.default = default
        self.prompts: dict[str, list[str]] = {name: [] for name in per_task}
        self._lock = threading.Lock()

    def __call__(self, body: dict):
        user = body["messages"][-1]["content"]
        name = next(n for n in self.per_task if f"`{n}`" in user)
        with self._lock:
            index = len(self.prompts[name])
            self.prompts[name].append(user)
        replies = self.per_task[name]
        reply = replies[index] if index < len(replies) else self.default
        return reply(index) if callable(reply) else reply


def quick_config() -> EvalConfig:
    return EvalConfig(device="cpu", timing=TimingConfig.quick())


def endpoint(server: ChatServer, **settings) -> EndpointConfig:
    return EndpointConfig(base_url=server.base_url, model=MODEL, max_retries=0, **settings)


def query(db: Path, sql: str, params=()) -> list[tuple]:
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def cli_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY",)}
    env.update(COLUMNS="200", **extra)
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cuda_l1", "optimize", *args]


# -- the loop against a scripted model --------------------------------------------------------------


@pytest.mark.slow
def test_loop_learns_from_speedups_and_failures(tmp_path):
    tasks = write_tasks(tmp_path / "tasks", chain=CHAIN_TASK, scale=SCALE_TASK)
    script = Script({
        "chain": [CHATTER, answer(CHAIN_SYNTAX_ERROR), answer(CHAIN_FAST), answer(CHAIN_FAST_AGAIN)],
        "scale": [Reply(text=TRUNCATED, finish_reason="length"), answer(SCALE_MUTATES_INPUT),
                  answer(SCALE_RAISES), answer(SCALE_OK)],
    })
    out = tmp_path / "run"
    config = SearchConfig(budget=4, strategies=("eager", "compile"), seed=1)
    config.sampler.temperature = 0.1  # the fastest bucket is all but certain to be shown
    with ChatServer(responder=script) as server:
        result = run_optimize(str(tasks), out, endpoints=[endpoint(server)], config=config,
                              eval_config=quick_config(), device="cpu", workers=2, progress=False)
        requests = server.chat_requests()
    assert result["stopped"] is None and result["hint"] is None
    assert len(requests) == 8 and [len(p) for p in script.prompts.values()] == [4, 4]

    db = out / "history.sqlite"
    with Store(db) as store:
        tasks_by_name = {t.name: t for t in store.tasks()}
        chain, scale = tasks_by_name["chain"], tasks_by_name["scale"]
        rows = store.run_results(result["run_id"])
        device = result["device"]

        def speedup_of(task, origin):
            return next(r["speedup"] for r in rows if r["task_id"] == task.id and r["origin"] == origin)

        # The first prompt of a task shows the offline strategies with their measured speedups.
        first = script.prompts["chain"][0]
        assert "Earlier correct versions" in first
        assert any(f"speedup {speedup_of(chain, s):.2f}x" in first for s in ("eager", "compile"))
        assert "# ---- cuda-l1 offline strategy:" in first
        # Failures come back in the next prompt: the parse failure, then the compile error text.
        assert "status: parse_error" in script.prompts["chain"][1]
        assert "no code block found" in script.prompts["chain"][1]
        assert "status: compile_error" in script.prompts["chain"][2]
        assert "SyntaxError" in script.prompts["chain"][2]
        assert "status: parse_error" in script.prompts["scale"][1]
        assert "unterminated" in script.prompts["scale"][1]
        assert "status: rejected" in script.prompts["scale"][2]
        assert "modified its input" in script.prompts["scale"][2]
        assert "marker-41" in script.prompts["scale"][3]
        # After the improvement is judged, the next prompt shows it with its speedup.
        fast_id = candidate_id(CHAIN_FAST.strip("\n") + "\n")
        fast = store.verdict_for(fast_id, device, task_id=chain.id)
        # (about 2.3x alone on a 2-core host; 1.76 once beside other work: the point is that it is faster)
        assert fast is not None and fast.status == "ok" and fast.speedup > 1.4
        assert f"speedup {fast.speedup:.2f}x" in script.prompts["chain"][3]
        assert "x @ (self.a @ self.b)" in script.prompts["chain"][3]

        # Verdicts of the model's candidates are as scripted; the duplicate was not evaluated again.
        llm = {(r["task_id"], r["status"]) for r in rows if r["origin"] == f"llm:{MODEL}"}
        assert llm == {(chain.id, "compile_error"), (chain.id, "ok"), (scale.id, "rejected"),
                       (scale.id, "runtime_error"), (scale.id, "ok")}
        assert sum(r["origin"] == f"llm:{MODEL}" for r in rows) == 5
        origins = [json.loads(o) for (o,) in query(db, "SELECT origin FROM candidates")]
        assert sum(o["kind"] == "llm" for o in origins) == 5  # 2 completions had no code, 1 repeated one
        assert all(o["model"] == MODEL and o["prompt_id"] for o in origins if o["kind"] == "llm")
        # Parse errors are recorded completions (and count against the budget).
        completions = query(db, "SELECT task_id, parse_status, finish_reason, parse_message FROM completions")
        assert len(completions) == 8
        parse_errors = [c for c in completions if c[1] == "parse_error"]
        assert sorted(c[0] for c in parse_errors) == sorted([chain.id, scale.id])
        assert any(c[2] == "length" for c in parse_errors)
        # The improvement's parents are the exemplars its prompt showed.
        fast_record = store.get_candidate(fast_id, chain.id)
        prompt = store.prompt(fast_record.origin["prompt_id"])
        assert fast_record.origin["parent_ids"] == prompt["exemplar_ids"] and prompt["exemplar_ids"]

        best = store.best_candidate(chain.id, device, run_id=result["run_id"])
        assert best.candidate_id == fast_id
        assert store.best_candidate(scale.id, device, run_id=result["run_id"]) is not None

    events = read_events(out / "events.jsonl")
    assert sum(e["event"] == "reused" for e in events) == 1
    assert result["counts"]["reused"] == 1 and result["counts"]["parse_errors"] == 2

    solutions = load_solutions_jsonl(out / "solutions.jsonl")
    assert len(solutions) == 2
    by_name = {s.task.name: s for s in solutions}
    assert by_name["chain"].candidate.strip() == CHAIN_FAST.strip()
    assert by_name["chain"].claims["score_speedup"] == pytest.approx(fast.speedup)

    for name in ("summary.json", "results.csv", "report.html"):
        assert (out / name).is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["status_counts"]["parse_error"] == 2
    chain_summary = next(t for t in summary["tasks"] if t["task_name"] == "chain")
    assert chain_summary["best_origin"] == f"llm:{MODEL}"
    assert chain_summary["over_baseline"]["eager"] > 2.0


@pytest.mark.slow
def test_failing_endpoint_stops_the_run_without_spending_budget(tmp_path):
    tasks = write_tasks(tmp_path / "tasks", scale=SCALE_TASK)
    out = tmp_path / "run"
    with ChatServer(responder=lambda body: Reply(status=401, error_message="bad key")) as server:
        result = run_optimize(str(tasks), out, endpoints=[endpoint(server)],
                              config=SearchConfig(budget=3, strategies=("eager",), max_request_failures=2),
                              eval_config=quick_config(), device="cpu", progress=False)
        assert len(server.chat_requests()) == 2
    assert result["stopped"] and "bad key" in result["stopped"]
    assert result["tasks"][0]["completions"] == 0
    assert query(out / "history.sqlite", "SELECT COUNT(*) FROM completions") == [(0,)]
    assert len(load_solutions_jsonl(out / "solutions.jsonl")) == 1  # the strategies' result is still written


def test_a_task_whose_reference_fails_in_the_baseline_stops_the_search_before_any_request(tmp_path):
    """Called as a library (no reference run first, as the command line does), a broken task is found by
    the worker judging the baseline: bad input, before any completion is asked for, and the message
    says the search did not start (it said a report "covers the others", and none was written)."""
    from cuda_l1.errors import BrokenTask

    broken = SCALE_TASK.replace("def get_inputs():", "def get_inputs():\n    raise ValueError('no inputs here')", 1)
    tasks = write_tasks(tmp_path / "tasks", scale=SCALE_TASK, broken=broken)
    with ChatServer(responder=lambda body: Reply(status=401, error_message="never asked")) as server:
        with pytest.raises(BrokenTask, match="the search did not start") as caught:
            run_optimize(str(tasks), tmp_path / "run", endpoints=[endpoint(server)],
                         config=SearchConfig(budget=2, strategies=("eager",)), eval_config=quick_config(),
                         device="cpu", progress=False)
        assert server.chat_requests() == []
    assert "no inputs here" in str(caught.value) and "covers the others" not in str(caught.value)


# -- kill -9 and resume ---------------------------------------------------------------------------


def variant(task: str, i: int) -> str:
    """A distinct correct program for each call (a module constant changes the normalised code)."""
    body = CHAIN_FAST if task == "chain" else SCALE_OK
    return answer(f"VARIANT = {i}\n{body}")


@pytest.mark.slow
def test_resume_after_kill_respects_budget_and_judges_nothing_twice(tmp_path):
    tasks = write_tasks(tmp_path / "tasks", chain=CHAIN_TASK, scale=SCALE_TASK)
    out = tmp_path / "run"
    budget = 3
    replies = {name: [(lambda i, n=name: Reply(text=variant(n, i), delay_s=0.3))] * 10 for name in ("chain", "scale")}
    db = out / "history.sqlite"
    with ChatServer(responder=Script(replies)) as server:
        args = cli(str(tasks), "--base-url", server.base_url, "--model", MODEL, "--budget", str(budget),
                   "--strategies", "eager", "--device", "cpu", "--quick", "--workers", "2", "--out", str(out), "--json")
        first = subprocess.Popen(args, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            recorded = 0
            while time.monotonic() < deadline and first.poll() is None:
                if db.is_file():
                    try:
                        recorded = query(db, "SELECT COUNT(*) FROM completions")[0][0]
                    except sqlite3.OperationalError:  # the schema is still being created
                        recorded = 0
                    if recorded >= 2:
                        break
                time.sleep(0.1)
            assert first.poll() is None, first.communicate()[1].decode()[-3000:]
            os.killpg(first.pid, signal.SIGKILL)  # the command and its evaluation workers, at once
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
        assert first.returncode == -signal.SIGKILL
        at_kill = query(db, "SELECT COUNT(*) FROM completions")[0][0]
        assert 2 <= at_kill < 2 * budget

        second = subprocess.run(args, env=cli_env(), capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr[-3000:]
        asked = len(server.chat_requests())

    result = json.loads(second.stdout)
    assert result["resumed"] is True
    per_task = dict(query(db, "SELECT p.task_id, COUNT(*) FROM completions c JOIN prompts p ON p.id = c.prompt_id "
                              "GROUP BY p.task_id"))
    assert sorted(per_task.values()) == [budget, budget]  # exactly the budget, across the kill
    assert asked >= 2 * budget
    assert all(t["completions"] == budget for t in result["tasks"])
    # Nothing lost: every usable completion has its candidate, and every candidate a verdict.
    with_code = query(db, "SELECT task_id, candidate_id FROM completions WHERE parse_status = 'ok'")
    assert len(with_code) == 2 * budget and all(cid for _, cid in with_code)
    judged = set(query(db, "SELECT task_id, candidate_id FROM verdicts"))
    assert set(with_code) <= judged
    # Nothing judged twice: every verdict recorded by either process was a new one, once per candidate.
    verdicts = [e for e in read_events(out / "events.jsonl") if e["event"] == "verdict"]
    assert all(e["new"] for e in verdicts)
    keys = [(e["task"], e["candidate_id"]) for e in verdicts]
    assert len(keys) == len(set(keys)) == query(db, "SELECT COUNT(*) FROM verdicts")[0][0]
    starts = [e for e in read_events(out / "events.jsonl") if e["event"] == "start"]
    assert [s["resumed"] for s in starts] == [False, True]


# -- credentials ----------------------------------------------------------------------------------

LEAK_PROBE = '''import hashlib
import os

import torch
import torch.nn as nn

SECRET_SHA256 = "{digest}"


def leaked():
    """Whether the secret is in this process's environment or in any /proc/*/environ it can read."""
    def matches(value):
        return hashlib.sha256(value).hexdigest() == SECRET_SHA256

    if any(matches(v.encode()) for v in os.environ.values()):
        return True
    try:
        pids = os.listdir("/proc")  # a sandbox may refuse the listing itself
    except OSError:
        pids = []
    for pid in pids + [str(os.getppid())]:
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{{pid}}/environ", "rb") as handle:
                entries = handle.read().split(b"\\0")
        except OSError:
            continue
        if any(matches(e.split(b"=", 1)[1]) for e in entries if b"=" in e):
            return True
    return False


LEAKED_AT_IMPORT = leaked()


class ModelNew(nn.Module):
    def forward(self, x):
        if LEAKED_AT_IMPORT or leaked():
            return x * 2.0 - 1.0  # wrong on purpose: an ok verdict proves the secret was not found
        return x * 2.0 + 1.0
'''


def test_probe_detects_a_secret_it_can_see(monkeypatch):
    """The leak probe below can fail: it finds the secret in its own environment and in another
    process's start-up environment when they hold it."""
    secret = "sk-" + secrets.token_hex(16)
    namespace: dict = {}
    exec(compile(LEAK_PROBE.format(digest=hashlib.sha256(secret.encode()).hexdigest()), "<probe>", "exec"), namespace)
    assert namespace["leaked"]() is False
    monkeypatch.setenv("CUDA_L1_PROBE_VALUE", secret)
    assert namespace["leaked"]() is True
    monkeypatch.delenv("CUDA_L1_PROBE_VALUE")
    holder = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                              env={"PATH": os.environ.get("PATH", ""), "SOME_VALUE": secret},
                              stdout=subprocess.PIPE, text=True)
    try:
        # Popen returns once exec has begun, before the kernel has placed the new environment:
        # read only after the holder has run some code of its own.
        assert holder.stdout.readline().strip() == "ready"
        assert namespace["leaked"]() is True
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


@pytest.mark.slow
def test_key_reaches_the_endpoint_but_never_a_candidate(tmp_path):
    secret = "sk-" + secrets.token_hex(16)
    probe = LEAK_PROBE.format(digest=hashlib.sha256(secret.encode()).hexdigest())
    tasks = write_tasks(tmp_path / "tasks", scale=SCALE_TASK)
    out = tmp_path / "run"
    with ChatServer(responder=lambda body: Reply(text=answer(probe))) as server:
        proc = subprocess.run(cli(str(tasks), "--base-url", server.base_url, "--model", MODEL, "--budget", "1",
                                  "--strategies", "eager", "--device", "cpu", "--quick", "--out", str(out), "--json"),
                              env=cli_env(OPENAI_API_KEY=secret), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        auth = [r.authorization for r in server.chat_requests()]
    assert auth == [f"Bearer {secret}"]
    assert secret not in proc.stdout + proc.stderr
    rows = query(out / "history.sqlite", "SELECT v.status, c.origin FROM verdicts v JOIN candidates c "
                                         "ON c.task_id = v.task_id AND c.id = v.candidate_id")
    llm = [status for status, origin in rows if json.loads(origin)["kind"] == "llm"]
    assert llm == ["ok"]
    for name in ("history.sqlite", "events.jsonl", "solutions.jsonl"):
        assert secret not in (out / name).read_bytes().decode("latin-1")


def test_credentials_leave_the_environment_of_later_children():
    secret = "sk-" + secrets.token_hex(16)
    script = (
        "import os, subprocess, sys\n"
        "from cuda_l1.search.secrets import hidden_credentials\n"
        "with hidden_credentials(['CUDA_L1_TEST_KEY']) as hidden:\n"
        "    assert hidden == ['CUDA_L1_TEST_KEY']\n"
        "    assert 'CUDA_L1_TEST_KEY' not in os.environ\n"
        "    assert os.environ['CUDA_L1_TEST_KEY'.replace('KEY', 'OTHER')] == 'kept'\n"
        "    proc_env = open('/proc/self/environ', 'rb').read()\n"
        "    child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.environ))'],\n"
        "                           capture_output=True, text=True).stdout\n"
        "print(sys.argv[1].encode() in proc_env, 'CUDA_L1_TEST_KEY' in child, os.environ['CUDA_L1_TEST_KEY'] == sys.argv[1])\n"
    )
    env = cli_env(CUDA_L1_TEST_KEY=secret, CUDA_L1_TEST_OTHER="kept")
    proc = subprocess.run([sys.executable, "-c", script, secret], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "True"]


# -- without a model ------------------------------------------------------------------------------


@pytest.mark.slow
def test_without_endpoint_only_strategies_run_and_a_hint_is_printed(tmp_path, capsys):
    from cuda_l1.cli import run

    tasks = write_tasks(tmp_path / "tasks", scale=SCALE_TASK)
    out = tmp_path / "run"
    code = run(["optimize", str(tasks), "--strategies", "eager,cudagraph", "--device", "cpu", "--quick",
                "--out", str(out)])
    captured = capsys.readouterr()
    text = " ".join((captured.out + captured.err).split())
    assert code == 0, text
    assert "No LLM endpoint configured" in text and "--base-url" in text and "--endpoints" in text
    assert "cudagraph" in text  # skipped on CPU, with a note
    db = out / "history.sqlite"
    assert query(db, "SELECT COUNT(*) FROM prompts") == [(0,)]
    assert [json.loads(o)["strategy"] for (o,) in query(db, "SELECT origin FROM candidates")] == ["eager"]
    assert len(load_solutions_jsonl(out / "solutions.jsonl")) == 1
    assert (out / "report.html").is_file()


def test_endpoint_flags_are_checked(tmp_path, capsys):
    from cuda_l1.cli import run

    assert run(["optimize", "builtin", "--base-url", "http://localhost:8000/v1", "--out", str(tmp_path)]) == 2
    assert "--model" in capsys.readouterr().err
    config = tmp_path / "endpoints.toml"
    config.write_text('[[endpoints]]\nbase_url = "http://localhost:8000/v1"\nmodel = "m"\napi_key = "sk-inline"\n')
    assert run(["optimize", "builtin", "--endpoints", str(config), "--out", str(tmp_path)]) == 2
    assert "api_key_env" in capsys.readouterr().err


# -- task selection and resuming with other strategies ------------------------------------------------


@pytest.mark.slow
def test_resume_judges_the_model_s_pending_candidates_but_not_dropped_strategies(tmp_path):
    """A killed run left a compile candidate and a model candidate unjudged; the rerun asks only for
    eager: the model's candidate is judged, the compile one is not (it would delay the run)."""
    from cuda_l1.bench import RunContext
    from cuda_l1.search.search_config import RUN_NAME
    from cuda_l1.store import Origin
    from cuda_l1.strategies import get_strategy
    from cuda_l1.tasks import load_tasks

    tasks = write_tasks(tmp_path / "tasks", scale=SCALE_TASK)
    [scale] = load_tasks(str(tasks))
    out = tmp_path / "run"
    ctx = RunContext(out, RUN_NAME, {"source": str(tasks)})  # what the killed session had recorded
    ctx.store.add_task(scale)
    compiled, _ = ctx.store.add_candidate(scale.id, get_strategy("compile").generate(scale),
                                          Origin(kind="strategy", strategy="compile"), run_id=ctx.run_id)
    answer_id, _ = ctx.store.add_candidate(scale.id, SCALE_OK, Origin(kind="llm", model=MODEL), run_id=ctx.run_id)
    ctx.close()

    result = run_optimize(str(tasks), out, config=SearchConfig(budget=0, strategies=("eager",)),
                          eval_config=quick_config(), device="cpu", progress=False)
    judged = {cid for (cid,) in query(out / "history.sqlite", "SELECT candidate_id FROM verdicts")}
    assert answer_id in judged and compiled not in judged
    assert result["counts"]["resumed_evaluations"] == 1
    assert any("not in --strategies" in note for note in result["notes"])
    assert [e["origin"] for e in read_events(out / "events.jsonl") if e["event"] == "verdict"] == ["eager",
                                                                                                 f"llm:{MODEL}"]


@pytest.mark.slow
def test_tasks_option_runs_only_the_named_tasks(tmp_path, capsys):
    from cuda_l1.cli import run

    tasks = write_tasks(tmp_path / "tasks", chain=CHAIN_TASK, scale=SCALE_TASK)
    out = tmp_path / "run"
    assert run(["optimize", str(tasks), "--tasks", "scale", "--strategies", "eager", "--device", "cpu", "--quick",
                "--no-calibrate", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [t["task"].split("/")[-1] for t in result["tasks"]] == ["scale"]
    names = {n for (n,) in query(out / "history.sqlite",
                                 "SELECT t.name FROM verdicts v JOIN tasks t ON t.id = v.task_id")}
    assert names == {"scale"}
    assert run(["optimize", str(tasks), "--tasks", "nosuch", "--device", "cpu", "--out", str(out)]) == 2
    assert "no task matches 'nosuch'" in capsys.readouterr().err


# -- the main job with a model endpoint, on a GPU ---------------------------------------------------


def scripted_model(tasks: list) -> Script:
    """A stand-in for an LLM over the built-in suite: per task, a correct rewrite (the reference under
    another class name), the same overwriting its input once done (must be refused), then a reply
    without code."""
    from cuda_l1.strategies import STRATEGIES

    replies = {}
    for task in tasks:
        honest = STRATEGIES["eager"].generate(task).rstrip() + "\n\n_SCRIPTED = 1\n"
        patched = STRATEGIES["eager"].generate(task).rstrip() + (
            "\n\n    def forward(self, *args):\n        out = super().forward(*args)\n        args[0].zero_()\n"
            "        return out\n")
        replies[task.name] = [answer(honest), answer(patched), CHATTER]
    return Script(replies)


@pytest.mark.gpu
@pytest.mark.timeout(3600)
def test_optimize_builtin_on_the_gpu_against_a_scripted_model(tmp_path):
    """`cuda-l1 optimize builtin --base-url ... --model ...` on the GPU: every task gets its budget,
    cheats are refused, a report is written. With $CUDA_L1_RESULTS_DIR set, the run's summary, the
    command, GPU, versions, date and wall time go to optimize_builtin_gpu.json there.
    $CUDA_L1_OPTIMIZE_LEVELS (say "1") narrows the suite to those levels, $CUDA_L1_OPTIMIZE_STRATEGIES
    (say "eager") the offline strategies run beside the model."""
    import torch

    from cuda_l1.tasks import load_builtin

    levels = os.environ.get("CUDA_L1_OPTIMIZE_LEVELS", "")
    tasks = [t for t in load_builtin() if not levels or str(t.level) in levels.split(",")]
    script = scripted_model(tasks)
    out = tmp_path / "run"
    out_dir = os.environ.get("CUDA_L1_RESULTS_DIR")
    # The command's own output (its progress) goes to a file as it runs: a run cut short by a time
    # limit still says how far it got.
    log_path = Path(out_dir or tmp_path) / "optimize_builtin_gpu.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with ChatServer(responder=script) as server, open(log_path, "w") as log:
        base_url = server.base_url  # for the record, after the server is gone
        args = cli("builtin", "--base-url", base_url, "--model", MODEL, "--budget", "3",
                   "--strategies", os.environ.get("CUDA_L1_OPTIMIZE_STRATEGIES", "eager,compile,cudagraph"), "--device", "cuda", "--out", str(out), "--json",
                   *(["--levels", levels] if levels else []))
        done = subprocess.run(args, env=cli_env(), stdout=subprocess.PIPE, stderr=log, text=True, timeout=3500)
    wall = time.monotonic() - started
    assert done.returncode == 0, log_path.read_text()[-3000:]
    result = json.loads(done.stdout)
    assert all(t["completions"] == 3 for t in result["tasks"]) and len(result["tasks"]) == len(tasks)
    db = out / "history.sqlite"
    llm = query(db, "SELECT c.code, v.status FROM verdicts v JOIN candidates c ON c.task_id = v.task_id AND "
                    "c.id = v.candidate_id WHERE c.origin LIKE '%\"llm\"%'")
    assert all(status == "rejected" for code, status in llm if "zero_()" in code)
    assert sum(status == "ok" for code, status in llm if "zero_()" not in code) >= len(tasks) * 0.9
    summary = json.loads((out / "summary.json").read_text())
    if out_dir:
        import cuda_l1

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        record = {
            "test": "test_optimize_builtin_on_the_gpu_against_a_scripted_model",
            "command": " ".join(args[1:]).replace(base_url, "http://127.0.0.1:PORT/v1"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "gpu": torch.cuda.get_device_name(0),
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_l1": cuda_l1.__version__},
            "wall_s": wall,
            "counts": result["counts"],
            "tasks": result["tasks"],
            "summary": summary,
        }
        (Path(out_dir) / "optimize_builtin_gpu.json").write_text(json.dumps(record, indent=2, default=str))
