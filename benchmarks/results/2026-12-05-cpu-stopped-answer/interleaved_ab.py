"""Identical code over the built-in suite with or without the side stopped while the parent answers
its rings: `interleaved_ab.py {nostop|stop} ARGS...`, ARGS being benchmarks/identical_suite.py's own.
Run from the repository root with the package importable."""
import runpy
import sys

from cuda_l1.evaluate import gating

if sys.argv[1] == "nostop":
    gating.STOP_BYTES = 1 << 62  # no slot is this large: the side is never stopped during an answer
sys.argv = ["identical_suite.py"] + sys.argv[2:]
runpy.run_path("benchmarks/identical_suite.py", run_name="__main__")
