"""The inference-time optimizer: CUDA-L1's contrastive loop against any OpenAI-compatible model.

Each task starts from the offline strategies (eager, torch.compile, CUDA graphs), evaluated first so
the model's first prompt already contrasts eager with compiled code. Then, per task and within a
budget of completions, the loop shows the model earlier correct variants with their measured
speedups and the latest failures, asks it to explain why the faster ones are faster and to write a
faster one, evaluates the answer in the sandboxed evaluator, and writes the verdict back to the
history that the next prompt draws from.

    from cuda_l1.search import SearchConfig, run_optimize
    result = run_optimize("builtin", "runs/opt", endpoints=[cfg], config=SearchConfig(budget=16))

Modules: `config` (settings), `loop` (the asyncio loop), `run` (strategies, loop, outputs),
`ledger` (per-run counts and the event log), `secrets` (keeping keys away from workers), `display`.
"""

from cuda_l1.search.search_config import EVENTS_NAME, RUN_NAME, SOLUTIONS_NAME, SearchConfig
from cuda_l1.search.run import NO_ENDPOINT_HINT, run_optimize

__all__ = ["EVENTS_NAME", "NO_ENDPOINT_HINT", "RUN_NAME", "SOLUTIONS_NAME", "SearchConfig", "run_optimize"]
