"""Evaluation workers live no longer than the process that owns their pool, and hold few references.

A pool's owner (`cuda-l1 optimize`, a training stage) killed with SIGKILL runs no cleanup: nobody
tells its workers to stop. These tests kill a real owner that way, mid-evaluation, and then look at
every process of the owner's session and every descendant it had: none may survive. They read /proc,
so they run on Linux only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cuda_l1.errors import RunError
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.jobs import EvalJob
from cuda_l1.evaluate.local_pool import LocalPool
from cuda_l1.evaluate.verdict import OK
from cuda_l1.tasks import make_task

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")

# A task whose every forward call sleeps: its evaluation lasts long enough to kill the owner mid-way.
SLOW_TASK = '''
import time

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        time.sleep(0.3)
        return x * 2.0


def get_inputs():
    return [torch.randn(16)]


def get_init_inputs():
    return []
'''

# A process that owns a local pool of two CPU workers, gives one of them the slow task, prints the
# workers' pids and waits to be killed.
POOL_OWNER = textwrap.dedent('''
    import sys, time
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.jobs import EvalJob
    from cuda_l1.evaluate.pool import make_pool
    from cuda_l1.tasks import make_task

    task = make_task(open(sys.argv[1]).read(), name="slow", level=1, origin="test:slow")
    pool = make_pool(sys.argv[2], "cpu", EvalConfig(device="cpu", timing=TimingConfig.quick()), workers=2)
    pool.submit(EvalJob(task, open(sys.argv[1]).read().replace("class Model", "class ModelNew")))
    deadline = time.monotonic() + 120
    while len(pool.worker_pids()) < 2 and time.monotonic() < deadline:  # Ray actors report once they are up
        time.sleep(0.2)
    print(" ".join(map(str, pool.worker_pids())), flush=True)
    time.sleep(600)
''')


# -- reading /proc -------------------------------------------------------------------------------------
def _stat(pid: int) -> dict | None:
    """state, ppid, session and start time of a process (None when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return {"state": fields[0], "ppid": int(fields[1]), "session": int(fields[3]), "start": int(fields[19])}


def _processes() -> dict[int, dict]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := _stat(int(entry))) is not None:
            found[int(entry)] = info
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def family(root: int) -> dict[int, int]:
    """pid -> start time of `root`'s descendants and of every process in its session (root excluded)."""
    table = _processes()
    members = {pid for pid, info in table.items() if info["session"] == root}
    frontier = [root, *members]
    while frontier:  # sandboxed children start sessions of their own: follow parent links too
        parent = frontier.pop()
        for pid, info in table.items():
            if info["ppid"] == parent and pid not in members:
                members.add(pid)
                frontier.append(pid)
    members.discard(root)
    return {pid: table[pid]["start"] for pid in members if pid in table}


def survivors(known: dict[int, int], root: int) -> list[str]:
    """Live processes among `known` (same pid, same start time: not a reused pid) or in `root`'s session."""
    alive = []
    for pid, info in _processes().items():
        if info["state"] in ("Z", "X"):
            continue
        if known.get(pid) == info["start"] or info["session"] == root:
            alive.append(f"{pid}: {_cmdline(pid)[:160]}")
    return alive


