"""What a side prints (child_output.py): kept in the parent's memory as its first and last bytes with
the count of what was dropped, drained as it is written (a side never waits on a full pipe), never
written to the host's disk, and closing never waits on a process that keeps the pipe open."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from corpus_util import cases
from cuda_l1.evaluate.child_output import ChildOutput
from cuda_l1.evaluate.config import EvalConfig, SandboxConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="pipes, forks and /proc (Linux)")


def _writer(code: str, output: ChildOutput, **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=output.write_fd, stderr=output.write_fd, **kwargs)
    os.close(output.write_fd)
    return proc


def test_keeps_head_and_tail_and_counts_the_rest():
    output = ChildOutput(head_bytes=64, tail_bytes=64)
    code = "import sys\nsys.stdout.write('BEGIN' + 'x' * 10_000_000)\nsys.stdout.flush()\nsys.stderr.write('END')"
    assert _writer(code, output).wait(timeout=60) == 0
    text = output.close(timeout=10)
    head, marker, tail = text.partition("\n[... ")
    assert head == "BEGIN" + "x" * 59
    assert tail.endswith(" bytes dropped ...]\n" + "x" * 61 + "END")
    assert output.total == 10_000_008 and output.dropped == 10_000_008 - 128
    assert f"[... {output.dropped} bytes dropped ...]" in text


def test_short_output_is_kept_whole():
    output = ChildOutput(head_bytes=64, tail_bytes=64)
    assert _writer("print('hello'); import sys; print('world', file=sys.stderr)", output).wait(timeout=60) == 0
    assert output.close(timeout=10) == "hello\nworld\n"
    assert output.dropped == 0


def test_drained_while_nobody_asks():
    """A writer of 50 MB finishes on its own: the parent's thread empties the pipe (64 KiB) as it fills."""
    output = ChildOutput(head_bytes=1024, tail_bytes=1024)
    proc = _writer("import sys\nfor _ in range(50): sys.stderr.write('y' * (1 << 20))", output)
    assert proc.wait(timeout=30) == 0
    assert output.settle(10)
    assert output.total == 50 << 20
    output.close()


def test_close_does_not_wait_for_a_process_that_keeps_the_pipe():
    """A process that escaped the side's tree holds the write end: no end of file comes, and close
    still returns at its timeout (the thread is told to stop)."""
    output = ChildOutput(head_bytes=64, tail_bytes=64)
    proc = _writer("import os, sys, time\nprint('parent', flush=True)\nif os.fork() == 0:\n    time.sleep(60)\n",
                   output, start_new_session=True)
    try:
        proc.wait(timeout=30)
        started = time.monotonic()
        assert output.close(timeout=0.5) == "parent\n"
        assert 0.4 < time.monotonic() - started < 3.0  # no end of file came: it waited, then stopped
        assert not output._thread.is_alive()
    finally:
        os.killpg(proc.pid, 9)


def _disk_bytes(root: Path) -> int:
    """Bytes on disk under root. os.walk skips a directory removed mid-walk (a side's scratch goes away
    while this watches), where Path.rglob raises."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
    return total


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "fresh"])
def test_a_flood_of_output_stays_off_the_hosts_disk(tmp_path, monkeypatch, fork_server):
    """The log_flood candidate prints 200 MB. The host's temp directory (where the side's log file
    used to grow to 200 MB) stays small while it runs, the verdict arrives, and its log shows how the
    output began and ended."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    case = {c.name: c for c in cases("cpu")}["log_flood"]
    timing = TimingConfig.quick()
    timing.max_time_s = 1.0
    config = EvalConfig(device="cpu", timing=timing, call_timeout_s=15.0, first_call_timeout_s=60.0,
                        sandbox=SandboxConfig(memory_bytes=3 * 2**30, max_processes=24, fork_server=fork_server))
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], _disk_bytes(tmp_path))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    evaluator = Evaluator(case.task(), config)
    try:
        watcher.start()
        verdict = evaluator.evaluate(case.source())
    finally:
        stop.set()
        watcher.join()
        evaluator.close()
    assert verdict.status == "ok", (verdict.status, verdict.reasons, verdict.log[-500:])
    assert peak[0] < 16 << 20, f"{peak[0]} bytes on the host's disk during the evaluation"
    assert verdict.log.startswith("FLOOD-BEGIN\n"), verdict.log[:100]
    assert "bytes dropped ...]" in verdict.log and "FLOOD-END call" in verdict.log[-100:], verdict.log[-300:]
    assert len(verdict.log) <= config.sandbox.log_bytes + 100
