"""What the reference's meta-device footprint costs the parent on its first use: torch's Python
decompositions import torch._dynamo then (tasks.runtime.module_footprint, called by TaskEnv).

    PYTHONPATH=src python3 benchmarks/results/2026-12-05-cpu-staged-fork-server/footprint_import.py REFERENCE.py
"""
import json
import sys
import time

import torch  # noqa: F401 - imported first: not part of what is measured

from cuda_l1.tasks import make_task
from cuda_l1.tasks.runtime import load_task_module, module_footprint

source = open(sys.argv[1]).read()
module = load_task_module(make_task(source, name="1_x", level=1, origin="x"), module_name="footprint_probe")
dynamo_before = "torch._dynamo" in sys.modules
started = time.perf_counter()
module_footprint(module)
first = time.perf_counter() - started
started = time.perf_counter()
module_footprint(module)
print(json.dumps({"dynamo_imported_before": dynamo_before, "dynamo_imported_after": "torch._dynamo" in sys.modules,
                  "first_s": round(first, 3), "second_s": round(time.perf_counter() - started, 4)}))
