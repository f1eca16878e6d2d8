"""Whether torch.compile's modules can be imported in the fork server (fork_server.py) on this host.

The fork server imports torch once and forks every side from it; it must start no thread and must
not initialise the CUDA driver, or forked sides cannot use the device. A candidate that calls
torch.compile spends about 3 s importing Dynamo and Inductor in its own side (3.1 s on a 2-core CPU
host). This script imports them as the server would, then forks a child that runs CUDA work and a
torch.compile'd function, and prints one JSON line:

    python benchmarks/fork_compiler_import.py [--modules torch._dynamo,torch._inductor.compile_fx]

`fork_safe` true (threads 1, CUDA not initialised, the child's device work and compile done) is what
moving the import into the fork server needs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", default="torch._dynamo,torch._inductor.compile_fx",
                        help="comma-separated modules the server would import after torch")
    modules = [m for m in parser.parse_args().modules.split(",") if m]
    start = time.perf_counter()
    import torch

    imported_torch = time.perf_counter()
    for name in modules:
        importlib.import_module(name)
    imported = time.perf_counter()
    result = {"modules": modules, "import_torch_s": round(imported_torch - start, 2), "import_compiler_s": round(imported - imported_torch, 2),
              "python_threads": threading.active_count(), "os_threads": len(os.listdir("/proc/self/task")),
              "torch_cuda_initialized": torch.cuda.is_initialized()}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        child: dict = {}
        try:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            x = torch.ones(1 << 20, device=device) + 1
            t = time.perf_counter()
            y = torch.compile(lambda v: torch.relu(v) * 2)(x)
            if device == "cuda":
                torch.cuda.synchronize()
            child = {"device": device, "ok": bool(float(y.sum()) == 4.0 * x.numel()),
                     "compile_and_first_call_s": round(time.perf_counter() - t, 2)}
        except Exception as exc:  # noqa: BLE001 - what failed is the finding
            child = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        os.write(write, json.dumps(child).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    result["child"] = json.loads(text) if text else {"ok": False, "error": "the child wrote nothing"}
    result["fork_safe"] = (result["python_threads"] == 1 and not result["torch_cuda_initialized"]
                           and result["child"].get("ok", False))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
