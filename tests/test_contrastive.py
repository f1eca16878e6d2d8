"""Contrastive sampling (statistically), prompt building, and completion parsing (including a fuzz)."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

import pytest

from cuda_l1.contrastive import (
    Exemplar,
    Failure,
    SamplerConfig,
    bucket_of,
    bucket_probabilities,
    build_prompt,
    parse_completion,
    sample_exemplars,
)
from cuda_l1.contrastive.prompt import truncate_middle
from cuda_l1.errors import UserError


@dataclass
class Cand:
    name: str
    speedup: float | None


EDGES = (1.0, 1.5, 2.0, 3.0)
# Buckets under EDGES: 0 (<1), 1 [1,1.5), 2 [1.5,2), 3 [2,3), 4 (>=3). Bucket 3 is left empty on purpose.
POOL = [
    Cand("slow-a", 0.5), Cand("slow-b", 0.8),
    Cand("par-a", 1.0), Cand("par-b", 1.2), Cand("par-c", 1.4),
    Cand("good", 1.8),
    Cand("great-a", 4.0), Cand("great-b", 6.0),
]
MEMBERS = {0: [0.5, 0.8], 1: [1.0, 1.2, 1.4], 2: [1.8], 4: [4.0, 6.0]}


def expected_softmax(temperature: float) -> dict[int, float]:
    """Written out independently of the sampler: softmax over mean log-speedups of the non-empty buckets."""
    scores = {b: sum(math.log(s) for s in v) / len(v) for b, v in MEMBERS.items()}
    weights = {b: math.exp(s / temperature) for b, s in scores.items()}
    total = sum(weights.values())
    return {b: w / total for b, w in weights.items()}


def chi_square(observed: Counter, expected: dict, draws: int) -> float:
    return sum((observed.get(k, 0) - p * draws) ** 2 / (p * draws) for k, p in expected.items())


def chi_square_critical(df: int) -> float:
    """Critical value at p = 0.001 (Wilson-Hilferty approximation: within ~2% of tables, slightly above).

    With a fixed seed the test is deterministic; p = 0.001 means a correct sampler would fail for fewer
    than one seed in a thousand, while each test also shows the statistic rejects a wrong distribution.
    """
    z = 3.0902  # one-sided 0.999 normal quantile
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def bucket(c: Cand) -> int:
    return bucket_of(c.speedup, EDGES)


# -- sampler: distribution ------------------------------------------------------------------------------


def test_first_pick_frequencies_match_softmax():
    config = SamplerConfig(n_exemplars=1, temperature=0.7, bucket_edges=EDGES)
    expected = expected_softmax(0.7)
    assert bucket_probabilities(POOL, config) == pytest.approx(expected)
    rng = random.Random(11)
    draws = 20_000
    observed = Counter(bucket(sample_exemplars(POOL, config, rng)[0]) for _ in range(draws))
    assert set(observed) <= set(expected)
    critical = chi_square_critical(len(expected) - 1)
    assert chi_square(observed, expected, draws) < critical
    # The statistic has power: the law of a slightly different temperature (0.8) is rejected.
    assert chi_square(observed, expected_softmax(0.8), draws) > critical


def test_pair_frequencies_match_sequential_softmax_without_replacement():
    config = SamplerConfig(n_exemplars=2, temperature=1.5, bucket_edges=EDGES)
    p = expected_softmax(1.5)
    buckets = sorted(p)
    expected = {
        (a, b): p[a] * p[b] / (1 - p[a]) + p[b] * p[a] / (1 - p[b])
        for i, a in enumerate(buckets) for b in buckets[i + 1:]
    }
    assert sum(expected.values()) == pytest.approx(1.0)
    rng = random.Random(12)
    draws = 20_000
    observed = Counter()
    for _ in range(draws):
        picks = sample_exemplars(POOL, config, rng)
        assert len(picks) == 2
        assert picks[0].speedup <= picks[1].speedup  # slowest first
        pair = tuple(sorted(bucket(c) for c in picks))
        assert pair[0] != pair[1]  # distinct buckets
        observed[pair] += 1
    critical = chi_square_critical(len(expected) - 1)
    assert chi_square(observed, expected, draws) < critical
    with_replacement_law = {k: 2 * p[k[0]] * p[k[1]] / (1 - sum(q * q for q in p.values())) for k in expected}
    assert chi_square(observed, with_replacement_law, draws) > critical


def test_within_a_bucket_the_pick_is_uniform():
    config = SamplerConfig(n_exemplars=1, bucket_edges=EDGES)
    only_par = [c for c in POOL if bucket(c) == 1]
    rng = random.Random(13)
    draws = 6_000
    observed = Counter(sample_exemplars(only_par, config, rng)[0].name for _ in range(draws))
    expected = {c.name: 1 / 3 for c in only_par}
    assert chi_square(observed, expected, draws) < chi_square_critical(2)


def fastest_share(temperature: float, draws: int = 4_000) -> float:
    config = SamplerConfig(n_exemplars=1, temperature=temperature, bucket_edges=EDGES)
    rng = random.Random(14)
    return sum(bucket(sample_exemplars(POOL, config, rng)[0]) == 4 for _ in range(draws)) / draws


def test_lower_temperature_concentrates_on_the_fastest_bucket():
    shares = [fastest_share(t) for t in (5.0, 1.0, 0.3, 0.05)]
    assert shares == sorted(shares) and shares[0] < shares[-1]
    assert shares[-1] > 0.99
    # With two exemplars at a low temperature the fastest bucket is (almost) always one of them.
    config = SamplerConfig(n_exemplars=2, temperature=0.05, bucket_edges=EDGES)
    rng = random.Random(15)
    assert all(sample_exemplars(POOL, config, rng)[-1].speedup >= 4.0 for _ in range(500))


def test_very_high_temperature_approaches_uniform():
    config = SamplerConfig(n_exemplars=1, temperature=1e6, bucket_edges=EDGES)
    rng = random.Random(16)
    draws = 8_000
    observed = Counter(bucket(sample_exemplars(POOL, config, rng)[0]) for _ in range(draws))
    uniform = {b: 1 / len(MEMBERS) for b in MEMBERS}
    assert chi_square(observed, uniform, draws) < chi_square_critical(len(MEMBERS) - 1)
    assert max(bucket_probabilities(POOL, config).values()) - 0.25 < 1e-5


def test_log_score_keeps_an_outlier_from_taking_everything():
    pool = [Cand("a", 1.0), Cand("b", 1.6), Cand("c", 2.5), Cand("outlier", 40.0)]
    log_p = bucket_probabilities(pool, SamplerConfig(bucket_edges=EDGES, score="log"))
    mean_p = bucket_probabilities(pool, SamplerConfig(bucket_edges=EDGES, score="mean"))
    assert mean_p[4] > 0.99
    assert 0.5 < log_p[4] < 0.9


# -- sampler: cases and determinism ----------------------------------------------------------------------


def test_small_and_degenerate_pools():
    config = SamplerConfig(bucket_edges=EDGES)
    assert sample_exemplars([], config) == []
    assert sample_exemplars([Cand("x", None), Cand("y", float("nan")), Cand("z", 0.0)], config) == []
    one = Cand("one", 1.3)
    assert sample_exemplars([one, Cand("bad", None)], config) == [one]
    same_bucket = [Cand("p", 1.1), Cand("q", 1.2)]
    assert len(sample_exemplars(same_bucket, config, random.Random(0))) == 1
    many = SamplerConfig(n_exemplars=10, bucket_edges=EDGES)
    picks = sample_exemplars(POOL, many, random.Random(0))
    assert sorted(bucket(c) for c in picks) == sorted(MEMBERS)  # one from every non-empty bucket
    assert [c.speedup for c in picks] == sorted(c.speedup for c in picks)


def test_deterministic_for_a_seed():
    config = SamplerConfig(bucket_edges=EDGES, seed=7)
    first = [sample_exemplars(POOL, config, random.Random(3)) for _ in range(5)]
    again = [sample_exemplars(POOL, config, random.Random(3)) for _ in range(5)]
    assert first == again
    assert sample_exemplars(POOL, config) == sample_exemplars(POOL, config)  # config.seed when no rng
    rng_a, rng_b = random.Random(1), random.Random(2)
    seq_a = [sample_exemplars(POOL, config, rng_a) for _ in range(30)]
    seq_b = [sample_exemplars(POOL, config, rng_b) for _ in range(30)]
    assert seq_a != seq_b
    by_key = sample_exemplars([("k", 1.2), ("m", 2.5)], config, random.Random(0), key=lambda t: t[1])
    assert by_key == [("k", 1.2), ("m", 2.5)]


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": 0}, {"temperature": float("inf")}, {"n_exemplars": 0}, {"bucket_edges": (1.0, 1.0)},
     {"bucket_edges": (2.0, 1.0)}, {"bucket_edges": (-1.0,)}, {"score": "median"}],
)
def test_bad_config_is_a_user_error(kwargs):
    with pytest.raises(UserError):
        SamplerConfig(**kwargs)


def test_sampler_reads_store_records(tmp_path):
    from cuda_l1.evaluate.verdict import Verdict
    from cuda_l1.store import Store
    from cuda_l1.tasks.task import Task

    task = Task(name="1_T", level=1, source="class Model:\n    pass\n")
    with Store(tmp_path / "h.db") as store:
        store.add_task(task)
        for i, speedup in enumerate([0.9, 1.3, 2.4]):
            cid, _ = store.add_candidate(task.id, f"class ModelNew:\n    k = {i}\n", "manual")
            store.record_verdict(cid, Verdict(status="ok", speedup=speedup, device="cpu"))
        records = store.correct_candidates(task.id, "cpu")
    picks = sample_exemplars(records, SamplerConfig(), random.Random(0))
    assert len(picks) == 2 and picks[0].speedup < picks[1].speedup
    messages = build_prompt(task.source, picks, gpu_name="cpu")
    assert f"{picks[0].speedup:.2f}x" in messages[1]["content"] and picks[1].code.strip() in messages[1]["content"]


# -- prompts ---------------------------------------------------------------------------------------------

REFERENCE = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"


def test_prompt_holds_everything_the_model_needs():
    exemplars = [Exemplar("# FAST VERSION\nclass ModelNew: pass\n", 2.5), Exemplar("# SLOW VERSION\n", 1.1)]
    long_log = "error: first problem\n" + "noise line\n" * 1000 + "RuntimeError: the last line"
    failures = [Failure("compile_error", long_log), Failure("incorrect", "", ["max abs error 0.3 > 1e-4"])]
    messages = build_prompt(REFERENCE, exemplars, failures, "NVIDIA H200", task_name="19_ReLU")
    assert [m["role"] for m in messages] == ["system", "user"]
    system, user = messages[0]["content"], messages[1]["content"]
    assert REFERENCE.strip() in user and "19_ReLU" in user and "NVIDIA H200" in user
    assert user.index("SLOW VERSION") < user.index("FAST VERSION")  # ascending speedup
    assert user.index("1.10x") < user.index("2.50x")
    assert "compile_error" in user and "first problem" in user and "the last line" in user
    assert "characters cut" in user and len(user) < 6000  # the log was cut, head and tail kept
    assert "max abs error 0.3" in user
    for phrase in ("float32", "bfloat16", "TF32", "cache", "streams", "harness", "timers", "environment",
                   "fresh tensors", "new output tensors"):
        assert phrase in system, phrase
    assert "comparative analysis" in user and "class ModelNew(nn.Module)" in user and "```python" in user


def test_prompt_without_exemplars_asks_for_a_first_version():
    user = build_prompt(REFERENCE)[1]["content"]
    assert "first optimized version" in user and "Earlier correct versions" not in user
    assert "Recent attempts" not in user


def test_prompt_limits_failures_and_keeps_fences_intact():
    tricky = Exemplar('DOC = """```python\nnot the answer\n```"""\nclass ModelNew: pass\n', 1.5)
    failures = [Failure("runtime_error", f"failure number {i}") for i in range(6)]
    user = build_prompt(REFERENCE, [tricky], failures, max_failures=2)[1]["content"]
    assert "failure number 1" in user and "failure number 2" not in user
    assert "````python" in user  # a longer fence, so the exemplar's own backticks cannot close it
    assert truncate_middle("\x1b[31mred\x1b[0m", 100) == "red"


# -- parsing ---------------------------------------------------------------------------------------------

MODULE_V1 = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()\n"
MODULE_V2 = MODULE_V1.replace("x.relu()", "torch.clamp_min(x, 0)")


def test_plain_answer_with_analysis():
    text = f"Version 2 is faster because it fuses the ops.\n\n```python\n{MODULE_V1}```\n"
    result = parse_completion(text)
    assert result.ok and result.code == MODULE_V1 and not result.truncated
    assert result.analysis == "Version 2 is faster because it fuses the ops."


def test_prefers_last_block_defining_model_new():
    text = (
        f"Draft:\n```python\n{MODULE_V1}```\nKernel:\n```cpp\n__global__ void k() {{}}\n```\n"
        f"Final:\n```py\n{MODULE_V2}```\nRun it with:\n```bash\npython bench.py\n```\n"
    )
    assert parse_completion(text).code == MODULE_V2
    broken_last = f"```python\n{MODULE_V1}```\n```python\nclass ModelNew(:\n    pass\n```\n"
    assert parse_completion(broken_last).code == MODULE_V1  # a parsing block beats a broken one
    only_broken = parse_completion("```python\nclass ModelNew(:\n    pass\n```")
    assert only_broken.ok and "class ModelNew(" in only_broken.code  # the evaluator reports the syntax error


@pytest.mark.parametrize("opening,closing", [("```", "```"), ("~~~python", "~~~"), ("````Python", "````")])
def test_fence_styles(opening, closing):
    assert parse_completion(f"x\n{opening}\n{MODULE_V1}{closing}\n").code == MODULE_V1


def test_glued_indented_crlf_and_bare_code():
    assert parse_completion(f"Here it is:```python\n{MODULE_V1}```").code == MODULE_V1
    body = "".join("   " + line + "\n" for line in MODULE_V1.splitlines())
    indented = "1. The code:\n   ```python\n" + body + "   ```\n"
    assert parse_completion(indented).code.strip() == MODULE_V1.strip()
    assert parse_completion(f"```python\r\n{MODULE_V1}```\r\n".replace("\n", "\r\n")).code == MODULE_V1
    assert parse_completion(MODULE_V1).code == MODULE_V1
    # Inside a block a fence in the code's own string is code: un-gluing it broke the literal in two.
    quoting = MODULE_V1 + 'HINT = "see:```python"\n'
    assert parse_completion(f"Here it is:\n```python\n{quoting}```\n").code == quoting
    # A block closed and the next opened on one line: the second block is the answer.
    assert parse_completion(f"First:\n```python\n{MODULE_V1}``` ```python\n{MODULE_V2}```\n").code == MODULE_V2


def test_reasoning_sections():
    thinking = f"<think>Maybe this?\n```python\n{MODULE_V1}```\n</think>\nFused it.\n```python\n{MODULE_V2}```"
    result = parse_completion(thinking)
    assert result.code == MODULE_V2 and "Maybe this" not in result.analysis
    only_close = f"I think... ```python\n{MODULE_V1}```\n</think>\n```python\n{MODULE_V2}```"
    assert parse_completion(only_close).code == MODULE_V2
    unterminated = parse_completion("<think>Let me consider the memory layout and")
    assert unterminated.status == "parse_error" and "<think>" in unterminated.error


def test_truncated_output():
    whole_but_unclosed = parse_completion(f"Analysis.\n```python\n{MODULE_V1}")
    assert whole_but_unclosed.ok and whole_but_unclosed.truncated and whole_but_unclosed.code == MODULE_V1
    cut_module = "import torch\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x"
    cut = parse_completion("Analysis.\n```python\n" + cut_module)
    assert cut.status == "parse_error" and cut.code is None
    assert "unterminated" in cut.error and "SyntaxError" in cut.error
    no_forward = parse_completion("```python\nclass ModelNew(nn.Module):\n    def __init__(self):\n        pass\n")
    assert no_forward.status == "parse_error" and "forward" in no_forward.error
    # A cut-off answer does not revive an earlier draft...
    draft_then_cut = parse_completion(f"```python\n{MODULE_V1}```\n```python\n{cut_module}")
    assert draft_then_cut.status == "parse_error"
    # ...but a cut-off trailing snippet that is not the module does not spoil a complete answer.
    answer_then_snippet = parse_completion(f"```python\n{MODULE_V1}```\nTo test:\n```bash\npython -c 'import")
    assert answer_then_snippet.code == MODULE_V1


def test_clear_errors():
    assert parse_completion("").status == "parse_error"
    assert "no code block" in parse_completion("I could not do it.").error
    none = parse_completion("```python\nprint('hello')\n```")
    assert none.status == "parse_error" and "ModelNew" in none.error and none.analysis == ""
    assert parse_completion(None).status == "parse_error"  # type: ignore[arg-type]


def test_fuzz_never_raises():
    rng = random.Random(2024)
    sample = (
        f"<think>plan</think>Analysis: faster.\n```python\n{MODULE_V1}```\n```cpp\nint x;\n```\n"
        f"~~~py\n{MODULE_V2}~~~\n</think>\n```\n"
    )
    alphabet = list("`~\n\r\t (){}[]:#'\"\\<>/thinkclassModelNew=\x00é漢\u2028")
    alphabet += ["```", "<think>", "</think>", "```python\n"]
    for _ in range(2000):
        if rng.random() < 0.5:
            a, b = sorted(rng.randrange(len(sample) + 1) for _ in range(2))
            text = sample[a:b]
        else:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(200)))
        result = parse_completion(text)
        assert result.status in ("ok", "parse_error")
        if result.ok:
            assert isinstance(result.code, str) and "ModelNew" in result.code and result.error == ""
        else:
            assert result.code is None and result.error
    deep = "```python\nclass ModelNew:\n    x = " + "(" * 5000 + "\n```"
    assert parse_completion(deep).status in ("ok", "parse_error")
