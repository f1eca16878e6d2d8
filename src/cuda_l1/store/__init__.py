"""The history store (SQLite): runs, tasks, candidates, verdicts, prompts, completions, timings."""

from cuda_l1.store.normalize import candidate_id, norm_hash, normalize_code, stable_key
from cuda_l1.store.records import ORIGIN_KINDS, CandidateRecord, FailureRecord, Origin, RunRecord
from cuda_l1.store.schema import SCHEMA_VERSION
from cuda_l1.store.store import Store

__all__ = [
    "ORIGIN_KINDS",
    "SCHEMA_VERSION",
    "CandidateRecord",
    "FailureRecord",
    "Origin",
    "RunRecord",
    "Store",
    "candidate_id",
    "norm_hash",
    "normalize_code",
    "stable_key",
]
