"""One command at a time in a run directory.

Two commands given the same `--out` (a bench started twice, an audit beside a bench) both ran: each judged
the same programs again, their timings disturbed each other, and both wrote to one store. A run
directory is now held by the command writing to it: an advisory lock on `.lock` in it, which the kernel
lets go when the process ends however it ends, so a killed run leaves nothing stale to clean up.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from cuda_l1.errors import UserError

LOCK_NAME = ".lock"


class RunLock:
    """Held from `acquire` until `release` (or the process's end)."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    @classmethod
    def acquire(cls, run_dir: Path) -> "RunLock":
        path = Path(run_dir) / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            who = f" (process {holder})" if holder.isdigit() else ""
            raise UserError(f"another cuda-l1 command{who} is writing to the run directory {run_dir}; wait for it "
                            "to end, or give this one another --out") from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # (the lock goes with the descriptor; the file stays, empty of meaning)
            self.fd = -1
