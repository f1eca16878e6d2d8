"""Which tasks have a float64 oracle: each reference's float64 copy run on the meta device (shapes and
dtypes only, no memory, no arithmetic), as the oracle ran before `oracle_run.py` (the plain forward) and
as it runs now (forward_in_float64). A task whose float64 run raises is judged at KernelBench's 1e-2
tolerance only. A script, not a test:

    python benchmarks/oracle_coverage.py .data/KernelBench/KernelBench --levels 1,2,3 --out OUT.json

Meta tensors raise the same dtype errors as real ones; a forward that needs real values (data-dependent
shapes, `.item()`, host tensors made without a device) cannot run there and is counted apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

from cuda_l1.evaluate.inputs import double_model, to_double  # noqa: E402
from cuda_l1.evaluate.oracle_run import forward_in_float64  # noqa: E402
from cuda_l1.tasks.loaders import load_tasks  # noqa: E402
from cuda_l1.tasks.runtime import load_task_module  # noqa: E402

DTYPE_WORDS = ("dtype", "Double", "double", "Float", "float")


def judge(task) -> dict:
    try:
        module = load_task_module(task, module_name=f"oracle_cov_{task.id}")
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
            inputs = [to_double(x) for x in module.get_inputs()]
        doubled = double_model(model, "meta")
    except Exception as exc:  # noqa: BLE001 - a task that cannot be built on meta is counted apart
        return {"result": "not on meta", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    before = after = None
    try:
        with torch.no_grad():
            doubled(*inputs)
        before = "ok"
    except Exception as exc:  # noqa: BLE001
        before = f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        with torch.no_grad():
            out = forward_in_float64(doubled, inputs)
        leaves = out if isinstance(out, (tuple, list)) else [out]
        narrow = [str(t.dtype) for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()
                  and t.dtype != torch.float64]
        after = "ok" if not narrow else f"ok, outputs not float64: {narrow}"
    except Exception as exc:  # noqa: BLE001
        after = f"{type(exc).__name__}: {str(exc)[:200]}"
    dtype_error = before != "ok" and any(w in before for w in DTYPE_WORDS)
    return {"result": "ran", "before": before, "after": after, "dtype_error_before": dtype_error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a KernelBench checkout's KernelBench/ folder (or any task source)")
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    levels = {int(x) for x in args.levels.split(",")}
    tasks = load_tasks(args.source, levels)
    rows = {}
    for task in tasks:
        try:
            rows[task.key] = judge(task)
        except Exception:  # noqa: BLE001 - one task's surprise is a row, not the end of the survey
            rows[task.key] = {"result": "error", "error": traceback.format_exc()[-300:]}
    ran = {k: v for k, v in rows.items() if v["result"] == "ran"}
    summary = {
        "tasks": len(rows),
        "ran_on_meta": len(ran),
        "oracle_before": sum(v["before"] == "ok" for v in ran.values()),
        "oracle_now": sum(v["after"].startswith("ok") for v in ran.values()),
        "gained": sorted(k for k, v in ran.items() if v["before"] != "ok" and v["after"].startswith("ok")),
        "still_without": {k: v["after"] for k, v in ran.items() if not v["after"].startswith("ok")},
        "not_on_meta": {k: v.get("error", "") for k, v in rows.items() if v["result"] != "ran"},
    }
    Path(args.out).write_text(json.dumps({"environment": environment(), "command": " ".join(sys.argv),
                                          "summary": summary, "tasks": rows}, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "not_on_meta"}, indent=2))
    print(f"not on meta: {len(summary['not_on_meta'])}")


if __name__ == "__main__":
    main()
