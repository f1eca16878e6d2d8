"""cuda-l1: LLM-driven, contrastive-RL CUDA optimization of PyTorch modules, with an evaluator that
cannot be gamed. An open implementation of CUDA-L1 (arXiv 2507.14111)."""

# 0.2: exact candidate ids (store schema 2). A Ray worker of 0.1 would file no verdict: ray_pool warns on a mismatch.
__version__ = "0.2.0"
