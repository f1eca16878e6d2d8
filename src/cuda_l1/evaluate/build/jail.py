"""Run one compiler command confined: the sources it compiles come from candidates.

    python -m cuda_l1.evaluate.build.jail --write DIR [--read DIR ...] -- nvcc ...

The build layer compiles candidate sources in the trusted process's name, and a source can make a
compiler read any file (`#include "/home/me/.aws/credentials"` in any of the spellings the
preprocessor accepts, or an assembler `.incbin`), then show it in an error message or embed it in the
library. Checking the text cannot catch every spelling; confining the compiler can. Before it execs
the command this launcher restricts itself with Landlock (inherited by the compiler and everything it
starts): reads below system, Python and toolchain directories and the build cache only, writes only
in the build's own directory, no TCP; file sizes and address space limited by rlimits. Where Landlock
is missing the command runs as before and the build log says so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cuda_l1.evaluate.build.jail")
    parser.add_argument("--write", action="append", default=[], help="a directory the command may write")
    parser.add_argument("--read", action="append", default=[], help="an extra directory the command may read")
    parser.add_argument("--max-file-bytes", type=int, default=0, help="RLIMIT_FSIZE for the command (0: none)")
    parser.add_argument("--max-memory-bytes", type=int, default=0, help="RLIMIT_AS for the command (0: none)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    # A compiler runs what a candidate's source asks of it: on a host out of memory, the kernel takes it
    # before the evaluator (the sides, at 1000, go first; confine.ConfinePlan.oom_score_adj), and never
    # after it (an evaluator already above 500, a container's own score, keeps its compilers above it
    # too). Set before Landlock, which keeps /proc/self from the command.
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/oom_score_adj") as fh:
            current = int(fh.read())
        if current < 500:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("500")
    from cuda_l1.evaluate import landlock

    ok, note = landlock.apply_landlock(landlock.default_read_paths(args.read + args.write),
                                       args.write + ["/dev/null"], list_paths=landlock.import_path_dirs())
    if not ok:
        print(f"[build jail not enforced: {note}]", file=sys.stderr, flush=True)
    # Limits on what the source can make its compilers do (a file of a GiB, a template bomb's memory);
    # past them the compiler fails (a write past the file limit kills it: SIGXFSZ, which Python
    # ignores and an exec would pass on ignored, is put back to its default).
    if args.max_file_bytes > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.max_file_bytes, args.max_file_bytes))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    if args.max_memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (args.max_memory_bytes, args.max_memory_bytes))
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cannot run {command[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(127)


if __name__ == "__main__":
    main()
