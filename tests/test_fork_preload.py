"""torch.compile's modules imported once in the fork server (fork_preload.py): the sides have them
without importing, still compile into their own scratch, and a preload that would make forking unsafe
is refused, with the next server starting without one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cuda_l1.evaluate import fork_preload, fork_server
from cuda_l1.evaluate.fork_preload import COMPILER_MODULES, preload
from task_sources import one_line_task, untimed_cpu_config

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="forks and reads /proc (Linux)")


@pytest.fixture
def fresh_preload(monkeypatch):
    """Whatever an earlier server refused in this process, these tests start from no refusal (and
    from servers started under none)."""
    monkeypatch.setattr(fork_server, "_preload_refused", "")
    monkeypatch.setattr(fork_server, "_SHARED", {})
    yield
    for server in fork_server._SHARED.values():
        server.close()


def test_the_servers_second_stage_imports_torch_compiles_modules_before_it_is_ready(fresh_preload):
    server = fork_server.ForkServer()
    try:
        assert server.usable(), server.log_tail()
        assert server.wait_compilers(), server.log_tail()
        assert server.preloaded == COMPILER_MODULES and server.compilers.preloaded == COMPILER_MODULES
        assert server.first.preloaded == ()
    finally:
        server.close()


def test_the_server_leaves_nothing_behind_but_an_empty_cache_directory_while_it_lives(fresh_preload):
    server = fork_server.ForkServer()
    try:
        assert server.usable() and server.wait_compilers(), server.log_tail()
        assert [(p.name, list(p.iterdir())) for p in Path(server._scratch).iterdir()] == [("inductor", [])]
    finally:
        server.close()
    assert not Path(server._scratch).exists()


UNSAFE_PRELOADS = {
    "a_python_thread": "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
    # threading.active_count() does not see it; the thread ids do
    "a_bare_thread": "import _thread, time\n_thread.start_new_thread(time.sleep, (60,))\n",
    # the server dies before it says anything: refused all the same
    "an_exit": "import os\nos._exit(7)\n",
}


@pytest.mark.parametrize("module", sorted(UNSAFE_PRELOADS))
def test_an_unsafe_preload_is_refused_and_the_next_server_has_none(fresh_preload, tmp_path, monkeypatch, module):
    (tmp_path / f"{module}.py").write_text(UNSAFE_PRELOADS[module])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path)] + sys.path))
    refused = fork_server.ForkServer(preload=(module,))
    try:
        assert not refused.wait_compilers()  # its second stage forks nothing
        assert fork_server._preload_refused
        if module != "an_exit":
            assert "started a thread" in fork_server._preload_refused
            assert "preload refused" in refused.log_tail()
        assert refused.usable() and refused.preloaded == ()  # the first stage goes on forking
    finally:
        refused.close()
    replacement = fork_server.ForkServer()
    try:
        assert replacement.usable(), replacement.log_tail()
        assert replacement.preload == () and replacement.preloaded == () and replacement.compilers is None
    finally:
        replacement.close()


def test_a_module_that_cannot_be_imported_is_a_reason_not_an_exception():
    assert preload(("cuda_l1_no_such_module",)).startswith("importing cuda_l1_no_such_module failed")


def test_a_preload_that_initialises_the_driver_is_refused_before_any_fork(monkeypatch):
    """What initialising CUDA leaves (an open /dev/nvidiactl, the driver library mapped) is enough:
    torch's own bad-fork flag only knows about torch's initialisations."""
    traces = iter([set(), {"/dev/nvidiactl"}, {"/dev/nvidiactl"}])
    monkeypatch.setattr(fork_preload, "driver_traces", lambda: next(traces))
    monkeypatch.setattr(fork_preload, "thread_ids", lambda: {"1"})
    monkeypatch.setattr(fork_preload.threading, "active_count", lambda: 1)
    monkeypatch.setattr(fork_preload, "_probe_fork", lambda: pytest.fail("forked after the driver was seen"))
    assert "initialised the CUDA driver (/dev/nvidiactl)" in preload(())


TASK = one_line_task("x * 2.0")

# A forked side has torch.compile's modules before it imports them, and compiles into its own scratch:
# inductor reads its cache directory from the side's environment when it compiles, not at import.
COMPILES_IN_ITS_SCRATCH = """
import os, sys


class ModelNew(Model):
    def __init__(self):
        super().__init__()
        assert "torch._inductor" in sys.modules, "not preloaded"
        debug = torch._dynamo.config.debug_dir_root  # fixed at import: worked out again in the side
        assert os.path.realpath(debug).startswith(os.path.realpath(os.getcwd())), (debug, os.getcwd())
        cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert os.path.realpath(cache).startswith(os.path.realpath(os.getcwd())), (cache, os.getcwd())
        doubled = torch.compile(lambda v: v * 2.0)(torch.ones(8))
        assert float(doubled.sum()) == 16.0
        assert os.listdir(cache), "inductor wrote nothing into the side's cache directory"
"""


def test_a_torch_compile_candidate_in_a_forked_side_compiles_into_its_own_scratch(fresh_preload):
    from cuda_l1.evaluate.evaluator import Evaluator
    from cuda_l1.tasks import make_task

    assert fork_server.shared().wait_compilers()  # the first sides of a run may come from the first stage
    evaluator = Evaluator(make_task(TASK, name="1_double", level=1, origin="test:double"), untimed_cpu_config())
    try:
        verdict = evaluator.evaluate(TASK + COMPILES_IN_ITS_SCRATCH)
        assert verdict.status == "ok", (verdict.reasons, verdict.log[-3000:])
        assert verdict.sandbox["started"] == "forked"
        assert verdict.sandbox["preloaded"] == ", ".join(COMPILER_MODULES)
        server = fork_server.shared()
        # The server's import makes its own (empty) cache directory; a side writes only into its own.
        assert [p.name for p in Path(server._scratch).rglob("*")] == ["inductor"], "a side wrote there"
    finally:
        evaluator.close()
