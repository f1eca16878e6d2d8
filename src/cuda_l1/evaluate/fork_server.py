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
`python -m cuda_l1.evaluate.fork_server_process FD [MODULES COMPILERS_FD]` under a scrubbed
environment; it dies with the thread that started it. It comes in two stages when it preloads
MODULES (torch.compile's): the first is ready once torch is imported and forks sides at once; the
second, forked from it (one torch import for both), imports MODULES, checked as fork_preload.py
says, and forks every side once it is ready. A second stage whose preload is unsafe exits; the first
stage goes on forking, and a replacement server has no second stage. The confinement probe's trials are forked
from the first stage too (probe.py).
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

    def __init__(self, server: "Stage", pid: int, args: list[str]):
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


class Stage:
    """One server process's connection: its socket, its answers and reports, whether it is ready.
    Thread-safe: requests carry ids, and a request left unanswered ends the server (a late fork
    could not be told apart from the next)."""

    def __init__(self, owner: "ForkServer", sock: socket.socket, preload: tuple[str, ...], end):
        self.owner, self._sock, self.preload, self._end = owner, sock, preload, end
        self.preloaded: tuple[str, ...] = ()  # what the server imported beyond the harness, once ready
        self.ready_at: float | None = None  # when (time.time()) it said it was ready
        self.pid: int | None = None  # the server process's, from its ready message
        self._send_lock = threading.Lock()  # a message is sent whole, one at a time
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}  # pid -> returncode (Popen's convention)
        self._replies: dict[int, dict] = {}  # request id -> the server's answer
        self._next_id = 0
        self._dead = ""  # why the server cannot be used (empty while it can)
        self._ready = threading.Event()
        self._closing = False  # closed by the parent: not a refused preload

    def read(self) -> None:
        """Take the server's messages until its socket closes (in a thread of its own)."""
        try:
            while True:
                data = self._sock.recv(MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                with self._changed:
                    if message["op"] == "ready":
                        self.preloaded, self.ready_at = tuple(message.get("preloaded", ())), time.time()
                        self.pid = int(message["pid"]) if "pid" in message else None
                        self._ready.set()
                    elif message["op"] == "preload_refused":
                        _refuse_preload(str(message["why"]))
                    elif message["op"] == "spawned":
                        self._replies[int(message["id"])] = message
                    elif message["op"] == "exited":
                        self._exits[int(message["pid"])] = int(message["returncode"])
                    self._changed.notify_all()
        except Exception as exc:  # noqa: BLE001 - whatever broke, the server is not used again
            self.fail(f"the fork server's reports could not be read: {type(exc).__name__}: {exc}")
            return
        self.fail("the fork server exited: " + self.owner.log_tail()[-500:])

    def fail(self, why: str) -> None:
        """Never use the server again, and end it: a server declared gone must not fork later. One
        that preloaded and never said it was ready (it died or hung there) refuses the preload."""
        if self.preload and not self._ready.is_set() and not self._closing and not self.owner.first._dead:
            _refuse_preload(why or "the server never said it was ready")  # not when its first stage went
        with self._changed:
            self._dead = self._dead or why or "the fork server is gone"
            self._ready.set()
            self._changed.notify_all()
        self._end()

    def is_ready(self) -> bool:
        """Ready and not gone, without waiting."""
        return self._ready.is_set() and not self._dead

    def starting(self) -> bool:
        """Neither ready nor known to be gone: still importing what it preloads."""
        return not self._ready.is_set()

    def usable(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Whether the server said it is ready (waiting for it the first time) and is not gone."""
        if not self._ready.wait(timeout):
            self.fail(f"the fork server was not ready within {timeout:.0f} s")
        return not self._dead

    def spawn(self, device: str, plan_json: str, read_fd: int, write_fd: int, inputs_fd: int, log_fd: int,
              cwd: str, env: dict[str, str], probe: str | None = None) -> ForkedProcess:
        """See ForkServer.spawn."""
        if not self.usable():
            raise NotSent(self._dead)
        fds = [read_fd, write_fd, log_fd] + ([inputs_fd] if inputs_fd >= 0 else [])
        with self._changed:
            request_id, self._next_id = self._next_id, self._next_id + 1
        request = {"op": "spawn", "id": request_id, "device": device, "plan": plan_json, "cwd": cwd, "env": env,
                   "inputs": inputs_fd >= 0}
        if probe is not None:
            request["probe"] = probe
        try:
            with self._send_lock:
                self._sock.sendmsg([json.dumps(request).encode()],
                                   [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError as exc:  # a message this side of the socket refused (too large, say): nothing sent
            raise NotSent(f"the fork server cannot take this request: {exc}") from None
        with self._changed:
            self._changed.wait_for(lambda: request_id in self._replies or self._dead, timeout=SPAWN_TIMEOUT_S)
            reply = self._replies.pop(request_id, None)
        if reply is None:
            self.fail(f"the fork server did not answer a request within {SPAWN_TIMEOUT_S:.0f} s")
            raise OSError(self._dead)
        if "pid" not in reply:
            raise OSError(reply.get("error", "the fork server could not fork"))
        return ForkedProcess(self, int(reply["pid"]), ["cuda_l1.evaluate.child (forked)"])

    def send(self, message: dict) -> None:
        with contextlib.suppress(OSError), self._send_lock:
            self._sock.send(json.dumps(message).encode())

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
        self.send({"op": "release", "pid": pid})
        with self._changed:
            self._exits.pop(pid, None)

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # the server reads end-of-file and exits
        self._sock.close()


class ForkServer:
    """This process's fork server. With modules to preload it comes in two stages (one process each,
    the second forked from the first: fork_server_process.py): `first` is ready once torch and the
    harness are imported, `compilers` once torch.compile's modules are too, a few seconds later. A
    side is forked from the compilers' stage when it is ready, else from the first: the first sides
    of a run do not wait for an import most candidates never use (a torch.compile candidate in one
    imports the modules itself, as a fresh interpreter would)."""

    def __init__(self, preload: tuple[str, ...] = fork_preload.COMPILER_MODULES):
        self.preload = () if _preload_refused else preload
        self._log = tempfile.NamedTemporaryFile(prefix="cuda-l1-fork-server-", suffix=".txt", delete=False)
        self._scratch = tempfile.mkdtemp(prefix="cuda-l1-fork-server-")  # its working directory, empty
        self._proc: subprocess.Popen | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.first = Stage(self, ours, (), self._kill)
        self.compilers: Stage | None = None
        second = None
        if self.preload:
            ours, second = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.compilers = Stage(self, ours, self.preload, self._end_second_stage)
        # The server's parent-death signal fires when the thread that started it exits: this one
        # starts it and then reads the first stage's reports for as long as the server lives.
        self._reader = threading.Thread(target=self._run, args=(theirs, second), name="cuda-l1-fork-server", daemon=True)
        self._reader.start()

    def _run(self, theirs: socket.socket, second: socket.socket | None) -> None:
        passed = (theirs.fileno(),) + ((second.fileno(),) if second is not None else ())
        args = [str(theirs.fileno())] + ([",".join(self.preload), str(second.fileno())] if second is not None else [])
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "cuda_l1.evaluate.fork_server_process"] + args,
                cwd=self._scratch, env=scrubbed_env(self._scratch), stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=self._log, pass_fds=passed, start_new_session=True, close_fds=True)
        except OSError as exc:
            self.first.fail(f"the fork server could not start: {exc}")
            if self.compilers is not None:
                self.compilers.fail(f"the fork server could not start: {exc}")
            return
        finally:
            theirs.close()
            if second is not None:
                second.close()
        if self.compilers is not None:
            threading.Thread(target=self.compilers.read, name="cuda-l1-fork-server-compilers", daemon=True).start()
        self.first.read()

    def _kill(self) -> None:
        """End the server (both stages: the second dies with the first)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()

    def _end_second_stage(self) -> None:
        """End the compilers' stage alone (the first stage is its parent and never reaps it)."""
        self.first.send({"op": "end_second_stage"})

    # -- what callers use ------------------------------------------------------------------------
    @property
    def ready_at(self) -> float | None:
        """When (time.time()) the first stage said it was ready."""
        return self.first.ready_at

    @property
    def preloaded(self) -> tuple[str, ...]:
        """What sides forked now have imported beyond the harness."""
        return self.compilers.preloaded if self.compilers is not None and self.compilers.is_ready() else ()

    @property
    def _dead(self) -> str:
        return self.first._dead

    def usable(self) -> bool:
        """Whether the server said it is ready (waiting for its first stage) and is not gone."""
        return self.first.usable()

    def wait_compilers(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Wait for the compilers' stage; whether it is ready (False without one, or refused)."""
        return self.compilers is not None and self.compilers.usable(timeout)

    def spawn(self, device: str, plan_json: str, read_fd: int, write_fd: int, inputs_fd: int, log_fd: int,
              cwd: str, env: dict[str, str], probe: str | None = None) -> ForkedProcess:
        """Fork a side that runs the harness (child.main) with these descriptors, in `cwd` under
        `env`: from the compilers' stage when it is ready, else from the first. `probe` (None: a
        side): a confinement probe instead, talking on `read_fd` and `write_fd` as its stdin and
        stdout (probe.py; "" or a CUDA IPC handle to open), always from the first stage, which is
        ready first. Raises NotSent when the request never reached the server (the caller may start a
        fresh interpreter on the same descriptors), OSError when it went unanswered (the server is
        then ended; the descriptors were handed over and must not be used again)."""
        stage = self.compilers if probe is None and self.compilers is not None and self.compilers.is_ready() else self.first
        return stage.spawn(device, plan_json, read_fd, write_fd, inputs_fd, log_fd, cwd, env, probe)

    def spawn_trial(self, device: str, plan_json: str, read_fd: int, write_fd: int, log_fd: int, cwd: str,
                    env: dict[str, str], handle: str | None) -> ForkedProcess | None:
        """A confinement probe's trial (probe.py), forked from the first stage; None when the request
        never reached the server (the caller may start a fresh interpreter instead)."""
        try:
            return self.spawn(device, plan_json, read_fd, write_fd, -1, log_fd, cwd, env, probe=handle or "")
        except NotSent:
            return None

    def log_tail(self) -> str:
        with contextlib.suppress(OSError), open(self._log.name, "rb") as fh:
            return fh.read()[-4000:].decode("utf-8", errors="replace")
        return ""

    def close(self) -> None:
        for stage in (self.compilers, self.first):
            if stage is not None:
                stage.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
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
        # Refused once, a server's compilers' stage is gone and its first stage goes on: still one
        # server, and a replacement starts without the preload (ForkServer).
        server = _SHARED.get(preload)
        if server is None or server._dead:
            if server is not None:
                server.close()
            elif not _SHARED:
                atexit.register(lambda: [s.close() for s in list(_SHARED.values())])
            server = _SHARED[preload] = ForkServer(fork_preload.COMPILER_MODULES if preload else ())
        return server


# Cores a host must allow this process before a first timing may run beside the compilers' import:
# with this many, the scheduler has idle cores for it away from the one core both sides are pinned to.
IMPORT_BESIDE_TIMING_CORES = 8


def wait_for_imports(timeout: float = READY_TIMEOUT_S, pinned_core: int | None = None) -> None:
    """Until no server of this process is still importing in its second stage: that import is a
    busy process beside the timed core (about 1 s of a 2-core host's CPU), so no window is timed
    during it. Returns at once when none is (every evaluation of a process but its first few), and
    when the sides are pinned to `pinned_core` on a host of at least IMPORT_BESIDE_TIMING_CORES
    allowed cores (a GPU host: the import finds idle cores elsewhere, and waiting for it held each
    worker's first verdict back by about 2.5 s on a 16-core H100 host); a thread then waits for it
    instead, so a stage that never gets ready is still ended, and its preload refused, at `timeout`."""
    beside = pinned_core is not None and len(os.sched_getaffinity(0)) >= IMPORT_BESIDE_TIMING_CORES
    for server in list(_SHARED.values()):
        stage = server.compilers
        if stage is None or not stage.starting():
            continue
        if not beside:
            stage.usable(timeout)
        elif not getattr(stage, "watched", False):  # still ended (and refused) if it never gets ready
            stage.watched = True
            threading.Thread(target=stage.usable, args=(timeout,), name="cuda-l1-compilers-wait", daemon=True).start()


def start_ahead(sandbox, device: str) -> ForkServer | None:
    """Start now, in the background, what starting a side waits for: the fork server (its first stage's
    torch import, about 5 s on an H200 host, its second's compilers about 5 s more) and on CUDA the
    confinement probe (probe.probe_ahead, whose trials the first stage forks). Called before the
    caller imports torch itself, so that their imports overlap its own: a pool's worker does so first
    thing, `cuda-l1 eval` before it checks the reference. Returns the server (None without one)."""
    from cuda_l1.evaluate.probe import probe_ahead

    server = shared(sandbox.preload_compilers) if sandbox.fork_server else None
    probe_ahead(sandbox, device, server)
    return server
