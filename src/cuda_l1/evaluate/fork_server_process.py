"""The fork server's own process (fork_server.py is the parent's half): imports torch and the harness
once, then forks a side per request and reports each side's exit without reaping it.

Run as `python -m cuda_l1.evaluate.fork_server_process FD [MODULES COMPILERS_FD]` under a scrubbed
environment, FD a SOCK_SEQPACKET socket to the parent. With MODULES (comma-separated: torch.compile's)
the server starts in two stages: once torch and the harness are imported it forks a second server
that imports MODULES (where fork_preload.py finds that safe) and then serves on COMPILERS_FD, while
this one says it is ready at once and serves on FD. Sides asked for before the second stage is ready
start from the first, without the compilers, instead of waiting for their import.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import tempfile
import threading

from cuda_l1.evaluate import fork_preload

MAX_MESSAGE = 1 << 20  # a request (environment and plan) or a report, as JSON
SIDE_NAME = b"cuda-l1-side"  # a forked side's process name (/proc/PID/comm)


def _returncode(info) -> int:
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _become_side(request: dict, fds: list[int], keep_out: list[int]) -> None:
    """In the forked child: the side's descriptors, session, directory and environment, then the
    harness, exactly as a fresh side runs it. Never returns."""
    code = 1
    try:
        for fd in keep_out:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        # Named for what it is (its command line is still the server's): `ps`, tests, an operator.
        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(SIDE_NAME), 0, 0, 0)  # PR_SET_NAME
        read_fd, write_fd, log_fd = fds[0], fds[1], fds[2]
        inputs_fd = fds[3] if request.get("inputs") else -1
        probe = request.get("probe")  # a confinement probe (probe.py): it talks on stdin and stdout
        if probe is not None:
            os.dup2(read_fd, 0)
            os.dup2(write_fd, 1)
            read_fd, write_fd = 0, 1
        else:
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        keep = {0, 1, 2, read_fd, write_fd} | ({inputs_fd} if inputs_fd >= 0 else set())
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for fd in (read_fd, write_fd, inputs_fd):
            if fd >= 0:
                os.set_inheritable(fd, True)
        server_dir = os.getcwd()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # What a fresh interpreter in the side's directory would have: its directory first on the
        # import path (`python -m` put the server's there) and a temp directory from TMPDIR (torch's
        # import made tempfile settle on the server's).
        sys.path[:] = [request["cwd"] if p in (server_dir, "") else p for p in sys.path]
        tempfile.tempdir = None
        fork_preload.into_side()
        from cuda_l1.evaluate import child

        probing = [] if probe is None else ["--probe"] + (["--probe-handle", str(probe)] if probe else [])
        child.main(["--read-fd", str(read_fd), "--write-fd", str(write_fd), "--inputs-fd", str(inputs_fd),
                    "--device", request["device"], "--plan", request["plan"]] + probing)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the log says why
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(sock: socket.socket, modules: tuple[str, ...] = (), compilers: socket.socket | None = None) -> None:
    """Import torch and the harness, then serve forks on `sock`; with `compilers`, first fork the
    second stage, which imports `modules` and serves on that socket (see the module's docstring)."""
    from cuda_l1.evaluate.confine import die_with_parent

    die_with_parent()
    import torch  # noqa: F401 - what every side would import: once, here

    from cuda_l1.evaluate import child, inputs, warmup  # noqa: F401
    from cuda_l1.tasks import runtime  # noqa: F401

    # A forked child has the forking thread only, whatever else runs here. Native pools (numpy's
    # BLAS starts one at import) stop themselves around fork (pthread_atfork); a Python thread would
    # leave its state behind half-done, so there must be none.
    if threading.active_count() != 1:
        print("cuda-l1 fork server: a Python thread runs beside the server; nothing is forked",
              file=sys.stderr, flush=True)
        os._exit(2)
    if compilers is None:
        _serve_forks(sock, modules)
        return
    first = os.getpid()
    second = os.fork()
    if second == 0:  # the second stage: it dies with the first, whose child it is
        code = 0
        try:
            sock.close()
            die_with_parent()
            if os.getppid() != first:  # the first stage died before the request above took effect
                os._exit(0)
            _serve_forks(compilers, modules)
        except BaseException:  # noqa: BLE001 - the log says why; the parent sees the socket close
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    compilers.close()
    _serve_forks(sock, (), second_stage=second)


def _serve_forks(sock: socket.socket, modules: tuple[str, ...], second_stage: int | None = None) -> None:
    """Preload `modules` (where safe), say so, then fork a side per request until the parent goes.
    `second_stage`: the pid of the server forked to preload (never reaped here, so the pid stays its
    own: the parent may ask this one to end it)."""
    why = fork_preload.preload(modules) if modules else ""
    if why:  # what was imported cannot be taken back: this server forks nothing
        print(f"cuda-l1 fork server: preload refused: {why}", file=sys.stderr, flush=True)
        sock.send(json.dumps({"op": "preload_refused", "why": why}).encode())
        os._exit(3)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    live: set[int] = set()  # forked, not yet reported as exited
    released: set[int] = set()  # the parent is done with them: reap on exit
    gc.freeze()  # what the server holds stays shared: a side's collections do not copy its pages
    sock.send(json.dumps({"op": "ready", "preloaded": list(modules), "pid": os.getpid()}).encode())
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        for pid in list(live):  # report exits without reaping: the pid stays the parent's to signal
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # gone already (cannot happen: only this loop reaps)
                info = None
                live.discard(pid)
            if info is None:
                continue
            live.discard(pid)
            if pid in released:  # the parent is done with it: reap, nothing to report
                os.waitpid(pid, 0)
                released.discard(pid)
                continue
            sock.send(json.dumps({"op": "exited", "pid": pid, "returncode": _returncode(info)}).encode())
        if sock not in ready:
            continue
        fds = array.array("i")
        data, ancdata, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(8 * fds.itemsize))
        if not data:
            return  # the parent is gone: the sides die with this process (their parent-death signal)
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        request = json.loads(data)
        if request["op"] == "end_second_stage":  # it hangs in its preload: the parent gave up on it
            for fd in fds:
                os.close(fd)
            if second_stage is not None:
                with contextlib.suppress(OSError):
                    os.kill(second_stage, signal.SIGKILL)
            continue
        if request["op"] == "release":
            pid = int(request["pid"])
            if pid in live:
                released.add(pid)  # still running: reaped when it exits
            else:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"op": "spawned", "id": request["id"], "error": f"fork failed: {exc}"}).encode())
            continue
        if pid == 0:
            _become_side(request, list(fds), keep_out=[sock.fileno(), wake_r, wake_w])
        for fd in fds:
            os.close(fd)
        live.add(pid)
        sock.send(json.dumps({"op": "spawned", "id": request["id"], "pid": pid}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])), tuple(m for m in (sys.argv[2:3] or [""])[0].split(",") if m),
          socket.socket(fileno=int(sys.argv[3])) if len(sys.argv) > 3 else None)