def wait_until(predicate, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def is_sandbox_child(pid: int) -> bool:
    """A side: a fresh interpreter running the harness, or a side forked by a fork server."""
    try:
        forked = Path(f"/proc/{pid}/comm").read_text().strip() == "cuda-l1-side"
    except OSError:
        forked = False
    return forked or "cuda_l1.evaluate.child" in _cmdline(pid)


def is_fork_server(pid: int) -> bool:
    return "cuda_l1.evaluate.fork_server" in _cmdline(pid) and not is_sandbox_child(pid)


def is_worker(pid: int) -> bool:
    """A local pool's worker (a multiprocessing child) or a Ray actor of the evaluation pool."""
    command = _cmdline(pid)
    return "multiprocessing.spawn" in command or "EvalWorker" in command


def worker_evaluating(root: int) -> bool:
    """Whether an evaluation worker under `root` has a sandboxed candidate child right now."""
    table = _processes()

    def workers_side(parent: int) -> bool:  # the worker's own child, or its fork server's (either stage)
        while parent is not None and is_fork_server(parent):
            parent = table.get(parent, {}).get("ppid")
        return parent is not None and is_worker(parent)

    return any(is_sandbox_child(pid) and workers_side(table[pid]["ppid"]) for pid in family(root) if pid in table)


def kill_and_check(owner: subprocess.Popen, evaluating_within: float = 180.0, rest_within: float = 20.0) -> None:
    """Wait until a worker under `owner` evaluates a candidate, SIGKILL the owner alone, and require its
    workers and their sandboxed children to be gone within 20 s, and every other process it had
    started (and its whole session) within `rest_within` s."""
    try:
        started = wait_until(lambda: worker_evaluating(owner.pid), evaluating_within)
        assert started, f"no worker was evaluating a candidate within {evaluating_within:.0f} s " \
                        f"(owner exit code {owner.poll()})"
        time.sleep(0.5)  # let the worker get into the candidate's checks
        known = family(owner.pid)
        os.kill(owner.pid, signal.SIGKILL)  # the owner only: its workers get no signal, no message
        owner.wait(timeout=30)
        def evaluating() -> list[str]:
            return [line for line in survivors(known, owner.pid) if "multiprocessing.spawn" in line
                    or "EvalWorker" in line or "cuda_l1.evaluate.child" in line
                    or "cuda_l1.evaluate.fork_server" in line]

        left = wait_until(lambda: not evaluating(), timeout=20.0) or evaluating()
        assert left is True, "evaluation processes outlived the killed owner:\n" + "\n".join(left)
        left = wait_until(lambda: not survivors(known, owner.pid), timeout=rest_within) or survivors(known, owner.pid)
        assert left is True, "processes outlived the killed owner:\n" + "\n".join(left)
    finally:
        for pid in family(owner.pid):  # never leave strays behind for the rest of the suite
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# -- the tests -------------------------------------------------------------------------------------------
try:
    import ray  # noqa: F401
    BACKENDS = ["local", "ray"]
except ImportError:  # CI installs the `ray` extra
    BACKENDS = ["local"]


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.slow] if b == "ray" else []) for b in BACKENDS])
def test_workers_die_when_the_pool_owner_is_killed(tmp_path, backend):
    """A local pool's workers go within seconds. A private Ray instance's actors too; Ray's own agents
    (dashboard and runtime-env agents) notice their raylet is gone on their own schedule, within a
    minute or two."""
    task_file = tmp_path / "slow.py"
    task_file.write_text(SLOW_TASK)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a private Ray instance, owned by it
    owner = subprocess.Popen([sys.executable, "-c", POOL_OWNER, str(task_file), backend], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, start_new_session=True, env=env)
    pids = [int(p) for p in owner.stdout.readline().split()]
    assert len(pids) == 2, "the pool owner did not report its workers"
    kill_and_check(owner, rest_within=150.0 if backend == "ray" else 20.0)


