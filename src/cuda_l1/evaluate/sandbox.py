"""The trust boundary, parent side: one sandboxed process running one side (reference or candidate).

What the parent guarantees, whatever the module inside does:
- it runs in a process of its own (a fresh interpreter, or forked from the fork server: one that has
  imported torch and nothing secret) in a fresh scratch directory, with an allow-listed environment
  (no keys, tokens, secrets, passwords, HF/OpenAI/AWS/... variables), confined (confine.py: namespaces,
  private mounts, an unprivileged uid or no capabilities, Landlock, seccomp, rlimits) before it creates
  a device context or sees candidate code — each layer probed and reported;
- it talks to the parent only through a private, authenticated channel (channel.py) whose frames are
  typed and validated (protocol.py); what it prints is drained into a bounded log that is never parsed
  (child_output.py: nothing of it reaches the host's disk);
- it runs only inside its own windows: before and after, the parent stops every process of its tree
  (its cgroup's freezer, else SIGSTOP) and checks that none used CPU time while stopped (`freeze`, `thaw`);
- its outputs are read by the parent from its memory (remote.py), never taken from its reports;
- wall-clock deadlines for every request, a memory limit (resident memory of the tree plus its private
  /dev/shm), a process-count limit and, on a CPU, the threads its harness started (none may end) are
  watched from outside; on any breach, and at the end, every process of the tree is killed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from cuda_l1.evaluate import protocol, scratch_dirs, side_memory, sigstop, validate
from cuda_l1.evaluate.cgroup import SideGroup
from cuda_l1.evaluate.channel import PARENT_SEND_TIMEOUT_S, Channel, ChannelClosed, ChannelError, ChannelTimeout, new_key, unread_bytes
from cuda_l1.evaluate.child_output import ChildOutput
from cuda_l1.evaluate.config import SandboxConfig
from cuda_l1.evaluate.confine import CONFINEMENT_FAILED, harness_under_init
from cuda_l1.evaluate.environment import scrubbed_env
from cuda_l1.evaluate.fork_server import launch, shared
from cuda_l1.evaluate.probe import identity_uid, usable_plan

class ChildFailure(Exception):
    """The side broke the protocol: died, hung, exceeded a limit, or sent something invalid."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" | "runtime_error" | "rejected"


@dataclass
class ExitInfo:
    returncode: int | None
    signal: int | None
    reason: str  # "exited", "running", "not started"


