"""The trust boundary: the parent's side of a sandboxed child that runs one candidate.

What the parent guarantees, whatever the candidate does:
- the candidate runs in a separate process started from a clean interpreter, in a fresh scratch
  directory, with an environment built from an allow-list (no keys, tokens, secrets, passwords, and no
  HF/OpenAI/AWS/... variables at all);
- it talks to the parent only through a private, authenticated channel (channel.py); its stdout and
  stderr go to a log file that is read back as text and never parsed for results;
- wall-clock deadlines for every request, a resident-memory limit and a process-count limit are
  watched from outside; on any breach, and at the end of every evaluation, the whole process group is
  killed (and, where namespaces are available, the PID namespace dies with the harness);
- the process tree and thread count of the child are read from /proc by the parent itself, so a
  candidate cannot hide work left running after a call by lying about it.
The child confines itself further before importing the candidate (confine.py: namespaces, Landlock,
rlimits) and reports what was enforced; the verdict carries that report.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from cuda_l1.evaluate.channel import Channel, ChannelClosed, ChannelError, ChannelTimeout, Message, new_key

# Variables a child may inherit; everything else is dropped. Even these are dropped if their name
# looks like a credential.
_ENV_ALLOW = re.compile(
    r"^(PATH|LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|PYTHONPATH|PYTHONHASHSEED|LD_LIBRARY_PATH|CUDA_HOME|CUDA_PATH|"
    r"CUDA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER|CUDA_MODULE_LOADING|NVIDIA_[A-Z_]+|TORCH_CUDA_ARCH_LIST|"
    r"OMP_NUM_THREADS|MKL_NUM_THREADS|NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)$"
)
_SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT|^AWS_|^HF_|^HUGGING|^OPENAI|"
    r"^ANTHROPIC|^AZURE|^GOOGLE|^GCP|^GITHUB|^GH_|^WANDB|^DEEPSEEK|^MISTRAL|^COHERE|^TOGETHER|^GROQ)",
    re.IGNORECASE,
)


def scrubbed_env(scratch: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _ENV_ALLOW.match(k) and not _SECRET_NAME.search(k)}
    env.update(
        HOME=scratch,
        TMPDIR=scratch,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        PYTHONNOUSERSITE="1",
        TRITON_CACHE_DIR=os.path.join(scratch, "triton"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(scratch, "inductor"),
        TORCH_EXTENSIONS_DIR=os.path.join(scratch, "torch_extensions"),
        # Inductor's compile workers would outlive a call; compile in-process instead.
        TORCHINDUCTOR_COMPILE_THREADS="1",
        XDG_CACHE_HOME=os.path.join(scratch, "cache"),
    )
    if "PATH" not in env:
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    for k, v in (extra or {}).items():
        if not _SECRET_NAME.search(k):
            env[k] = v
    return env


@dataclass
class SandboxConfig:
    """Limits and isolation layers for one candidate child."""

    namespaces: bool = True  # new PID + network namespace when the platform allows
    landlock: bool = True  # filesystem (and TCP) confinement when the kernel allows
    memory_bytes: int = 16 * 2**30  # resident memory of the child's process tree
    max_processes: int = 32  # processes in the child's session (fork bombs end here)
    cpu_seconds: int = 3600  # RLIMIT_CPU
    file_bytes: int = 512 * 2**20  # RLIMIT_FSIZE: largest file the child may write
    open_files: int = 4096  # RLIMIT_NOFILE
    log_bytes: int = 16_000  # how much of the child's output the verdict keeps
    scratch_root: str | None = None  # where scratch directories are made (default: the system temp dir)
    keep_scratch: bool = False  # keep the scratch directory for debugging


_NAMESPACES: dict[str, str] = {}


def usable_namespaces(device: str | None) -> str:
    """The strongest namespace set in which this device still initialises (probed once per device):
    some GPU drivers refuse to start inside a new PID namespace, for one."""
    key = device or "cpu"
    if key not in _NAMESPACES:
        from cuda_l1.evaluate.confine import NAMESPACE_SETS

        chosen = ""
        for which in NAMESPACE_SETS:
            probe = subprocess.run([sys.executable, "-m", "cuda_l1.evaluate.confine", "probe", which, key],
                                   env=scrubbed_env(tempfile.gettempdir()), capture_output=True, timeout=120)
            if probe.returncode == 0:
                chosen = which
                break
        _NAMESPACES[key] = chosen
    return _NAMESPACES[key]


@dataclass
class ExitInfo:
    returncode: int | None
    signal: int | None
    reason: str  # "exited", "killed: <why>", "running"


class ChildFailure(Exception):
    """The child broke the protocol: died, hung, exceeded a limit, or sent garbage."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" | "runtime_error"


