"""Scratch directories are removed when the parent exits without closing their sides, and a process
forked from the parent (a fork server, a side) removes none of them when it exits."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_scratch_directory_left_open_is_removed_at_exit_but_not_by_a_forked_child(tmp_path):
    script = f"""
import os, sys
from cuda_l1.evaluate import scratch_dirs
path = scratch_dirs.make({str(tmp_path)!r})
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a forked child's exit runs the atexit handlers it inherited
os.waitpid(pid, 0)
print(path, os.path.isdir(path))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    path, after_child = out[0], out[1]
    assert after_child == "True"  # the child removed nothing of its parent's
    assert not os.path.exists(path)  # the parent's exit removed what it never closed
