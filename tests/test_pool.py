"""Both evaluation pools (local processes and Ray actors) pass the same suite on CPU: statuses of a mixed
batch, one reference per task per worker, dead workers replaced and their candidate retried once, and
closing with jobs pending. Workers are killed from outside by pid, as a crash or the OOM killer would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import wait
from pathlib import Path

import pytest

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.jobs import EvalJob
from cuda_l1.evaluate.pool import make_pool
from cuda_l1.evaluate.verdict import INCORRECT, OK, RUNTIME_ERROR
from cuda_l1.tasks import code_id, make_task

try:
    import ray
except ImportError:  # the Ray cases skip; CI installs the `ray` extra
    ray = None

BACKENDS = ["local", "ray"]
SECRET_NAME = "CUDA_L1_POOLTEST_API_KEY"
SECRET = "pooltest-secret-7d1f0c"
SLOW_S = 0.5  # per forward call of the slow candidate: long enough to kill its worker mid-job

# Two references. Their module-level code notes "<task> <pid>" in a file wherever the module is
# imported and may write: the trusted worker that prepares the task's inputs (the reference's own side
# and every candidate's side import it too, but are sandboxed and cannot write there), so a test can
# count preparations per worker.
SCALE_REF = '''
import os
import torch
import torch.nn as nn

NOTES = {notes!r}
try:
    with open(NOTES, "a") as fh:
        fh.write(f"scale {{os.getpid()}}\\n")
except OSError:
    pass


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * 2


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
'''

AFFINE_REF = '''
import os
import torch
import torch.nn as nn

NOTES = {notes!r}
try:
    with open(NOTES, "a") as fh:
        fh.write(f"affine {{os.getpid()}}\\n")
except OSError:
    pass


class Model(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.tanh(self.linear(x))


def get_inputs():
    return [torch.randn(3, 8)]


def get_init_inputs():
    return [8, 4]
'''

CANDIDATE = '''
import ctypes
import os
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *init):
        super().__init__()
        {init}

    def forward(self, x):
        out = {expr}
        {tail}
        return out
'''

SHAPES = {
    "scale": {"init": "pass", "expr": "torch.relu(x) * 2"},
    "affine": {"init": "self.linear = nn.Linear(*init)", "expr": "torch.tanh(self.linear(x))"},
}
TAILS = {
    "correct": ("pass", OK),
    "wrong_shape": ("out = out[:-1]", INCORRECT),
    "raises": ('raise RuntimeError("this candidate fails on purpose")', RUNTIME_ERROR),
    "segfault": ("ctypes.string_at(0)", RUNTIME_ERROR),
    # Correct unless the driver's credential reached the candidate's environment.
    "snoop": (f"out = out + 1 if any({SECRET!r} in v for v in os.environ.values()) else out", OK),
    "slow": (f"time.sleep({SLOW_S})", OK),
}


def candidate(shape: str, kind: str) -> str:
    return CANDIDATE.format(tail=TAILS[kind][0], **SHAPES[shape])


def make_tasks(notes: Path) -> dict:
    return {"scale": make_task(SCALE_REF.format(notes=str(notes)), name="scale", level=1, origin="test:scale"),
            "affine": make_task(AFFINE_REF.format(notes=str(notes)), name="affine", level=1, origin="test:affine")}


def quick_config() -> EvalConfig:
    timing = TimingConfig.quick()
    timing.enabled = False  # correctness only: no test here needs a speedup
    return EvalConfig(device="cpu", timing=timing, correctness_trials=3, call_timeout_s=30.0,
                      first_call_timeout_s=60.0)


# -- fixtures --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def driver_secret():
    """A credential in the driver's environment before any worker or Ray node starts."""
    os.environ[SECRET_NAME] = SECRET
    yield
    os.environ.pop(SECRET_NAME, None)