def _read_proc(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read_proc(f"/proc/{entry}/stat")
        if not stat:
            continue
        try:
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == sid:  # field 6 of /proc/PID/stat: session id
                pids.append(int(entry))
        except (ValueError, IndexError):
            continue
    return pids


def _rss_bytes(pid: int) -> int:
    for line in _read_proc(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class ChildProcess:
    """One sandboxed harness process and its channel."""

    config: SandboxConfig
    proc: subprocess.Popen | None = None
    chan: Channel | None = None
    scratch: str = ""
    log_path: str = ""
    killed_for: str = ""
    notes: dict = field(default_factory=dict)

    @classmethod
    def start(cls, config: SandboxConfig, env_extra: dict[str, str] | None = None,
              device: str | None = None) -> "ChildProcess":
        self = cls(config)
        self.scratch = tempfile.mkdtemp(prefix="cuda-l1-", dir=config.scratch_root)
        os.chmod(self.scratch, 0o700)
        fd, self.log_path = tempfile.mkstemp(prefix="cuda-l1-log-", suffix=".txt")
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        cmd = [sys.executable, "-u", "-m", "cuda_l1.evaluate.child",
               "--read-fd", str(p2c_r), "--write-fd", str(c2p_w)]
        which = usable_namespaces(device) if config.namespaces and sys.platform.startswith("linux") else ""
        if which:
            cmd += ["--namespaces", which]
        if device:
            cmd += ["--device", device]
        try:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.scratch,
                env=scrubbed_env(self.scratch, env_extra),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                pass_fds=(p2c_r, c2p_w),
                start_new_session=True,  # its own process group and session: killed as a whole
                close_fds=True,
            )
        finally:
            os.close(fd)
            os.close(p2c_r)
            os.close(c2p_w)
        key = new_key()
        os.write(p2c_w, key)
        self.chan = Channel(c2p_r, p2c_w, key, is_parent=True)
        return self

    # -- watching from outside --------------------------------------------------------------------
    def session_pids(self) -> list[int]:
        if self.proc is None:
            return []
        return _session_pids(self.proc.pid)

    def harness_pid(self) -> int | None:
        """The process running the harness: the child itself, or its only child inside namespaces."""
        if self.proc is None:
            return None
        children = _read_proc(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").split()
        if "pid" in self.notes.get("namespaces", "") and not self.notes["namespaces"].startswith("not") and children:
            return int(children[0])
        return self.proc.pid

    def tree(self) -> dict:
        """Threads of the harness and the processes it started, as the kernel sees them."""
        hpid = self.harness_pid()
        if hpid is None:
            return {"threads": 0, "processes": []}
        threads = len(os.listdir(f"/proc/{hpid}/task")) if os.path.isdir(f"/proc/{hpid}/task") else 0
        descendants, frontier = [], [hpid]
        while frontier:
            pid = frontier.pop()
            for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
                for child in _read_proc(f"/proc/{pid}/task/{task}/children").split():
                    descendants.append(int(child))
                    frontier.append(int(child))
        names = [(_read_proc(f"/proc/{p}/comm").strip() or "?") for p in descendants]
        return {"threads": threads, "processes": names}

    def _watch(self) -> None:
        pids = self.session_pids()
        if len(pids) > self.config.max_processes:
            self.kill(f"started more than {self.config.max_processes} processes")
            raise ChildFailure("runtime_error", f"the candidate started more than {self.config.max_processes} processes")
        rss = sum(_rss_bytes(p) for p in pids)
        if rss > self.config.memory_bytes:
            self.kill(f"used {rss / 2**30:.1f} GiB of memory")
            raise ChildFailure("runtime_error", f"the candidate used more than {self.config.memory_bytes / 2**30:.1f} GiB of memory")

    # -- talking ----------------------------------------------------------------------------------
    def send(self, header: dict, blobs: list[bytes] | None = None) -> None:
        try:
            self.chan.send(header, blobs)
        except (ChannelClosed, OSError):
            raise ChildFailure("runtime_error", self._death_message()) from None

    def recv(self, timeout: float, max_bytes: int | None = None) -> Message:
        """Wait for one frame, watching limits; any failure becomes a ChildFailure."""
        deadline = time.monotonic() + timeout
        if max_bytes is not None:
            self.chan.max_frame_bytes = max_bytes
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill("timed out")
                raise ChildFailure("timeout", f"no answer within {timeout:.0f} s")
            try:
                return self.chan.recv(timeout=min(remaining, 0.25))
            except ChannelTimeout:
                self._watch()
            except ChannelClosed:
                raise ChildFailure("runtime_error", self._death_message()) from None
            except ChannelError as exc:
                self.kill("broke the protocol")
                raise ChildFailure("runtime_error", f"the child sent an invalid message ({exc})") from None

    def request(self, header: dict, timeout: float, max_bytes: int | None = None) -> Message:
        self.send(header)
        return self.recv(timeout, max_bytes)

    # -- ending -----------------------------------------------------------------------------------
    def _death_message(self) -> str:
        info = self.exit_info(wait=2.0)
        if info.signal:
            name = signal.Signals(info.signal).name if info.signal in signal.Signals._value2member_map_ else str(info.signal)
            return f"the candidate process died with signal {name}"
        if info.returncode is not None:
            return f"the candidate process exited with code {info.returncode} before answering"
        return "the candidate process closed its channel"

    def exit_info(self, wait: float = 0.0) -> ExitInfo:
        if self.proc is None:
            return ExitInfo(None, None, "not started")
        try:
            code = self.proc.wait(timeout=wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return ExitInfo(None, None, "running")
        # The namespace wrapper mirrors a signal death as 128+N.
        if code < 0:
            return ExitInfo(code, -code, "exited")
        if code > 128 and "pid" in self.notes.get("namespaces", "") and not self.notes["namespaces"].startswith("not"):
            return ExitInfo(code, code - 128, "exited")
        return ExitInfo(code, None, "exited")

    def kill(self, why: str = "") -> None:
        if why and not self.killed_for:
            self.killed_for = why
        if self.proc is None:
            return
        for _ in range(3):
            pids = self.session_pids()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for pid in pids:  # anything that left the process group but not the session
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if not self.session_pids():
                break
            time.sleep(0.02)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel
            pass

    def close(self, graceful: bool = True) -> str:
        """End the child (politely first), kill anything left, remove the scratch directory, and
        return the tail of its log."""
        if self.proc is not None and self.proc.poll() is None and graceful and not self.killed_for:
            try:
                self.chan.send({"op": "bye"})
                self.proc.wait(timeout=5)
            except (ChannelClosed, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if self.chan is not None:
            self.chan.close()
        log = self.log_tail()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass
        if not self.config.keep_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return log

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - self.config.log_bytes))
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
