"""cuda-l1: LLM-driven, contrastive-RL CUDA optimization of PyTorch modules, with an evaluator that
cannot be gamed. An open implementation of CUDA-L1 (arXiv 2507.14111)."""

__version__ = "0.1.0"