@pytest.mark.slow
def test_optimize_killed_with_sigkill_leaves_no_worker(tmp_path):
    """`cuda-l1 optimize` killed by pid (not by process group) while a strategy is being evaluated."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    # Slower than SLOW_TASK: its quick evaluation (and the noise check before it) must outlast the wait
    # for a worker to be seen evaluating on a loaded host, or the interrupt lands after the run is done.
    (tasks / "slow.py").write_text(SLOW_TASK.replace("time.sleep(0.3)", "time.sleep(1.5)"))
    args = [sys.executable, "-m", "cuda_l1", "optimize", str(tasks), "--strategies", "eager", "--device", "cpu",
            "--quick", "--workers", "2", "--out", str(tmp_path / "run"), "--json"]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    owner = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    kill_and_check(owner)


def test_interrupted_run_stops_at_once_without_a_traceback(tmp_path):
    """Ctrl-C (SIGINT to the whole foreground process group) during an evaluation: the command says
    `interrupted` and exits 130 within seconds, prints no worker's traceback, and leaves no worker or
    sandboxed child behind (they are stopped, not waited for to finish their candidate)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    # Slower than SLOW_TASK: its quick evaluation (and the noise check before it) must outlast the wait
    # for a worker to be seen evaluating on a loaded host, or the interrupt lands after the run is done.
    (tasks / "slow.py").write_text(SLOW_TASK.replace("time.sleep(0.3)", "time.sleep(1.5)"))
    args = [sys.executable, "-m", "cuda_l1", "optimize", str(tasks), "--strategies", "eager", "--device", "cpu",
            "--quick", "--out", str(tmp_path / "run")]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    # As from a terminal: a test run started in the background by a non-interactive shell ignores
    # SIGINT, and a Python started with it ignored keeps ignoring it (nohup and `&` mean no Ctrl-C).
    owner = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert wait_until(lambda: worker_evaluating(owner.pid), 180.0), "no worker evaluated a candidate"
        time.sleep(0.5)
        known = family(owner.pid)
        started = time.monotonic()
        os.killpg(owner.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, err = owner.communicate(timeout=60)
        took = time.monotonic() - started
        assert owner.returncode == 130, err[-2000:]
        assert "interrupted" in err and "Traceback" not in err, err[-4000:]
        assert took < 15, f"the interrupted command took {took:.1f} s to exit"
        left = wait_until(lambda: not survivors(known, owner.pid), timeout=20.0) or survivors(known, owner.pid)
        assert left is True, "processes outlived the interrupted command:\n" + "\n".join(left)
    finally:
        for pid in family(owner.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if owner.poll() is None:
            owner.kill()


# -- bounded memory: a worker keeps few prepared references ------------------------------------------------
# Each task's reference runs in a sandboxed side of its own, kept by the task's evaluator (with the
# reference module and its inputs) between candidates: a worker holding one evaluator per task holds one
# such process per task it ever judged.
SMALL_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x + {k}


def get_inputs():
    return [torch.randn(8)]


def get_init_inputs():
    return []
'''


def reference_sides(worker: int) -> list[int]:
    """The sandboxed processes a worker keeps between candidates (its tasks' reference sides), its
    own children or its fork server's (either stage: the second is the first's child)."""
    table = _processes()
    parents = {worker}
    while True:
        more = {pid for pid, info in table.items() if info["ppid"] in parents and is_fork_server(pid)} - parents
        if not more:
            break
        parents |= more
    return [pid for pid, info in table.items() if info["ppid"] in parents and is_sandbox_child(pid)
            and info["state"] not in ("Z", "X")]


def test_a_worker_keeps_at_most_two_prepared_references():
    """A worker that judged tasks a, b, c holds two references, and prepares a again when it comes back.
    (Each keeps its reference's side as on a GPU: on a CPU a new one serves each candidate by default.)"""
    tasks = {name: make_task(SMALL_TASK.format(k=k), name=name, level=1, origin=f"test:{name}")
             for k, name in enumerate("abc")}
    timing = TimingConfig.quick()
    timing.enabled = False
    config = EvalConfig(device="cpu", timing=timing, correctness_trials=2, prewarm=False, fresh_reference=False)
    held = []
    with LocalPool("cpu", config, workers=1) as pool:
        [worker] = pool.worker_pids()
        for name in ("a", "b", "c", "c", "a"):
            source = tasks[name].source.replace("class Model", "class ModelNew")
            verdict = pool.submit(EvalJob(tasks[name], source)).result(timeout=300).verdict
            assert verdict.status == OK, (verdict.reasons, [(c.name, c.detail) for c in verdict.checks if c.passed is False])
            wait_until(lambda: len(reference_sides(worker)) <= 2, 5.0)  # a closed side may take a moment to go
            held.append(len(reference_sides(worker)))
    # One evaluator per task ever judged would hold 1, 2, 3, 3, 3 reference processes.
    assert held == [1, 2, 2, 2, 2], held


def test_a_dispatcher_that_fails_answers_every_job_instead_of_leaving_it_waiting():
    """The dispatcher thread replaces a dead worker; a replacement that cannot start raised there and
    ended the thread, and every caller waited for ever. Now the start is tried again for about 15 s,
    and then each job still waiting, and each one submitted later, fails with a RunError saying why."""
    task = make_task(SLOW_TASK, name="slow", level=1, origin="test:slow")
    source = task.source.replace("class Model", "class ModelNew")
    timing = TimingConfig.quick()
    timing.enabled = False
    config = EvalConfig(device="cpu", timing=timing, prewarm=False)
    with LocalPool("cpu", config, workers=1) as pool:
        def refuse(index):
            raise OSError("no process can be started")

        pool._start = refuse
        waiting = pool.submit(EvalJob(task, source))
        [worker] = pool.worker_pids()
        os.kill(worker, signal.SIGKILL)
        # No verdict was reached: an error the run stops on (exit 1), not a runtime_error a trainer would
        # score as the candidate's failure.
        with pytest.raises(RunError, match="dispatcher failed"):
            waiting.result(timeout=60)
        with pytest.raises(RunError, match=r"dispatcher failed \(OSError: no process can be started\)"):
            pool.submit(EvalJob(task, source)).result(timeout=10)  # told why, at once


def test_a_job_its_caller_cancelled_leaves_the_others_alone():
    """Pool futures can be cancelled (concurrent.futures.wait with a timeout, then cancel()). Answering
    a cancelled one raised in the dispatcher, which then failed every other job and closed the pool."""
    task = make_task(SLOW_TASK.replace("time.sleep(0.3)", "pass"), name="double", level=1, origin="test:double")
    source = task.source.replace("class Model", "class ModelNew")
    timing = TimingConfig.quick()
    timing.enabled = False
    config = EvalConfig(device="cpu", timing=timing, prewarm=False)
    with LocalPool("cpu", config, workers=1) as pool:
        judged = pool.submit(EvalJob(task, source))
        wait_until(lambda: judged.running() or bool(pool._inflight[0]), 10.0)  # sent to the worker: answered later
        assert judged.cancel()
        waiting = pool.submit(EvalJob(task, source + "\n# another\n"))
        assert waiting.cancel()  # never sent: dropped
        for k in range(2):
            verdict = pool.submit(EvalJob(task, source + f"\n# {k}\n")).result(timeout=300).verdict
            assert verdict.status == OK, verdict.reasons
