"""Sides started by forking a process that has already imported torch (SandboxConfig.fork_server, on by
default: a side is ready in 0.07 s instead of 2.4 s on a 2-core CPU host, 0.5 s instead of 5 s on an H200).

A fresh side spends most of its start importing torch. The fork server is one trusted process per
worker: it imports torch and the harness once, creating no thread and touching no GPU, and forks a
side per request. The child is single-threaded (fork copies the calling thread only), so it confines
itself exactly as a fresh side does (child.main) before any device context or candidate code.

A side inherits the server's memory: torch's modules and the requests it was sent, which hold nothing
secret (scrubbed environments, confinement plans; a side's channel key is written by the parent
straight into the side's own pipe, never sent here). The side's variables are set after the fork;
/proc/PID/environ still shows the server's block, which is scrubbed as well. The server's socket is
closed in the child first; every other descriptor but the side's pipes, input buffer and log too.

The server is the sides' parent: it reports each side's exit without reaping it (the pid stays the
parent's to signal) and reaps it when the parent releases it (`ForkedProcess.release`).

This module is the parent's half. The server's own process is fork_server_process.py, run as
`python -m cuda_l1.evaluate.fork_server_process FD [MODULES]` under a scrubbed environment; it dies
with the thread that started it. MODULES (torch.compile's) are imported before it is ready, and
checked as fork_preload.py says: a server whose preload is unsafe exits; its replacement has none.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from cuda_l1.evaluate.environment import scrubbed_env
from cuda_l1.evaluate import fork_preload
from cuda_l1.evaluate.fork_server_process import MAX_MESSAGE

READY_TIMEOUT_S = 120.0  # the server's own start (it imports torch)
SPAWN_TIMEOUT_S = 30.0  # one fork (milliseconds when well)
_preload_refused = ""  # why a server's preload was unsafe in this process: later servers have none


# -- the parent's side ---------------------------------------------------------------------------------
class ForkedProcess:
    """A side forked by the server, as much of subprocess.Popen as sandbox.SideProcess uses."""

    def __init__(self, server: "ForkServer", pid: int, args: list[str]):
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server._exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self.server._wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.returncode = code
        return code

    def release(self) -> None:
        """The parent is done with the pid: the server may reap it (at once, or when it exits)."""
        self.server._release(self.pid)


class NotSent(OSError):
    """The request never reached the server: its descriptors are still the caller's alone."""