@dataclass
class SideProcess:
    """One sandboxed side and its channel."""

    config: SandboxConfig
    device: str
    proc: subprocess.Popen | None = None
    chan: Channel | None = None
    scratch: str = ""
    output: ChildOutput | None = None  # its stdout and stderr, as far as kept
    killed_for: str = ""
    inputs_fd: int = -1  # CPU: the parent's read-write memfd behind this side's input buffer
    notes: dict = field(default_factory=dict)
    frozen: set = field(default_factory=set)
    _frozen_ticks: int = 0
    group: SideGroup | None = None  # its cgroup (cgroup.py)
    _in_group: bool = False
    _frozen_by_group: bool = False  # how the last freeze() stopped the side (thaw() undoes it alike)
    _harness: int | None = None  # host pid of the harness, once found
    memory_limit: int = 0  # host memory it may hold (side_memory.py); raised, never lowered, by allow_memory
    started_at: float = 0.0  # time.monotonic() when it was started
    peak_memory: int = 0  # the most it was seen holding
    shared_scan: side_memory.SharedScan = field(default_factory=side_memory.SharedScan)  # without a cgroup
    pinned_core: int | None = None  # the core the parent pinned its threads to (pinning.py), if any
    harness_threads: frozenset = frozenset()  # CPU: its tree's threads once its harness started (see watch)

    @classmethod
    def start(cls, config: SandboxConfig, device: str, read_paths: list[str], cpu_core: int | None = None,
              memory_limit: int | None = None) -> "SideProcess":
        """Start a side; it may hold `memory_limit` bytes of host memory (default: config.memory_bytes)."""
        self = cls(config, device)
        self.started_at = time.monotonic()
        self.memory_limit = memory_limit or config.memory_bytes
        self.scratch = scratch_dirs.make(config.scratch_root)
        uid = identity_uid(read_paths) if config.drop_identity else None
        if uid is not None:
            os.chown(self.scratch, uid, uid)
        group = SideGroup.create() if config.cgroup and sys.platform.startswith("linux") else None
        counted = group is not None and group.memory_bytes() is not None
        # a reservation limit only where no cgroup counts what is held
        plan = config.confine_plan(self.scratch, uid, cpu_core, read_paths,
                                   self.memory_limit if device == "cpu" and not counted else None)
        server = shared(config.preload_compilers) if config.fork_server else None  # it forks the probe's trials
        plan.namespaces, plan.sockets = usable_plan(config.namespaces, device, plan, server)
        plan.cgroup_procs = group.procs_file if group else ""
        if group is not None:
            group.limit_memory(self.memory_limit + config.shm_bytes)
        self.group = group
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        passed = [p2c_r, c2p_w]
        child_inputs = -1
        if device == "cpu":  # the input buffer: the parent writes it, the side may only read it
            self.inputs_fd = os.memfd_create("cuda-l1-inputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            child_inputs = os.open(f"/proc/self/fd/{self.inputs_fd}", os.O_RDONLY)
            passed.append(child_inputs)
        cmd = [sys.executable, "-u", "-m", "cuda_l1.evaluate.child", "--read-fd", str(p2c_r), "--write-fd", str(c2p_w),
               "--inputs-fd", str(child_inputs), "--device", device, "--plan", json.dumps(dataclasses.asdict(plan))]
        self.output = ChildOutput(config.log_bytes // 2, config.log_bytes - config.log_bytes // 2)
        fd = self.output.write_fd  # the side's stdout and stderr; the parent's copy is closed below
        try:
            self.proc = launch(cmd, config.fork_server, device, cmd[-1], p2c_r, c2p_w, child_inputs, fd, self.scratch,
                               scrubbed_env(self.scratch), config.preload_compilers)
        finally:
            for f in [fd] + passed:
                os.close(f)
        if group is not None:  # its own join lands milliseconds later, maybe while a window stops it
            with contextlib.suppress(OSError), open(group.procs_file, "w") as fh:
                fh.write(str(self.proc.pid))
        key = new_key()
        os.write(p2c_w, key)
        self.chan = Channel(c2p_r, p2c_w, key, is_parent=True, send_timeout=PARENT_SEND_TIMEOUT_S)
        return self

    # -- watching from outside --------------------------------------------------------------------
    def tree(self) -> list[int]:
        """Every process of this side (the namespace wrapper, the harness and all its descendants), as
        the kernel lists them: children of every thread, recursively."""
        if self.proc is None:
            return []
        return self.group.pids() if self._grouped() else sigstop.process_tree(self.proc.pid)

    def harness_pid(self) -> int | None:
        """The process running the harness: the one inside the namespaces when there are any."""
        if self.proc is None:
            return None
        if "pid" in self.notes.get("namespaces", "") and not self.notes["namespaces"].startswith("not"):
            if self._harness is None:
                self._harness = harness_under_init(self.proc.pid)
            return self._harness
        return self.proc.pid

    @property
    def freezer(self):
        """The cgroup the side's last freeze() went through (None: it was stopped by signals)."""
        return self.group if self._frozen_by_group else None

    def _grouped(self) -> bool:
        """Whether the side is in its cgroup (it joins first thing; the parent checks the kernel's list)."""
        if self.group is None or self.proc is None:
            return False
        if not self._in_group:
            self._in_group = self.proc.pid in self.group.pids()
        return self._in_group

    def cpu_ticks(self, pids: list[int] | None = None) -> int:
        """User + system CPU time of the tree, in clock ticks (threads that ended included)."""
        return sigstop.cpu_ticks(pids if pids is not None else self.tree())

    def memory_bytes(self) -> int:
        """Host memory the side holds (side_memory: owned, not page cache); its peak is kept."""
        used = None
        if self._grouped():
            used = self.group.owned_bytes()
        if used is None:
            own = os.fstat(self.inputs_fd).st_ino if self.inputs_fd >= 0 else None
            used = side_memory.tree_bytes(self.tree(), self.harness_pid(), self.notes.get("mounts", ""), self.scratch,
                                          own, self.shared_scan)
        self.peak_memory = max(self.peak_memory, used)
        return used

    def set_memory_limit(self, nbytes: int) -> bool:
        """Set the limit of a side not yet given work (a spare handed to a task: side_supply.py), up
        or down. False when it cannot change: a CPU side whose limit is an address-space limit fixed
        at its start (no cgroup counts its memory)."""
        counted = self.group is not None and self.group.memory_bytes() is not None
        if self.device == "cpu" and not counted:
            return nbytes == self.memory_limit
        self.memory_limit = nbytes  # the watchdog (watch) enforces it; the cgroup too where it counts
        if counted:
            self.group.limit_memory(nbytes + self.config.shm_bytes)
        return True

    def allow_memory(self, nbytes: int) -> None:
        """Raise the side's memory limit (never lower it): the task's reference turned out larger."""
        if nbytes > self.memory_limit:
            self.memory_limit = nbytes
            if self.group is not None:
                self.group.limit_memory(nbytes + self.config.shm_bytes)

    def watch(self) -> None:
        pids = self.tree()
        if len(pids) > self.config.max_processes:
            self.kill(f"started more than {self.config.max_processes} processes")
            raise ChildFailure("runtime_error", f"the side started more than {self.config.max_processes} processes")
        if sigstop.thread_count(pids) > self.config.max_threads:
            self.kill(f"started more than {self.config.max_threads} threads")
            raise ChildFailure("runtime_error", f"the side started more than {self.config.max_threads} threads")
        # A CPU ring stops the tree at a cost per live thread, taken off as the reference's: ending a harness
        # thread made a candidate's stops cheaper (corpus end_harness_thread; a stopped process kept the count).
        if ended := sigstop.ended_threads(self.harness_threads):
            self.kill("ended threads of its harness")
            raise ChildFailure("rejected", f"the side ended {len(ended)} of the {len(self.harness_threads)} threads "
                               "its harness had started")
        used = self.memory_bytes()
        if used > self.memory_limit:
            self.kill(f"used {used / 2**30:.1f} GiB of memory")
            raise ChildFailure("runtime_error", f"the side used more than {self.memory_limit / 2**30:.1f} GiB of host "
                               "memory (its limit on this task)")

    def freeze(self, timeout: float = 2.0) -> None:
        """Stop every process of the tree and wait until each of its threads is stopped."""
        self._frozen_by_group = self._grouped()  # thaw() undoes it alike (a group thaw ignores SIGSTOP)
        if self._frozen_by_group:
            if not self.group.freeze(timeout):
                self.kill("could not be stopped")
                raise ChildFailure("rejected", "the side could not be stopped between windows")
            self.frozen = set(self.group.pids()) or {self.proc.pid}
            self._frozen_ticks = self.group.cpu_usec()
            return
        if not sigstop.stop_tree(self.proc.pid, self.frozen, timeout):
            self.kill("could not be stopped")
            raise ChildFailure("rejected", "a process of the side could not be stopped between windows")
        self._frozen_ticks = self.cpu_ticks(sorted(self.frozen))

    def thaw(self) -> None:
        """Let the tree run again, after checking it did not run while stopped."""
        if not self.frozen:
            return
        if self.exit_info().reason != "running":  # killed while stopped (its exit moves the CPU clock)
            self.frozen = set()
            raise ChildFailure("runtime_error", self._death_message())
        if self._frozen_by_group:
            # 20 ms of slack: the kernel's accounting of the stop itself, which on a loaded host can
            # land after the group reads frozen (1 ms rejected an identical candidate there). A frozen
            # group cannot run; what this catches is a clock that moved by a window's worth.
            if self.group.cpu_usec() > self._frozen_ticks + 20_000:
                self.kill("ran while stopped")
                raise ChildFailure("rejected", "a process of the side ran while the side was stopped")
            self.group.thaw()
            self.frozen = set()
            return
        pids = self.tree()
        # A process forked while the tree was being stopped and gone by now is not seen here (the
        # namespace's ns_last_pid cannot be read from outside it: the kernel answers for the
        # reader's own namespace); the cgroup freezer has no such gap.
        if any(p not in self.frozen for p in pids) or self.cpu_ticks(sorted(self.frozen)) > self._frozen_ticks + 1:
            self.kill("ran while stopped")
            raise ChildFailure("rejected", "a process of the side ran while the side was stopped (it escaped the freeze)")
        sigstop.resume(self.frozen)
        self.frozen = set()

    def started(self) -> bool:
        """Whether the side is done starting (interpreter, torch, the device context): its harness reads
        the channel's key only after all of that. Only a spare's own harness code ran so far: trusted."""
        return self.chan is not None and unread_bytes(self.chan.write_fd) == 0

    # -- talking ----------------------------------------------------------------------------------
    def send(self, message) -> None:
        try:
            self.chan.send(protocol.encode(message))
        except ChannelTimeout:
            self.kill("stopped reading")
            raise ChildFailure("rejected", f"the side stopped reading the parent's messages for {PARENT_SEND_TIMEOUT_S:.0f} s") from None
        except (ChannelClosed, OSError):
            raise ChildFailure("runtime_error", self._death_message()) from None

    def recv(self, timeout: float, max_bytes: int = 64 << 20):
        """One message, decoded and validated, limits watched meanwhile; any failure is a ChildFailure."""
        return self.decode(self.recv_frame(timeout, max_bytes))

    def recv_frame(self, timeout: float, max_bytes: int = 64 << 20) -> bytes:
        """Wait for one whole frame (its bytes only; decode() checks them)."""
        deadline = time.monotonic() + timeout
        self.chan.max_frame_bytes = max_bytes
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill("timed out")
                raise ChildFailure("timeout", f"no answer within {timeout:.0f} s")
            try:
                return self.chan.recv_frame(timeout=min(remaining, 0.25))
            except ChannelTimeout:
                self.watch()
            except ChannelClosed:
                raise ChildFailure("runtime_error", self._death_message()) from None
            except ChannelError as exc:
                self.kill("broke the protocol")
                raise ChildFailure("rejected", f"the side sent an invalid frame ({exc})") from None

    def decode(self, frame: bytes, expect: type | None = None, max_calls: int | None = None):
        """Authenticate, parse and validate a frame from recv_frame into its message (validate.decode)."""
        try:
            reply = validate.decode(self.chan.parse(frame).header, from_side=True, max_calls=max_calls)
        except (ChannelError, protocol.ProtocolError) as exc:
            self.kill("broke the protocol")
            what = "frame" if isinstance(exc, ChannelError) else "message"
            raise ChildFailure("rejected", f"the side sent an invalid {what} ({exc})") from None
        if expect is not None and not isinstance(reply, expect):
            self.kill("broke the protocol")
            raise ChildFailure("rejected", f"the side answered {type(reply).__name__} where {expect.__name__} was due")
        return reply

    def request(self, message, timeout: float, expect: type):
        self.send(message)
        return self.decode(self.recv_frame(timeout), expect)

    # -- ending -----------------------------------------------------------------------------------
    def _death_message(self) -> str:
        info = self.exit_info(wait=2.0)
        if self.group is not None and self.group.oom_killed():
            return f"the side used more than {self.memory_limit / 2**30:.1f} GiB of memory (killed at the limit)"
        if info.signal:
            name = signal.Signals(info.signal).name if info.signal in signal.Signals._value2member_map_ else str(info.signal)
            return f"the side's process died with signal {name}"
        if info.returncode == CONFINEMENT_FAILED and not self.notes:  # before its Confined report: not the module's own exit
            return "the sandbox could not be applied in the side: " + self.log_tail(settle=1.0).strip()[-400:]
        if info.returncode is not None:
            return f"the side's process exited with code {info.returncode} before answering"
        return "the side's process closed its channel"

    def exit_info(self, wait: float = 0.0) -> ExitInfo:
        if self.proc is None:
            return ExitInfo(None, None, "not started")
        try:
            code = self.proc.wait(timeout=wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return ExitInfo(None, None, "running")
        if code < 0:
            return ExitInfo(code, -code, "exited")
        if code > 128 and "pid" in self.notes.get("namespaces", "") and not self.notes["namespaces"].startswith("not"):
            return ExitInfo(code, code - 128, "exited")  # the namespace wrapper mirrors a signal death as 128+N
        return ExitInfo(code, None, "exited")

    def kill(self, why: str = "") -> None:
        if why and not self.killed_for:
            self.killed_for = why
        if self.proc is None:
            return
        if self.group is not None:
            self.group.kill()
        for _ in range(3):
            pids = self.tree()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            if self.proc.poll() is not None and len(self.tree()) <= 1:
                break
            time.sleep(0.02)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel
            pass
        self.frozen = set()

    def close(self, graceful: bool = True) -> str:
        """End the side (politely first), kill anything left, remove its scratch directory, and
        return what it printed (its first and last bytes)."""
        if self.proc is not None and self.proc.poll() is None and graceful and not self.killed_for:
            try:
                if self.frozen:
                    self.thaw()
                self.chan.send_timeout = 1.0  # a side that stopped reading is killed below
                self.chan.send({"op": "bye"})
                self.proc.wait(timeout=5)
            except (ChannelError, OSError, subprocess.TimeoutExpired, ChildFailure):
                pass
        self.kill()
        if self.chan is not None:
            self.chan.close()
        if self.inputs_fd >= 0:
            os.close(self.inputs_fd)
            self.inputs_fd = -1
        if self.group is not None:
            self.group.remove()
            self.group = None
        log = self.output.close() if self.output is not None else ""
        scratch_dirs.remove(self.scratch, keep=self.config.keep_scratch)
        if hasattr(self.proc, "release"):  # forked by the fork server, which may now reap it
            self.proc.release()
        return log

    def log_tail(self, settle: float = 0.0) -> str:
        """What the side printed so far (its first and last bytes); `settle`: first wait up to this many
        seconds for the end of its output (a side that has exited: what it wrote last may still be in
        the pipe)."""
        if self.output is None:
            return ""
        self.output.settle(settle)
        return self.output.text()
