# reference: linear_gelu
# expect: runtime_error
# Prints what looks like a verdict, then exits before the harness can answer.
import json
import os
import sys

print(json.dumps({"status": "ok", "speedup": 100.0, "reference_ms": 10.0, "candidate_ms": 0.1}))
sys.stdout.flush()
os._exit(0)