class ForkServer:
    """One server process; `spawn` forks a side from it. Thread-safe: requests carry ids, and a
    request left unanswered ends the server (a late fork could not be told apart from the next)."""

    def __init__(self, preload: tuple[str, ...] = fork_preload.COMPILER_MODULES):
        self.preload = () if _preload_refused else preload
        self.preloaded: tuple[str, ...] = ()  # what the server imported beyond the harness, once ready
        self.ready_at: float | None = None  # when (time.time()) it said it was ready
        self._send_lock = threading.Lock()  # a message is sent whole, one at a time
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}  # pid -> returncode (Popen's convention)
        self._replies: dict[int, dict] = {}  # request id -> the server's answer
        self._next_id = 0
        self._dead = ""  # why the server cannot be used (empty while it can)
        self._ready = threading.Event()
        self._log = tempfile.NamedTemporaryFile(prefix="cuda-l1-fork-server-", suffix=".txt", delete=False)
        self._scratch = tempfile.mkdtemp(prefix="cuda-l1-fork-server-")  # its working directory, empty
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc: subprocess.Popen | None = None
        # The server's parent-death signal fires when the thread that started it exits: this one
        # starts it and then reads its reports for as long as the server lives.
        self._reader = threading.Thread(target=self._run, args=(theirs,), name="cuda-l1-fork-server", daemon=True)
        self._reader.start()

    def _run(self, theirs: socket.socket) -> None:
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "cuda_l1.evaluate.fork_server_process", str(theirs.fileno()), ",".join(self.preload)],
                cwd=self._scratch, env=scrubbed_env(self._scratch), stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=self._log, pass_fds=(theirs.fileno(),), start_new_session=True, close_fds=True)
        except OSError as exc:
            self._fail(f"the fork server could not start: {exc}")
            return
        finally:
            theirs.close()
        try:
            while True:
                data = self._sock.recv(MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                with self._changed:
                    if message["op"] == "ready":
                        self.preloaded, self.ready_at = tuple(message.get("preloaded", ())), time.time()
                        self._ready.set()
                    elif message["op"] == "preload_refused":
                        _refuse_preload(str(message["why"]))
                    elif message["op"] == "spawned":
                        self._replies[int(message["id"])] = message
                    elif message["op"] == "exited":
                        self._exits[int(message["pid"])] = int(message["returncode"])
                    self._changed.notify_all()
        except Exception as exc:  # noqa: BLE001 - whatever broke, the server is not used again
            self._fail(f"the fork server's reports could not be read: {type(exc).__name__}: {exc}")
            return
        self._fail("the fork server exited: " + self.log_tail()[-500:])

    def _fail(self, why: str) -> None:
        """Never use the server again, and end it: a server declared gone must not fork later. One
        that preloaded and never said it was ready (it died or hung there) refuses the preload."""
        if self.preload and not self._ready.is_set():
            _refuse_preload(why or "the server never said it was ready")
        with self._changed:
            self._dead = self._dead or why or "the fork server is gone"
            self._ready.set()
            self._changed.notify_all()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()

    def usable(self) -> bool:
        """Whether the server said it is ready (waiting for it the first time) and is not gone."""
        if not self._ready.wait(READY_TIMEOUT_S):
            self._fail(f"the fork server was not ready within {READY_TIMEOUT_S:.0f} s")
        return not self._dead

    def spawn(self, device: str, plan_json: str, read_fd: int, write_fd: int, inputs_fd: int, log_fd: int,
              cwd: str, env: dict[str, str]) -> ForkedProcess:
        """Fork a side that runs the harness (child.main) with these descriptors, in `cwd` under
        `env`. Raises NotSent when the request never reached the server (the caller may start a
        fresh interpreter on the same descriptors), OSError when it went unanswered (the server is
        then ended; the descriptors were handed over and must not be used again)."""
        if not self.usable():
            raise NotSent(self._dead)
        fds = [read_fd, write_fd, log_fd] + ([inputs_fd] if inputs_fd >= 0 else [])
        with self._changed:
            request_id, self._next_id = self._next_id, self._next_id + 1
        request = json.dumps({"op": "spawn", "id": request_id, "device": device, "plan": plan_json, "cwd": cwd,
                              "env": env, "inputs": inputs_fd >= 0}).encode()
        try:
            with self._send_lock:
                self._sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError as exc:  # a message this side of the socket refused (too large, say): nothing sent
            raise NotSent(f"the fork server cannot take this request: {exc}") from None
        with self._changed:
            self._changed.wait_for(lambda: request_id in self._replies or self._dead, timeout=SPAWN_TIMEOUT_S)
            reply = self._replies.pop(request_id, None)
        if reply is None:
            self._fail(f"the fork server did not answer a request within {SPAWN_TIMEOUT_S:.0f} s")
            raise OSError(self._dead)
        if "pid" not in reply:
            raise OSError(reply.get("error", "the fork server could not fork"))
        return ForkedProcess(self, int(reply["pid"]), ["cuda_l1.evaluate.child (forked)"])

    def _exit_status(self, pid: int) -> int | None:
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
            return -signal.SIGKILL if self._dead else None  # the server's sides die with it

    def _wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._dead, timeout=timeout)
        return self._exit_status(pid)

    def _release(self, pid: int) -> None:
        try:
            with self._send_lock:
                self._sock.send(json.dumps({"op": "release", "pid": pid}).encode())
        except OSError:
            pass
        with self._changed:
            self._exits.pop(pid, None)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError), open(self._log.name, "rb") as fh:
            return fh.read()[-4000:].decode("utf-8", errors="replace")
        return ""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # the server reads end-of-file and exits
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)
        shutil.rmtree(self._scratch, ignore_errors=True)  # the preload's import made a directory there


def launch(cmd: list[str], fork: bool, device: str, plan_json: str, read_fd: int, write_fd: int,
           inputs_fd: int, log_fd: int, cwd: str, env: dict[str, str], preload: bool = True):
    """Start a side: forked by this process's fork server (torch.compile's modules preloaded or not) when
    `fork` and it is usable, else as a fresh interpreter running `cmd`. A Popen or a ForkedProcess."""
    if fork:
        try:
            return shared(preload).spawn(device, plan_json, read_fd, write_fd, inputs_fd, log_fd, cwd, env)
        except NotSent:
            pass  # a fresh interpreter: slower, never weaker
    passed = tuple(fd for fd in (read_fd, write_fd, inputs_fd) if fd >= 0)
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                            pass_fds=passed, start_new_session=True, close_fds=True)


def _refuse_preload(why: str) -> None:
    global _preload_refused
    _preload_refused = why or "refused"


_SHARED: dict[bool, ForkServer] = {}  # preload -> this process's server
_SHARED_LOCK = threading.Lock()


def shared(preload: bool = True) -> ForkServer:
    """This process's fork server (compilers preloaded or not): started on first use or when gone."""
    with _SHARED_LOCK:
        preload = preload and not _preload_refused  # refused once: one server without, not two
        server = _SHARED.get(preload)
        if server is None or server._dead:
            if server is not None:
                server.close()
            elif not _SHARED:
                atexit.register(lambda: [s.close() for s in list(_SHARED.values())])
            server = _SHARED[preload] = ForkServer(fork_preload.COMPILER_MODULES if preload else ())
        return server


def start_ahead(sandbox, device: str) -> ForkServer | None:
    """Start now, in the background, what starting a side waits for: the fork server (its imports, about
    10 s on an H200 host) and on CUDA the confinement probe (probe.probe_ahead). Called before the
    caller imports torch itself, so that their imports overlap its own: a pool's worker does so first
    thing, `cuda-l1 eval` before it checks the reference. Returns the server (None without one)."""
    from cuda_l1.evaluate.probe import probe_ahead

    server = shared(sandbox.preload_compilers) if sandbox.fork_server else None
    probe_ahead(sandbox, device)
    return server
