"""Identical code, timed with both sides forked from the compilers' stage ('same') or the reference's
side from the first stage and the candidate's from the compilers' stage ('mixed').

    PYTHONPATH=src python3 benchmarks/results/2026-12-05-cpu-staged-fork-server/stage_mix.py {mixed|same} REFERENCE.py
"""
import json, sys, time
from cuda_l1.evaluate import fork_server
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.tasks import make_task

ref_path = sys.argv[2]
src = open(ref_path).read()
ident = src.replace("class Model(", "class ModelNew(")
mode = sys.argv[1]
server = fork_server.shared()
if mode == "same":
    assert server.wait_compilers()
cfg = EvalConfig(device="cpu", prewarm=False)

task = make_task(src, name="1_x", level=1, origin="test:x")
ev = Evaluator(task, cfg)
server.wait_compilers()
v = ev.evaluate(ident)
ref = ev.env.ref.proc.proc if getattr(ev, "env", None) and ev.env.ref else None
print(json.dumps({"mode": mode, "status": v.status, "raw": round(v.raw_speedup or 0, 4), "score": v.speedup,
                  "cand_preloaded": v.sandbox.get("preloaded"),
                  "ref_stage": (None if ref is None else ("compilers" if ref.server is server.compilers else "first"))}))
ev.close()