@pytest.fixture(scope="module")
def ray_cluster(driver_secret):
    """A small local Ray instance shared by the module's Ray cases (pools must leave it running)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 2**20)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    if request.param == "ray":
        if ray is None:
            pytest.skip("ray is not installed (pip install 'cuda-l1[ray]')")
        request.getfixturevalue("ray_cluster")
    return request.param


@pytest.fixture
def tasks(tmp_path) -> dict:
    return make_tasks(tmp_path / "prepared.txt")


def open_pool(backend: str, workers: int):
    pool = make_pool(backend, device="cpu", config=quick_config(), workers=workers)
    assert len(pool.workers) == workers
    return pool


# -- watching workers from outside ---------------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for task_dir in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task_dir / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _sleeping_candidates(pid: int) -> list[int]:
    """Sides under the worker `pid` (forked by its fork server, or fresh interpreters) that sleep in
    the slow candidate's forward right now: the worker holds that candidate's job."""
    found = []
    for side in _descendants(pid):
        try:
            named = Path(f"/proc/{side}/comm").read_text().strip() == "cuda-l1-side"
            fresh = b"cuda_l1.evaluate.child" in Path(f"/proc/{side}/cmdline").read_bytes()
            sleeping = Path(f"/proc/{side}/wchan").read_text().strip() == "hrtimer_nanosleep"
        except OSError:
            continue
        if (named or fresh) and sleeping:
            found.append(side)
    return found


def busy_worker(pool, exclude: set[int] = frozenset(), timeout: float = 90.0) -> int:
    """Pid of a worker that is judging the slow candidate right now (one of its sides sleeps in it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in pool.worker_pids():
            if pid not in exclude and _sleeping_candidates(pid):
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no worker started judging a candidate within {timeout:.0f} s")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


# -- the suite -------------------------------------------------------------------------------------------
def test_batch_statuses_and_every_job_answered_once(backend, tasks):
    jobs, expected = [], {}
    for shape, task in tasks.items():
        for kind in ("correct", "wrong_shape", "raises", "segfault", "snoop"):
            meta = {"shape": shape, "kind": kind, "index": len(jobs)}
            jobs.append(EvalJob(task, candidate(shape, kind), key=f"{shape}/{kind}", meta=meta))
            expected[f"{shape}/{kind}"] = (TAILS[kind][1], dict(meta))
    with open_pool(backend, workers=2) as pool:
        results = list(pool.run(jobs))
        workers = set(pool.workers)
        n_workers = len(pool.workers)
        pids = pool.worker_pids()
        # The credential did reach the trusted workers, so the snoop candidates did test the sandbox.
        assert any(SECRET.encode() in Path(f"/proc/{pid}/environ").read_bytes() for pid in pids)
    assert sorted(r.job.key for r in results) == sorted(expected)  # every job exactly once
    for result in results:
        status, meta = expected[result.job.key]
        assert result.verdict.status == status, (result.job.key, result.verdict.reasons)
        assert result.job.meta == meta
        assert result.verdict.task_id == result.job.task.id
        assert result.verdict.candidate_id == code_id(result.job.source)
        assert result.attempts == 1
        assert result.worker in workers
    wrong = next(r for r in results if r.job.key == "affine/wrong_shape")
    assert wrong.verdict.check("shape").passed is False
    if backend == "local":  # each worker's first verdict says how its own start went, and only that one
        starts = [r.verdict.timing["worker_start"] for r in results if "worker_start" in r.verdict.timing]
        assert 1 <= len(starts) <= n_workers
        for start in starts:
            assert start["process"] <= start["imported"] <= start["spares_started"] <= start["first_job"]
            assert start["probe_s"] >= 0


def test_reference_prepared_once_per_task_per_worker(backend, tmp_path, tasks):
    jobs = [EvalJob(task, candidate(shape, "correct"), key=f"{shape}/{i}")
            for i in range(3) for shape, task in tasks.items()]
    with open_pool(backend, workers=2) as pool:
        results = list(pool.run(jobs))
        pids = set(pool.worker_pids())
    assert [r.verdict.status for r in results] == [OK] * len(jobs)
    notes = [tuple(line.split()) for line in (tmp_path / "prepared.txt").read_text().splitlines()]
    prepared = [(name, int(pid)) for name, pid in notes]
    assert {pid for _, pid in prepared} <= pids  # only the trusted workers built a reference
    assert len(prepared) == len(set(prepared))  # never twice for one task on one worker
    assert {name for name, _ in prepared} == set(tasks)
    assert len(prepared) < len(jobs)


def test_killed_worker_is_replaced_and_its_candidate_retried(backend, tasks):
    task = tasks["scale"]
    job = EvalJob(task, candidate("scale", "slow"), meta={"case": "retried"})
    with open_pool(backend, workers=1) as pool:
        future = pool.submit(job)
        victim = busy_worker(pool)
        kill(victim)
        result = future.result(timeout=180)
        assert result.verdict.status == OK, result.verdict.reasons
        assert result.attempts == 2
        assert result.job.meta == {"case": "retried"}
        assert victim not in pool.worker_pids()
        # The replacement keeps serving.
        again = pool.submit(EvalJob(task, candidate("scale", "correct"))).result(timeout=120)
        assert again.verdict.status == OK and again.attempts == 1


def test_worker_dying_twice_gives_runtime_error(backend, tasks, capfd):
    task = tasks["scale"]
    with open_pool(backend, workers=1) as pool:
        future = pool.submit(EvalJob(task, candidate("scale", "slow")))
        first = busy_worker(pool)
        kill(first)
        second = busy_worker(pool, exclude={first})
        kill(second)
        result = future.result(timeout=180)
        assert result.verdict.status == RUNTIME_ERROR
        assert result.attempts == 2
        assert any("worker died 2 times" in reason for reason in result.verdict.reasons), result.verdict.reasons
        if backend == "local":  # how it ended, in words, in the verdict and on stderr
            assert any("killed by SIGKILL" in reason for reason in result.verdict.reasons), result.verdict.reasons
            assert "was killed by SIGKILL while it held" in capfd.readouterr().err
        after = pool.submit(EvalJob(task, candidate("scale", "correct"))).result(timeout=120)
        assert after.verdict.status == OK


def test_close_with_pending_jobs_answers_them(backend, tasks):
    task = tasks["scale"]
    pool = open_pool(backend, workers=1)
    futures = [pool.submit(EvalJob(task, candidate("scale", "slow"), key=f"pending-{i}")) for i in range(4)]
    busy_worker(pool)
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 30
    _, not_done = wait(futures, timeout=5)
    assert not not_done
    results = [f.result() for f in futures]
    assert sorted(r.job.key for r in results) == [f"pending-{i}" for i in range(4)]
    closed = [r for r in results if r.verdict.status == RUNTIME_ERROR and "closed" in " ".join(r.verdict.reasons)]
    assert len(closed) >= 3  # the one in flight may or may not have finished
    if backend == "ray":
        late = pool.submit(EvalJob(task, candidate("scale", "correct")))
        assert late.result(timeout=1).verdict.status == RUNTIME_ERROR  # answered at once, not queued forever
        assert ray.is_initialized()  # an instance the pool did not start is left running



def test_a_cancelled_job_leaves_the_others_alone(backend, tasks):
    """Pool futures can be cancelled (concurrent.futures.wait with a timeout, then cancel()). Answering
    a cancelled one raised in the dispatcher, which then failed every other job (the Ray pool until
    this test; the local one's own case is in test_pool_lifecycle.py)."""
    task = tasks["scale"]
    with open_pool(backend, workers=1) as pool:
        judged = pool.submit(EvalJob(task, candidate("scale", "slow"), key="judged"))
        busy_worker(pool)
        assert judged.cancel()  # judged now: its verdict comes and must be dropped
        waiting = pool.submit(EvalJob(task, candidate("scale", "slow"), key="waiting"))
        assert waiting.cancel()  # never sent: dropped
        after = [pool.submit(EvalJob(task, candidate("scale", "correct"), key=f"after-{k}")) for k in range(2)]
        assert [f.result(timeout=300).verdict.status for f in after] == [OK, OK]

# -- Ray only ----------------------------------------------------------------------------------------------
needs_ray = pytest.mark.skipif(ray is None, reason="ray is not installed (pip install 'cuda-l1[ray]')")


@needs_ray
def test_ray_pool_refuses_cuda_on_a_cluster_without_gpus(ray_cluster):
    from cuda_l1.errors import UserError

    with pytest.raises(UserError, match="no GPUs"):
        make_pool("ray", device="cuda", config=quick_config())


@needs_ray
def test_ray_pool_stops_the_instance_it_started(tmp_path):
    """In a fresh interpreter: make_pool("ray") starts a private instance and close() stops it."""
    script = textwrap.dedent(f"""
        import ray
        from cuda_l1.evaluate.jobs import EvalJob
        from cuda_l1.evaluate.pool import make_pool
        from test_pool import candidate, make_tasks, quick_config

        task = make_tasks({str(tmp_path / "notes.txt")!r})["scale"]
        pool = make_pool("ray", device="cpu", config=quick_config(), workers=1)
        assert ray.is_initialized()
        [result] = list(pool.run([EvalJob(task, candidate("scale", "correct"))]))
        pool.close()
        print("status", result.verdict.status, "initialized", ray.is_initialized())
    """)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "status ok initialized False" in proc.stdout


SECOND_INPUTS_END = """CALLS = [0]


def get_inputs():
    CALLS[0] += 1
    if CALLS[0] == 2:  # the first: the reference's first run; the second: the inputs' layout
        os._exit(3)
    return [torch.randn(64)]
"""


# A worker dying in the middle of a message to its pool, made certain: the task's import finds the
# worker's way back to the pool and leaves it as a kill mid-write would. When the workers shared one
# queue, a worker that died holding its lock (its feeder thread between writing and releasing) held
# up every later verdict: the pool hung (seen in CI as a 180 s timeout of the job after it).
MID_MESSAGE_END = """import struct
import sys
frame = sys._getframe()
while frame is not None and frame.f_code.co_name not in ("worker_main", "_worker_main"):
    frame = frame.f_back
if frame is not None:  # in the trusted worker, which imports it first (a sandboxed side has no way back)
    channel = frame.f_locals.get("results") or frame.f_locals.get("outbox")
    if hasattr(channel, "_wlock"):  # a queue shared by the workers: die holding its lock
        channel._wlock.acquire()
    else:  # a pipe of its own: die halfway through a message
        os.write(channel.fileno(), struct.pack("!Q", 1 << 20) + b"half a message")
    os._exit(3)  # (only here: imported anywhere else, the task is fine, and the test fails)"""


# A whole message, framed as the worker frames its own, that is not one: the pool ends the worker (its
# channel is not trusted on) while the task's code still runs, so the death is the task's.
MALFORMED_MESSAGE = MID_MESSAGE_END.replace(
    """        os.write(channel.fileno(), struct.pack("!Q", 1 << 20) + b"half a message")
    os._exit(3)""", """        from cuda_l1.evaluate.worker_results import send
        send(channel, "not a message")
        import time
        time.sleep(120)""")
assert MALFORMED_MESSAGE != MID_MESSAGE_END


@pytest.mark.parametrize("ending", ["os._exit(3)", "os.kill(os.getpid(), signal.SIGSEGV)", "get_inputs",
                                    MID_MESSAGE_END, MALFORMED_MESSAGE],
                         ids=["exit", "segfault", "get_inputs", "mid_message", "malformed_message"])
def test_a_task_that_ends_its_worker_is_bad_input_not_the_candidates_failure(tasks, ending):
    """A task whose import (or second get_inputs call) ends the process killed its worker twice, and
    the candidate was stored as a runtime_error. The worker marks the task's code while it runs it; a
    death then is the task's: BrokenTask, and the pool goes on with the other tasks, even when the
    worker died in the middle of a message to the pool."""
    from cuda_l1.errors import BrokenTask

    if ending == "get_inputs":
        source = tasks["scale"].source.replace("def get_inputs():\n    return [torch.randn(64)]\n", SECOND_INPUTS_END)
        assert source != tasks["scale"].source
    else:
        source = tasks["scale"].source.replace("import os\n", f"import os\nimport signal\n{ending}\n", 1)
    exiting = make_task(source, name="ends", level=1, origin="ends.py")
    with open_pool("local", workers=1) as pool:
        bad = pool.submit(EvalJob(exiting, candidate("scale", "correct")))
        good = pool.submit(EvalJob(tasks["scale"], candidate("scale", "correct")))
        with pytest.raises(BrokenTask, match="ends.py: the evaluation worker .* while running the task's own code"):
            bad.result(timeout=180)
        result = good.result(timeout=180)
        assert result.verdict.status == OK and result.attempts == 1, result.verdict.reasons


def test_a_gpu_workers_memory_estimate_runs_the_tasks_code_under_its_mark(tasks):
    """On a GPU a worker first runs the task's module on the meta device for its memory estimate
    (device_room.py): a death there is the task's too, and only the task's code is marked."""
    import multiprocessing as mp

    from cuda_l1.evaluate import task_marks
    from cuda_l1.evaluate.device_room import DeviceRoom

    marks, seen = task_marks.PreparingMarks(mp.get_context("spawn")), []
    room = DeviceRoom("cuda:0", free=lambda: 1 << 40, need=lambda source: seen.append(marks.read()) or 0)
    task = tasks["scale"]
    task_marks.install(marks)
    try:
        room.need(task)
    finally:
        task_marks.install(None)
    assert seen == [[task.id]] and marks.read() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_broken_task_is_prepared_once_for_all_its_candidates(backend, tasks, tmp_path):
    """A bench queues a task's candidates back to back (four strategies). Its reference failing its one
    run is the task's error, and the worker remembers it: the task's other candidates are answered at
    once (each a BrokenTask) instead of running a failed reference, up to its deadline, again for each."""
    from cuda_l1.errors import BrokenTask

    if backend == "ray" and ray is None:
        pytest.skip("ray is not installed")
    source = tasks["scale"].source.replace("return torch.relu(x) * 2", 'raise ValueError("forward broke")')
    broken = make_task(source, name="broken", level=1, origin="broken.py")
    with open_pool(backend, workers=1) as pool:
        bad = [pool.submit(EvalJob(broken, candidate("scale", kind))) for kind in ("correct", "wrong_shape", "raises")]
        good = pool.submit(EvalJob(tasks["scale"], candidate("scale", "correct")))
        for future in bad:
            with pytest.raises(BrokenTask, match="broken.py: .*forward broke"):
                future.result(timeout=180)
        assert good.result(timeout=180).verdict.status == OK
    notes = (tmp_path / "prepared.txt").read_text().split()
    assert notes.count("scale") == 2, notes  # the broken task's module ran once, the good one's once
