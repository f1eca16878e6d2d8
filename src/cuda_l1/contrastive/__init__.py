"""Contrastive optimisation: exemplar sampling by speedup bucket, prompts, and completion parsing."""

from cuda_l1.contrastive.parse import ParseResult, parse_completion
from cuda_l1.contrastive.prompt import RULES, Exemplar, Failure, build_prompt
from cuda_l1.contrastive.sampler import (
    SamplerConfig,
    bucket_of,
    bucket_probabilities,
    make_buckets,
    sample_exemplars,
)

__all__ = [
    "RULES",
    "Exemplar",
    "Failure",
    "ParseResult",
    "SamplerConfig",
    "bucket_of",
    "bucket_probabilities",
    "build_prompt",
    "make_buckets",
    "parse_completion",
    "sample_exemplars",
]
