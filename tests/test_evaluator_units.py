"""Units of the evaluator that need no child process: channel framing, precision policy, statistics,
static scan, environment scrubbing."""

from __future__ import annotations

import math
import os

import pytest
import torch

from cuda_l1.evaluate.channel import Channel, ChannelError, decode_tensor, encode_tensor, new_key
from cuda_l1.evaluate.precision import ToleranceConfig, compare
from cuda_l1.evaluate.environment import scrubbed_env
from cuda_l1.evaluate.static_scan import scan
from cuda_l1.evaluate.speedup_stats import conservative_speedup, speedup_ci, summarize


def _pair(key_a=None, key_b=None):
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    key = new_key()
    parent = Channel(a_r, a_w, key_a or key, is_parent=True)
    child = Channel(b_r, b_w, key_b or key, is_parent=False)
    return parent, child



def test_a_send_to_a_peer_that_stopped_reading_times_out_instead_of_blocking():
    """The parent's end has a send timeout: a side that never reads (a full pipe) cannot hold the
    parent's write for good (a build flood did, past every deadline)."""
    from cuda_l1.evaluate.channel import ChannelTimeout

    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    key = new_key()
    parent = Channel(a_r, a_w, key, is_parent=True, send_timeout=0.3)
    started = __import__("time").monotonic()
    with pytest.raises(ChannelTimeout):
        for _ in range(10_000):  # ~64 KiB fill the pipe; nobody reads b_r
            parent.send({"op": "x" * 200})
    assert __import__("time").monotonic() - started < 5
    child = Channel(b_r, b_w, key, is_parent=False)
    assert child.recv(timeout=1).header["op"].startswith("x")  # what was sent whole still arrives in order


@pytest.mark.parametrize("view,dense", [
    (lambda t: t, True), (lambda t: t.t(), True), (lambda t: t.permute(2, 0, 1) if t.dim() == 3 else t.t(), True),
    (lambda t: t[:, :1].expand(-1, t.shape[1]), False),  # stride 0: a broadcast
    (lambda t: t.reshape(-1)[: t.shape[1] + 3].unfold(0, 4, 1), False),  # overlapping windows
    (lambda t: t[:, ::2], False),  # gaps
    (lambda t: t[:0], True),  # empty
])
def test_dense_layout_accepts_reorderings_and_refuses_broadcasts_overlaps_and_gaps(view, dense):
    from cuda_l1.evaluate.output_memory import dense_layout

    t = view(torch.zeros(6, 8))
    assert dense_layout(list(t.shape), list(t.stride())) is dense

def test_channel_round_trip_with_tensors():
    parent, child = _pair()
    t = torch.randn(3, 5).to(torch.bfloat16)
    meta, blob = encode_tensor(t)
    child.send({"op": "x", "meta": meta}, [blob])
    msg = parent.recv(timeout=5)
    assert torch.equal(decode_tensor(msg.header["meta"], msg.blobs[0]), t)


def test_channel_refuses_frames_without_the_key():
    parent, child = _pair(key_b=new_key())  # the child signs with another key
    child.send({"status": "ok", "speedup": 100})
    with pytest.raises(ChannelError, match="authentication"):
        parent.recv(timeout=5)


def test_channel_refuses_replayed_frames():
    parent, child = _pair()
    child.send({"n": 1})
    raw = os.read(parent.read_fd, 1 << 16)
    os.write(child.write_fd, raw)  # the same bytes again: accepted once ...
    os.write(child.write_fd, raw)
    assert parent.recv(timeout=5).header == {"n": 1}
    with pytest.raises(ChannelError):  # ... and refused when replayed (sequence numbers)
        parent.recv(timeout=5)


def test_decode_validates_sizes():
    with pytest.raises(ChannelError):
        decode_tensor({"dtype": "float32", "shape": [4]}, b"\0" * 12)
    with pytest.raises(ChannelError):
        decode_tensor({"dtype": "nonsense", "shape": [1]}, b"\0" * 4)


def _oracle_case(n=256, k=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, k, generator=g), torch.randn(k, n, generator=g)
    return a, b, (a.double() @ b.double()), a @ b


def test_precision_accepts_reassociation_and_refuses_downgrades():
    a, b, oracle, ref = _oracle_case()
    cfg = ToleranceConfig()
    reassociated = (a[:, :256] @ b[:256] + a[:, 256:] @ b[256:])
    assert compare(reassociated, ref, oracle, cfg).ok
    half = (a.half() @ b.half()).float()
    bf16 = (a.bfloat16() @ b.bfloat16()).float()
    # TF32 keeps 10 mantissa bits: emulate by rounding the inputs.
    tf32 = (a.view(torch.int32) & ~0x1FFF).view(torch.float32) @ (b.view(torch.int32) & ~0x1FFF).view(torch.float32)
    for name, cand in (("fp16", half), ("bf16", bf16), ("tf32", tf32)):
        assert not compare(cand, ref, oracle, cfg).ok, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_output_ten_percent_off_fails_while_the_same_math_reordered_passes(dtype):
    # On an H200, a bf16 linear layer scaled by 1.1 passed: the floor was 64 epsilons of bf16, half
    # of the output's magnitude. The floor is now float32's for 16-bit outputs (plus one of their own).
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(256, 1024, generator=g).to(dtype), torch.randn(512, 1024, generator=g).to(dtype)
    ref = torch.nn.functional.linear(x, w)
    oracle = torch.nn.functional.linear(x.double(), w.double())
    reordered = (torch.nn.functional.linear(x[:, :512].float(), w[:, :512].float())
                 + torch.nn.functional.linear(x[:, 512:].float(), w[:, 512:].float())).to(dtype)
    cfg = ToleranceConfig()
    assert compare(ref.clone(), ref, oracle, cfg).ok
    assert compare(reordered, ref, oracle, cfg).ok
    # Errors are taken against the oracle rounded to the output's dtype, so the rounding every output
    # has (half an ulp: 0.4% for bf16) is not multiplied by the error factor.
    for factor in (1.1, 1.03) if dtype == torch.bfloat16 else (1.1, 1.02, 1.01):
        assert not compare(ref * factor, ref, oracle, cfg).ok, factor
    # Computed in FP8 (e4m3, scaled per tensor into its range): twice the rate on an H200's tensor cores.
    def fp8(t):
        s = 448.0 / t.abs().amax().float()
        return (t.float() * s).to(torch.float8_e4m3fn).float() / s
    fp8_out = torch.nn.functional.linear(fp8(x), fp8(w)).to(dtype)
    assert not compare(fp8_out, ref, oracle, cfg).ok


def test_kernelbench_tolerance_lets_an_fp16_downgrade_through():
    # Why the float64 oracle is the default: KernelBench's fixed atol/rtol accept an elementwise op
    # computed in fp16, the oracle policy does not.
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3
    ref, oracle = torch.nn.functional.gelu(x), torch.nn.functional.gelu(x.double())
    half = torch.nn.functional.gelu(x.half()).float()
    assert compare(half, ref, oracle, ToleranceConfig(mode="kernelbench")).ok
    assert not compare(half, ref, oracle, ToleranceConfig()).ok


def test_precision_nan_and_inf_placement():
    ref = torch.tensor([1.0, float("nan"), float("inf")])
    oracle = ref.double()
    assert compare(ref.clone(), ref, oracle, ToleranceConfig()).ok
    assert not compare(torch.tensor([1.0, 2.0, float("inf")]), ref, oracle, ToleranceConfig()).ok
    assert not compare(torch.tensor([float("nan"), float("nan"), float("inf")]), ref, oracle, ToleranceConfig()).ok


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_precision_where_only_the_reference_overflowed(dtype):
    """The reference overflowed where float64 did not: a candidate may match either, but a finite
    value there is judged against float64, never waved through (any finite value passed before)."""
    big = 0.9 * float(torch.finfo(dtype).max)
    x = torch.linspace(-2, 2, 1000, dtype=torch.float64)
    oracle = x.clone()
    oracle[7] = big
    ref = oracle.to(dtype)
    ref[7] = float("inf")  # its float32 (bf16) computation overflowed on the way
    assert compare(ref.clone(), ref, oracle, ToleranceConfig()).ok  # the reference's own inf
    assert compare(oracle.to(dtype), ref, oracle, ToleranceConfig()).ok  # float64's value, rounded
    for wrong in (0.0, 1.0, big / 2):
        cand = oracle.to(dtype)
        cand[7] = wrong
        result = compare(cand, ref, oracle, ToleranceConfig())
        assert not result.ok and "reference is not finite" in result.detail, (wrong, result.detail)
    # the huge values there loosen nothing elsewhere: an error the rest of the output would refuse
    cand = oracle.to(dtype)
    cand[3] += 0.5
    assert not compare(cand, ref, oracle, ToleranceConfig()).ok
    only = torch.tensor([big], dtype=torch.float64)  # every finite value is such a value
    assert compare(only.to(dtype), torch.tensor([float("inf")], dtype=dtype), only, ToleranceConfig()).ok
    assert not compare(torch.zeros(1, dtype=dtype), torch.tensor([float("inf")], dtype=dtype), only, ToleranceConfig()).ok


def test_precision_where_only_the_oracle_is_not_finite():
    """The other way round (a sum that cancels exactly in float64, so 1/sum is inf there, while the
    float32 reference is left with rounding noise): the reference's value is noise, and an honest
    reordering that is left with other noise passes."""
    rows = torch.linspace(-2, 2, 64).reshape(16, 4)
    rows[5] = torch.tensor([1.0, 2 ** -30, -1.0, -2 ** -30])

    def inverse_sum(x, order):
        total = x[:, order[0]]
        for j in order[1:]:
            total = total + x[:, j]
        return 1 / total

    ref, oracle = inverse_sum(rows, (0, 1, 2, 3)), inverse_sum(rows.double(), (0, 1, 2, 3))
    cand = inverse_sum(rows, (0, 3, 2, 1))
    assert torch.isinf(oracle[5]) and torch.isfinite(ref[5]) and cand[5] != ref[5]
    assert compare(cand, ref, oracle, ToleranceConfig()).ok


def test_precision_positions_where_only_float64_is_finite_are_held_one_by_one():
    """A huge float64 value at one such position widens the allowance at no other: a wrong value
    beside it still fails."""
    oracle = torch.linspace(-2, 2, 100, dtype=torch.float64)
    oracle[0], oracle[1] = 3.0e38, 0.5
    ref = oracle.float()
    ref[0], ref[1] = float("inf"), float("nan")
    cand = oracle.float()
    assert compare(cand, ref, oracle, ToleranceConfig()).ok
    cand[1] = 1e33
    assert not compare(cand, ref, oracle, ToleranceConfig()).ok



def _specials_cases():
    """Outputs with and without NaN/Inf, close and far, real and complex, for the fast paths."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.complex64):
        base = torch.randn(4096, generator=gen).to(dtype) if not dtype.is_complex else torch.randn(4096, dtype=dtype, generator=gen)
        for variant in ("same", "close", "far", "far_below", "nan_both", "nan_cand", "inf_both", "inf_cand",
                        "ninf_cand", "inf_ref", "inf_opposite"):
            ref = base.clone()
            cand = base.clone()
            if variant == "close":
                cand = (cand.to(torch.complex128 if dtype.is_complex else torch.float64) * (1 + 1e-7)).to(dtype)
            elif variant == "far":
                cand[17] += 0.5
            elif variant == "far_below":  # the largest error is a negative difference
                cand[17] -= 0.5
            elif variant == "nan_both":
                ref[5], cand[5] = float("nan"), float("nan")
            elif variant == "nan_cand":
                cand[9] = float("nan")
            elif variant == "inf_both":
                ref[3], cand[3] = float("inf"), float("inf")
            elif variant == "inf_cand":
                cand[3] = float("inf")
            elif variant == "ninf_cand":
                cand[3] = float("-inf")
            elif variant == "inf_ref":  # the reference (and so the oracle) has it, the candidate does not
                ref[3] = float("inf")
            elif variant == "inf_opposite":
                ref[3], cand[3] = float("inf"), float("-inf")
            out.append((f"{dtype}-{variant}", cand, ref))
    return out


@pytest.mark.parametrize("chunk", [1 << 24, 1000], ids=["one-chunk", "five-chunks"])
@pytest.mark.parametrize("name,cand,ref", _specials_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_precision_fast_path_agrees_with_the_masked_path(name, cand, ref, chunk, monkeypatch):
    """compare() reads the extremes in one synchronisation per chunk when every value is finite; with
    the fast path switched off (the masked path for every chunk) every result is the same, whichever
    chunk holds the special values."""
    from cuda_l1.evaluate import precision

    monkeypatch.setattr(precision, "_CHUNK", chunk)
    oracle = ref.to(torch.complex128 if ref.is_complex() else torch.float64)
    fast = compare(cand, ref, oracle, ToleranceConfig())
    monkeypatch.setattr(precision, "_finite_errors", lambda *a: None)
    slow = compare(cand, ref, oracle, ToleranceConfig())
    assert (fast.ok, fast.detail, fast.candidate_error, fast.allowed_error) == (slow.ok, slow.detail, slow.candidate_error, slow.allowed_error)


@pytest.mark.parametrize("name,cand,ref", _specials_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_full_comparison_fast_path_agrees_with_the_masked_path(name, cand, ref):
    """verify._beyond returns at once when the largest difference is within the bound (nothing NaN);
    otherwise it applies the NaN-matching rules: the same answer as those rules applied always."""
    from cuda_l1.evaluate.verify import _beyond

    def masked(got, expect, bound):
        wide = torch.complex128 if got.is_complex() or expect.is_complex() else torch.float64
        got, expect = got.to(wide), expect.to(wide)
        diff = (got - expect).abs()
        diff[torch.isnan(diff) & (torch.isnan(got) & torch.isnan(expect) | (got == expect))] = 0.0
        if torch.isnan(diff).any() or (diff > bound).any():
            return float(torch.nan_to_num(diff, nan=float("inf")).max())
        return None

    for bound in (0.0, 1e-6, 1e-2, 1.0):
        assert _beyond(cand, ref, bound) == masked(cand, ref, bound), (name, bound)

@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bool])
def test_comparisons_of_dtypes_that_do_not_subtract_from_float64(dtype):
    """float8 and bool refuse type promotion with float64: the comparisons widen them first and still
    judge, right and wrong alike."""
    from cuda_l1.evaluate.verify import full_values

    oracle = torch.tensor([0.5, 1.0, -2.0, 3.0], dtype=torch.float64)
    ref = oracle.to(dtype)
    wrong = (oracle * 1.5 if dtype.is_floating_point else oracle - 0.5).to(dtype)
    assert compare(ref.clone(), ref, oracle, ToleranceConfig()).ok
    assert not compare(wrong, ref, oracle, ToleranceConfig()).ok
    assert full_values(ref.clone(), ref, 0.1) is None
    assert full_values(wrong, ref, 0.1) is not None


def test_precision_integers_exact():
    ref = torch.tensor([1, 2, 3])
    assert compare(ref.clone(), ref, None, ToleranceConfig()).ok
    assert not compare(torch.tensor([1, 2, 4]), ref, None, ToleranceConfig()).ok


def test_summary_and_ci():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s.median_ms == 2.5 and s.mean_ms == 2.5 and math.isclose(s.stderr_ms, s.stdev_ms / 2)
    ref = [2.0 + 0.01 * (i % 3) for i in range(40)]
    cand = [1.0 + 0.01 * (i % 5) for i in range(40)]
    point, lo, hi = speedup_ci(ref, cand, seed=1)
    assert lo <= point <= hi and 1.9 < point < 2.05


def test_speedup_taken_by_order_class_cancels_a_first_window_penalty():
    """Identical sides, each 5% slower when its window comes first in a round (as measured on the
    H200), and the order drawn 110 to 90: all rounds pooled, the medians fall in different
    clusters and the speedup reads about 0.95; taken by order class it is 1.00 within noise."""
    import random

    rng = random.Random(7)
    candidate_first = [True] * 110 + [False] * 90
    rng.shuffle(candidate_first)
    noise = [1 + 0.003 * rng.uniform(-1, 1) for _ in range(400)]
    ref = [(1.05 if not f else 1.0) * noise[i] for i, f in enumerate(candidate_first)]
    cand = [(1.05 if f else 1.0) * noise[200 + i] for i, f in enumerate(candidate_first)]
    pooled, _, _ = speedup_ci(ref, cand, seed=1)
    assert pooled < 0.97  # what the pooled median made of it
    point, lo, hi = speedup_ci(ref, cand, candidate_first, seed=1)
    assert abs(point - 1) < 0.005 and lo <= 1.0 <= hi and hi - lo < 0.01
    assert conservative_speedup(point, lo, hi) == 1.0
    # A real difference survives the split: a candidate 20% faster reads 1.2 either way.
    faster = [c / 1.2 for c in cand]
    point, lo, hi = speedup_ci(ref, faster, candidate_first, seed=1)
    assert abs(point - 1.2) < 0.01 and lo > 1.18
    # Too few rounds of one order: all rounds as one class (the pooled estimate).
    few = [True] * 38 + [False] * 2
    assert speedup_ci(ref[:40], cand[:40], few, seed=1) == speedup_ci(ref[:40], cand[:40], seed=1)


def test_window_order_comes_in_reversed_pairs_and_balances_the_order_classes():
    """Every second round reverses the one before it, so over any run of recorded rounds each order
    comes up equally often within two, and the first of each pair is still drawn at random."""
    import random

    from cuda_l1.evaluate.timing import window_order

    rng = random.Random(3)
    orders, order = [], None
    for r in range(41):
        order = window_order(["ref", "cand"], order if r % 2 else None, rng)
        orders.append(order)
    for a, b in zip(orders[0::2], orders[1::2]):
        assert b == a[::-1]
    firsts = [o[0] == "cand" for o in orders]
    for start in range(0, 10):  # recording may begin at any round
        tail = firsts[start:]
        assert abs(tail.count(True) - tail.count(False)) <= 2
    assert 5 < sum(firsts[0::2]) < 16  # the pair's first order is not fixed


def test_position_effect_shows_a_reference_slowed_only_after_the_candidate():
    from cuda_l1.evaluate.timing import Recorded, position_effect

    first = [True, False] * 10
    honest = Recorded([1.0 if f else 1.05 for f in first], [1.05 if f else 1.0 for f in first], first)
    assert position_effect(honest) == {"reference_second_over_first": 0.9524,
                                       "candidate_second_over_first": 0.9524}
    slowed = Recorded([1.2 if f else 1.05 for f in first], [1.05 if f else 1.0 for f in first], first)
    assert position_effect(slowed)["reference_second_over_first"] > 1.1
    assert position_effect(Recorded([1.0], [1.0], [True])) == {"reference_second_over_first": None,
                                                               "candidate_second_over_first": None}


def test_conservative_speedup_rounds_toward_one():
    assert conservative_speedup(1.5, 1.4, 1.6) == 1.4
    assert conservative_speedup(1.257, 1.2561, 1.27) == 1.25
    assert conservative_speedup(0.5, 0.45, 0.55) == 0.55
    assert conservative_speedup(1.02, 0.98, 1.06) == 1.0


def test_the_spread_between_processes_scores_identical_code_one_and_keeps_a_real_speedup():
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.timing import Estimate, process_spread, widen

    # Identical code, as measured: GELU on the H200 (0.965, rounds' interval 0.937-0.988) and on the
    # 2-core CPU host (0.914 with 0.875-0.955; DepthwiseConv2d 1.078 with 1.045-1.11).
    for (point, lo, hi), spread in (((0.965, 0.937, 0.988), 0.0075), ((0.914, 0.875, 0.955), 0.04),
                                    ((1.078, 1.045, 1.11), 0.04)):
        assert conservative_speedup(point, lo, hi) != 1.0
        assert conservative_speedup(point, *widen(point, lo, hi, spread)) == 1.0
    # A real 2x keeps nearly all of its score; the interval only ever widens, around the same point.
    wide = widen(2.0, 1.95, 2.05, 0.0075)
    assert wide[0] < 1.95 and wide[1] > 2.05 and conservative_speedup(2.0, *wide) >= 1.9
    assert widen(2.0, 1.95, 2.05, 0.0) == (1.95, 2.05)
    assert all(map(math.isnan, widen(1.0, math.nan, math.nan, 0.04)))  # no interval stays none
    # A half on the wrong side of the point still gets the spread: it cannot shut the term off.
    lo, hi = widen(1.08, 1.09, 1.12, 0.04)
    assert lo < 1.0 < hi and conservative_speedup(1.08, lo, hi) == 1.0
    est = Estimate(2.0, *wide, 1.0, 0.5, 1.95, 2.05)
    assert est.relative_width == (2.05 - 1.95) / 2.0  # the stop rule waits for what rounds can narrow
    assert process_spread(EvalConfig(device="cpu")) == 0.04
    assert process_spread(EvalConfig(device="cpu", timing=TimingConfig(process_spread=0.0))) == 0.0
    assert EvalConfig(device="cpu").config_key() != EvalConfig(device="cpu", timing=TimingConfig(process_spread=0.0)).config_key()


def test_limits_that_can_change_a_verdict_are_part_of_the_settings_key():
    """A program judged ok at 0.05x under an 1800 s limit was reused as ok by a judge of 180 s (a timeout
    there): limits and the re-measure rule that differ from the defaults are in the key; the defaults'
    key is the one stores were made with."""
    from cuda_l1.evaluate.config import EvalConfig, SandboxConfig

    base = EvalConfig(device="cpu").config_key()
    assert "limits" not in base
    changed = [EvalConfig(device="cpu", timeout_s=1800.0), EvalConfig(device="cpu", call_timeout_s=600.0),
               EvalConfig(device="cpu", first_call_timeout_s=30.0), EvalConfig(device="cpu", remeasure=False),
               EvalConfig(device="cpu", sandbox=SandboxConfig(memory_bytes=64 * 2**30)),
               EvalConfig(device="cpu", sandbox=SandboxConfig(max_processes=8))]
    keys = {config.config_key() for config in changed}
    assert len(keys) == len(changed) and base not in keys
    assert "memory_bytes=68719476736" in changed[4].config_key()  # exact, not rounded
    assert EvalConfig(device="cpu", timeout_s=1800).config_key() == changed[0].config_key()  # int or float: one key
    assert EvalConfig(device="cpu", sandbox=SandboxConfig(seccomp=False)).config_key() != base
    from cuda_l1.evaluate.config import TimingConfig, ToleranceConfig

    assert EvalConfig(device="cpu", tolerance=ToleranceConfig(error_factor=10)).config_key() == base
    assert EvalConfig(device="cpu", tolerance=ToleranceConfig(kernelbench_atol=0.5)).config_key() != base
    weaker = EvalConfig(device="cpu", timing=TimingConfig(checked_calls=1))
    assert weaker.config_key() != EvalConfig(device="cpu", timing=TimingConfig()).config_key()
    # What does not change a verdict stays out: the spares kept ahead, the fork server.
    assert EvalConfig(device="cpu", spares=1, sandbox=SandboxConfig(fork_server=False)).config_key() == base


def test_static_scan_flags_without_deciding():
    src = "import threading, ctypes\nimport torch\ntorch.matmul = None\ns = torch.cuda.Stream()\nx = y.half()\n"
    found = scan(src)
    assert {"threads or processes", "low-level memory access", "side streams", "precision downgrade",
            "monkeypatching"} <= set(found)
    assert scan("import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n") == {}
    # 8-bit arithmetic is named too (a signal: docs/isolation.md, 8-bit integers on a 16-bit task)
    for quantised in ("w = torch.quantize_per_channel(w, s, z, 0, torch.qint8)", "y = torch._int_mm(a, b)",
                      "y = torch.ops.quantized.linear_dynamic(x, p)", "a8 = a.to(torch.float8_e4m3fn)"):
        assert "precision downgrade" in scan(quantised), quantised
    assert scan("mask = m.to(torch.int8)\n") == {}
    # A reference's own words are no finding: identical code was marked "output caching" for "memory-bound".
    assert scan('"""A memory-bound elementwise task."""\n') == {}
    for cached in ("self.memo = {}\n", "@memoize\ndef f(): pass\n", "self._memo = {}\n", "out_memo[k] = y\n"):
        assert "output caching" in scan(cached), cached


def test_environment_is_scrubbed(monkeypatch, tmp_path):
    for name in ("OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "MY_SERVICE_PASSWORD", "GITHUB_TOKEN",
                 "SOME_RANDOM_VAR"):
        monkeypatch.setenv(name, "secret-value")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = scrubbed_env(str(tmp_path))
    assert "secret-value" not in env.values()
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["HOME"] == str(tmp_path)


def test_a_relative_pythonpath_still_names_the_same_directories_in_a_side(monkeypatch, tmp_path):
    """A side starts in its scratch directory: PYTHONPATH=src (run from a checkout) must not become a
    path inside the scratch, nor an empty entry the scratch itself."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["src", "", "/abs/lib"]))
    env = scrubbed_env(str(tmp_path / "scratch"))
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "src"), "/abs/lib"]


@pytest.mark.parametrize("nbytes", [8 * 1024, 8 * 1024 + 4, 8 * 1024 + 2, 8 * 1024 + 1])
def test_input_bytes_compare_equal_and_find_one_changed_byte_at_any_width(nbytes):
    from cuda_l1.evaluate.remote import same_bytes

    a = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    assert same_bytes(a, a.clone())
    for where in (0, nbytes // 2, nbytes - 1):
        b = a.clone()
        b[where] ^= 1
        assert not same_bytes(a, b)
    assert not same_bytes(a, a[:-1].clone())
    assert same_bytes(a[1:], a.clone()[1:])  # views at odd addresses are compared too


def test_a_gpus_input_slots_take_two_fifths_of_it_and_at_most_half_of_what_is_free(monkeypatch):
    """More slots, more calls a window: a fifth of an 80 GiB H100 gave a 1.5 GiB-input task 3 slots and
    identical code 112 rounds; 32 GiB gave 7 slots and 16 rounds. A worker's other tasks keep theirs."""
    import torch

    from cuda_l1.evaluate.config import EvalConfig
    from cuda_l1.evaluate.task_env import _slot_budget

    gib = 1 << 30
    config = EvalConfig(device="cuda")
    one_slot = 3 * (3 * gib // 2) + 4 * (gib >> 10)  # three copies of 1.5 GiB in, four of 1 MiB out
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (78 * gib, 80 * gib))
    assert _slot_budget(config, 3 * gib // 2, gib >> 10) == 32 * gib // one_slot == 7
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * gib, 80 * gib))
    assert _slot_budget(config, 3 * gib // 2, gib >> 10) == 10 * gib // one_slot == 2
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (gib, 80 * gib))
    assert _slot_budget(config, 3 * gib // 2, gib >> 10) == 1  # never none
    assert _slot_budget(EvalConfig(device="cuda", input_memory_bytes=16 * gib), 3 * gib // 2, gib >> 10) == 3


def test_input_slots_are_budgeted_on_outputs_too():
    from cuda_l1.evaluate.config import EvalConfig
    from cuda_l1.evaluate.task_env import _slot_budget
    from cuda_l1.tasks import Task
    from cuda_l1.tasks import runtime
    from cuda_l1.tasks.runtime import load_task_module, run_reference_once

    config = EvalConfig(device="cpu", input_memory_bytes=28 << 30)
    # KernelBench level 1 task 7 (M=N=32768, K=32): 8 MiB of inputs, a 4 GiB output per call.
    assert _slot_budget(config, 8 << 20, 4 << 30) == 1
    assert _slot_budget(config, 8 << 20, 8 << 20) == 256
    source = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(1024, 32), torch.randn(32, 1024)]


def get_init_inputs():
    return []
"""
    # The output's size comes from the reference's one run, which also checks it: a shape that depends
    # on the data (no meta-device run could tell it) is measured the same way.
    run = lambda text: run_reference_once(load_task_module(Task(name="t", level=1, source=text)), "t.py")  # noqa: E731
    assert run(source) == runtime.FirstRun(1024 * 1024 * 4)  # on a CPU: no launch share
    assert run(source.replace("return a @ b", "return (a @ b)[: int(a.sum().item() > 1e9) + 1]")).output_bytes == 1024 * 4
    # Nested outputs count too (an LSTM returns (out, (h, c))).
    assert run(source.replace("return a @ b", "return a, (b, [a @ b])")).output_bytes == (2 * 1024 * 32 + 1024 * 1024) * 4


def test_each_slot_of_a_round_has_a_secret_seed_of_its_own(monkeypatch):
    """A later slot's inputs may not follow from an earlier slot's: torch's CPU generator is MT19937,
    whose state about 2,000 values of one slot give away (an adversarial reading rebuilt ten later
    calls' inputs bit for bit from a window's first call). With the round's first seed fixed and the
    later ones changed, the first slot stays and every later one changes."""
    from cuda_l1.evaluate import slots
    from cuda_l1.tasks import Task
    from cuda_l1.tasks.runtime import load_task_module

    source = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
"""
    src = slots.InputSource(load_task_module(Task(name="seeds", level=1, source=source)), "cpu", "seeds")

    def round_with(later: int) -> list[torch.Tensor]:
        draws = iter([12345] + [later + i for i in range(3)])
        monkeypatch.setattr(slots.secrets, "randbits", lambda bits: next(draws))
        return [values[0].clone() for values in src.fresh(4).values]

    first, second = round_with(1000), round_with(2000)
    assert torch.equal(first[0], second[0])
    assert all(not torch.equal(a, b) for a, b in zip(first[1:], second[1:]))


def test_packed_inputs_fill_a_buffer_in_one_copy_and_show_any_write_to_it(monkeypatch):
    """InputSource.pack lays a round's slots out as a side's buffer holds them (used on CUDA, where
    a copy and a comparison per input cost a launch and a synchronisation each)."""
    from cuda_l1.evaluate.slots import InputSource, RoundInputs, SlotBuffer
    from cuda_l1.tasks import Task
    from cuda_l1.tasks.runtime import load_task_module

    source = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b, k):
        return a[: b.shape[0]] * k + b.float().sum()


def get_inputs():
    return [torch.randn(7, 3), torch.randint(0, 5, (5,), dtype=torch.int16), 3]


def get_init_inputs():
    return []
"""
    module = load_task_module(Task(name="pack", level=1, source=source))
    src = InputSource(module, "cpu", "pack")
    generated = [src.generate(seed) for seed in (1, 2, 3)]
    real_empty = torch.empty  # fresh memory full of old bytes, as a reused device allocation may be
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(0xAB))
    packed, views = src.pack(generated)
    monkeypatch.setattr(torch, "empty", real_empty)
    rows = packed.view(3, src.slot_bytes)
    covered = torch.zeros(src.slot_bytes, dtype=torch.bool)
    for spec, sample in zip(src.slot_specs, src.sample):
        if spec.kind == "tensor":
            covered[spec.offset:spec.offset + sample.numel() * sample.element_size()] = True
    assert bool((rows[:, ~covered] == 0).all())  # padding is zero: holds_packed compares it too
    for got, want in zip(views, generated):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == 3
        assert got[0].data_ptr() != want[0].data_ptr()  # views of the packed bytes, not the originals
    buffer = SlotBuffer(src, 4, os.memfd_create("pack-test", os.MFD_ALLOW_SEALING))
    try:
        buffer.write_packed(packed, 3)
        assert all(buffer.unchanged(slot, generated[slot]) for slot in range(3))
        assert buffer.holds_packed(packed, 3)
        buffer.raw[src.slot_bytes + 5] ^= 1  # one byte of the second slot
        assert not buffer.holds_packed(packed, 3) and buffer.holds_packed(packed, 1)
        assert not buffer.unchanged(1, generated[1])
        inputs = RoundInputs(views, packed)
        assert len(inputs) == 3 and inputs[2] is views[2]
    finally:
        buffer.close()


def test_a_round_of_one_slot_that_one_tensor_fills_is_not_copied(monkeypatch):
    """KernelBench's level-1 elementwise tasks take one 6 GiB input and get one slot a window: packing
    it held the generated values and their copy at once, 12 GiB in the parent, and on an 80 GiB
    H100 their evaluations ran out of device memory. Such a slot is used as generated; every other
    round is packed one slot at a time (the packed buffer and one slot's values at most)."""
    from cuda_l1.evaluate.slots import InputSource, SlotBuffer
    from cuda_l1.tasks import Task
    from cuda_l1.tasks.runtime import load_task_module

    task = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(SHAPE)]


def get_init_inputs():
    return []
"""
    filled = InputSource(load_task_module(Task(name="fill", level=1, source=task.replace("SHAPE", "64, 64"))),
                         "cpu", "fill")
    one = filled.fresh(1)
    assert one.packed.data_ptr() == one[0][0].data_ptr() and one.packed.numel() == filled.slot_bytes
    assert torch.equal(one.packed.view(torch.float32).view(64, 64), one[0][0])
    buffer = SlotBuffer(filled, 2, os.memfd_create("fill-test", os.MFD_ALLOW_SEALING))
    try:
        buffer.write_packed(one.packed, 1)
        assert buffer.holds_packed(one.packed, 1) and buffer.unchanged(0, one[0])
    finally:
        buffer.close()
    import weakref

    peak, live = [0], []
    real_generate = filled.generate

    def generate(seed):  # how many slots' generated values are alive at once
        live[:] = [ref for ref in live if ref() is not None]
        values = real_generate(seed)
        live.append(weakref.ref(values[0]))
        peak[0] = max(peak[0], len(live))
        return values

    monkeypatch.setattr(filled, "generate", generate)
    three = filled.fresh(3)
    assert three.packed.numel() == 3 * filled.slot_bytes and peak[0] <= 2
    assert all(three[i][0].data_ptr() == three.packed[i * filled.slot_bytes:].data_ptr() for i in range(3))
    assert not torch.equal(three[0][0], three[1][0])  # every slot its own seed
    padded = InputSource(load_task_module(Task(name="pad", level=1, source=task.replace("SHAPE", "7, 3"))), "cpu", "pad")
    round_ = padded.fresh(1)
    assert round_.packed.numel() == padded.slot_bytes > 7 * 3 * 4  # copied into a padded slot
    assert round_[0][0].data_ptr() == round_.packed.data_ptr()  # the value is a view of the packed bytes
    assert bool((round_.packed[7 * 3 * 4:] == 0).all())  # its padding is zero


def _spots_one_by_one(cand, ref, count, rng, bound):
    """Spot checks of one output by multi-dimensional indexing (what verify.spot_values did before
    all spots went through one gather): the yardstick for verify.spots_at_once."""
    from cuda_l1.evaluate import verify

    n = ref.numel()
    if n == 0:
        return None
    flat = torch.tensor([rng.randrange(n) for _ in range(count)], dtype=torch.int64)
    index = torch.unravel_index(flat, ref.shape) if ref.dim() else ()
    worst = verify._beyond(cand[index], ref[index], bound)
    return None if worst is None else f"differs from the reference by {worst:.3g} at a checked position (allowed {bound:.3g})"


def test_spots_of_many_outputs_at_once_match_spot_checks_one_by_one():
    """One gather for all checked outputs of a request (the reference side's CUDA path): the same
    positions and the same findings as comparing each output alone, whatever its strides or dtype."""
    import random

    from cuda_l1.evaluate import verify

    base = torch.randn(6, 10)
    outputs = [
        (base.t(), base.t().clone()),  # transposed view against a contiguous copy
        (base[:, 2:7], base[:, 2:7].clone() + 1e-6),
        (torch.arange(12, dtype=torch.int32).reshape(3, 4), torch.arange(12, dtype=torch.int32).reshape(3, 4)),
        (torch.randn(5, dtype=torch.complex64), None),
        (torch.empty(0, 3), torch.empty(0, 3)),
        (torch.tensor(2.5), torch.tensor(2.5)),
    ]
    outputs[3] = (outputs[3][0], outputs[3][0].clone())
    wrong = base.t().clone()
    wrong[3, 1] += 1.0  # one element off: found only if drawn, alike both ways
    outputs.append((wrong, base.t().contiguous()))
    for seed in range(20):
        one = [_spots_one_by_one(c, r, 16, random.Random(seed + i), 1e-4) for i, (c, r) in enumerate(outputs)]
        many = verify.spots_at_once([(c, r, 16, random.Random(seed + i), 1e-4) for i, (c, r) in enumerate(outputs)])
        assert many == one
        assert many[:6] == [None] * 6
        assert verify.spot_values(*outputs[6], 16, random.Random(seed + 6), 1e-4) == one[6]
    assert verify.spots_at_once([(wrong, base.t().contiguous(), 10_000, random.Random(0), 1e-4)])[0] is not None
    # Only empty outputs; and complex outputs at an odd count (each output's values start anywhere).
    assert verify.spots_at_once([(torch.empty(0), torch.empty(0), 8, random.Random(0), 1.0)]) == [None]
    z = torch.randn(7, dtype=torch.complex64)
    odd = [(torch.randn(3), torch.randn(3) + 5, 3, random.Random(1), 1e-3), (z, z.clone(), 3, random.Random(2), 1e-3)]
    assert [p is None for p in verify.spots_at_once(odd)] == [False, True]


class _SilentReference:
    """A reference side's process that never answers in time."""

    def thaw(self):
        pass

    def freeze(self):
        pass

    def exit_info(self):
        from types import SimpleNamespace

        return SimpleNamespace(reason="running")

    def request(self, message, timeout, expect):
        from cuda_l1.evaluate.sandbox import ChildFailure

        raise ChildFailure("timeout", f"no answer within {timeout:.0f} s")


def test_a_reference_cut_off_by_the_evaluations_deadline_gives_timeout_not_runtime_error():
    """The float64 oracle of a huge task on a slow host can take what is left of the evaluation's limit:
    the candidate then ran out of time (timeout), it did not fail (runtime_error). A reference that
    fails with time to spare still counts against the candidate judged beside it."""
    from types import SimpleNamespace

    from cuda_l1.evaluate.config import EvalConfig
    from cuda_l1.evaluate.output_checks import _ask_reference
    from cuda_l1.evaluate.sandbox import ChildFailure
    from cuda_l1.evaluate.sides import ReferenceFailure

    side = SimpleNamespace(proc=_SilentReference())
    left = iter([19.0])

    def deadline_passed() -> float:  # as Referee.remaining: the time left, and raises once none is
        for value in left:
            return value
        raise ChildFailure("timeout", "the evaluation took longer than its limit of 180 s")

    with pytest.raises(ReferenceFailure) as late:
        _ask_reference(side, None, object, EvalConfig(), deadline_passed, "the float64 reference failed")
    assert late.value.kind == "timeout"
    with pytest.raises(ReferenceFailure) as early:
        _ask_reference(side, None, object, EvalConfig(), lambda: 100.0, "the float64 reference failed")
    assert early.value.kind == "runtime_error"


def test_the_float64_oracle_is_asked_for_in_the_first_round_and_then_at_its_rate():
    import random

    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.output_checks import draw_checked

    config = EvalConfig(device="cpu", timing=TimingConfig(oracle_rate=1.0))
    rng = random.Random(7)
    modes = lambda round_no, rate=None: [m for _, m in draw_checked(rng, 8, round_no, config, rate)]
    assert "oracle" in modes(0, 0.0) and "oracle" in modes(0)
    assert all("oracle" in modes(r) for r in range(1, 20))  # drawn at oracle_rate (1.0 here)
    assert not any("oracle" in modes(r, 0.0) for r in range(1, 20))  # or at the rate given
    # Correctness-only runs keep the oracle in every round they make.
    checking = EvalConfig(device="cpu", timing=TimingConfig(enabled=False))
    assert all("oracle" in [m for _, m in draw_checked(rng, 8, r, checking, 0.0)]
               for r in range(checking.correctness_trials))


def test_the_float64_oracle_is_thinned_past_its_share_of_the_windows_time_but_never_switched_off():
    import random

    from cuda_l1.evaluate.output_checks import ORACLE_FLOOR_S, ORACLE_SHARE, ORACLE_SLOW_S, oracle_rate

    assert oracle_rate(0.3, 0.0, 0.0) == 0.3
    assert oracle_rate(0.3, ORACLE_FLOOR_S, 0.1) == 0.3  # the floor, whatever the windows took
    assert oracle_rate(0.3, 2 * ORACLE_FLOOR_S, 0.1) == 0.3 / 4
    assert oracle_rate(0.3, ORACLE_SHARE * 8.0, 8.0) == 0.3  # a share of the windows' time, beyond the floor
    assert oracle_rate(0.3, 2 * ORACLE_SLOW_S, 1000.0) == 0.3 / 4  # the budget stops at ORACLE_SLOW_S
    assert oracle_rate(0.3, 1000.0, 0.0) > 0  # never zero: no round is known to be exempt
    # KernelBench's 6 GiB elementwise tasks on an H100: 0.15 s an oracle round, 23 ms of windows a round.
    # Over 200 rounds the oracle stays drawable late, and costs about half what the windows do (5 s before).
    rng, spent, windows, late = random.Random(3), 0.0, 0.0, 0
    for round_no in range(1, 201):
        if rng.random() < oracle_rate(0.3, spent, windows):
            spent += 0.15
            late += round_no > 100
        windows += 0.023
    assert late >= 1 and spent < 3.5, (late, spent)


def test_process_counters_read_what_the_kernel_counted():
    import mmap
    import os

    from cuda_l1.evaluate import process_counters

    before = process_counters.read(os.getpid())
    if before is None:
        pytest.skip("no /proc here")
    # A fresh anonymous mapping, in small pages, written once a page: each write is a minor fault.
    # (A bytearray may reuse heap pages that an earlier test in this process already touched.)
    pages = 4096
    block = mmap.mmap(-1, pages * mmap.PAGESIZE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        block.madvise(mmap.MADV_NOHUGEPAGE)
    for i in range(pages):
        block[i * mmap.PAGESIZE] = 1
    delta = process_counters.change(before, process_counters.read(os.getpid()))
    block.close()
    assert delta["minor_faults"] >= pages and delta["cpu_s"] >= 0
    assert set(delta) == {"minor_faults", "major_faults", "cpu_s", "voluntary_switches", "involuntary_switches"}
    assert process_counters.read(None) is None and process_counters.read(2**22 + 12345) is None
    assert process_counters.change(None, before) is None


def test_work_in_its_own_arena_returns_or_raises_as_called():
    from cuda_l1.evaluate.warmup import in_own_arena

    assert in_own_arena(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(RuntimeError, match="no float64 kernel"):
        in_own_arena(lambda: (_ for _ in ()).throw(RuntimeError("no float64 kernel")))


def test_work_whose_thread_cannot_start_is_done_in_the_caller(monkeypatch):
    import threading

    from cuda_l1.evaluate.warmup import in_own_arena

    def refuse(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    assert in_own_arena(lambda: threading.current_thread().name) == threading.current_thread().name


def test_only_a_first_start_of_the_reference_can_fail_as_the_tasks_error(monkeypatch):
    """A reference whose side does not start the first time is bad input (a TaskError ends a bench).
    Once it has started for the task, a failed restart (after a candidate crashed the side beside it,
    say) is the evaluation's failure: a candidate cannot end a run by making its task look broken."""
    from types import SimpleNamespace

    import cuda_l1.evaluate.task_env as task_env
    from cuda_l1.errors import TaskError
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.evaluator import Evaluator
    from cuda_l1.tasks import make_task
    from task_sources import one_line_task

    task = make_task(one_line_task("torch.relu(x)", "64"), name="1_relu", level=1, origin="test:relu")
    config = EvalConfig(device="cpu", timing=TimingConfig.quick(), prewarm=False)
    real = task_env.load_side
    refuse = lambda *args, **kwargs: (SimpleNamespace(ok=False, message="the side refused"), None)  # noqa: E731
    evaluator = Evaluator(task, config)
    try:
        assert evaluator.env.ref is not None
        monkeypatch.setattr(task_env, "load_side", refuse)
        with pytest.raises(RuntimeError, match="did not start again") as again:
            evaluator.env.restart_reference()
        assert not isinstance(again.value, TaskError)
        monkeypatch.setattr(task_env, "load_side", real)
        evaluator.env.start_reference()  # and the next start may well work
        assert evaluator.env.ref is not None
    finally:
        evaluator.close()
    monkeypatch.setattr(task_env, "load_side", refuse)
    with pytest.raises(TaskError, match="does not load in the sandbox"):
        Evaluator(task, config).close()


@pytest.mark.parametrize("mode", ["oracle", "full"])
def test_a_full_comparison_stops_at_the_evaluations_deadline(mode):
    """A reference output of 2**33 elements (an expanded view) kept the parent comparing for minutes past
    --timeout: the comparison now asks for the time left before each chunk, and that raises at the deadline."""
    import random

    from cuda_l1.evaluate.verify import judge_leaf

    out = torch.zeros(1).expand((1 << 24) * 3)
    asked = []

    def time_left() -> float:
        asked.append(1)
        if len(asked) == 2:
            raise TimeoutError("past the deadline")
        return 1.0

    with pytest.raises(TimeoutError):
        judge_leaf(out, out, out.double() if mode == "oracle" else None, mode, 1.0 if mode == "full" else None,
                   random.Random(0), 8, ToleranceConfig(), time_left)
    assert len(asked) == 2  # one chunk compared, then stopped: not the remaining ones
    assert judge_leaf(out, out, None, "full", 1.0, random.Random(0), 8, ToleranceConfig()).ok


def test_integer_outputs_are_compared_exactly_past_two_to_the_53():
    """Spot and full comparisons went through float64, where 2**53 + 1 reads as 2**53: an int64 output
    off by one there passed every round but the oracle's."""
    import random

    from cuda_l1.evaluate.verify import full_values, spot_values

    ref = torch.full((64,), 2**53 + 1, dtype=torch.int64)
    off = ref - 1
    assert full_values(off, ref, 0.0) is not None and spot_values(off, ref, 64, random.Random(1), 0.0) is not None
    assert full_values(ref.clone(), ref, 0.0) is None and spot_values(ref.clone(), ref, 64, random.Random(1), 0.0) is None
    negative = -ref
    assert spot_values(negative - 1, negative, 64, random.Random(2), 0.0) is not None
    flags = torch.tensor([True, False] * 8)
    assert spot_values(~flags, flags, 16, random.Random(3), 0.0) is not None
    assert spot_values(flags.clone(), flags, 16, random.Random(3), 0.0) is None


def test_a_scalar_output_equals_an_infinity_only_if_it_is_that_infinity():
    from cuda_l1.evaluate.verify import _same_value

    inf = float("inf")
    assert _same_value(inf, inf) and _same_value(-inf, -inf)
    assert not _same_value(5.0, inf) and not _same_value(-inf, inf) and not _same_value(inf, 5.0)
    assert not _same_value(10**400, 2.0) and _same_value(2.0000000001, 2.0)


def test_the_oracles_copy_holds_every_plain_tensor_attribute_in_float64():
    """Module.double() converts parameters and buffers only; a weight kept as a plain attribute, alone
    or in a list, tuple or dict, stayed float32 and the oracle failed on the mixed dtypes (its checks
    then fell back to a 1e-2 tolerance)."""
    import torch.nn as nn

    from cuda_l1.evaluate.inputs import double_model

    class Table(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("steps", torch.arange(3))
            self.w = torch.randn(4, 4)
            self.table = [torch.randn(4), (torch.randn(2), 3), {"bias": torch.randn(4)}]
            self.index = torch.arange(4)
            self.weights = [nn.Parameter(torch.randn(4, 4))]  # not registered: Module.double skips it

    model = Table()
    oracle = double_model(model, "cpu")
    assert isinstance(oracle.lin.weight, nn.Parameter) and oracle.lin.weight.dtype == torch.float64
    assert oracle.w.dtype == torch.float64
    assert oracle.table[0].dtype == torch.float64 and oracle.table[2]["bias"].dtype == torch.float64
    assert isinstance(oracle.table[1], tuple) and oracle.table[1][0].dtype == torch.float64 and oracle.table[1][1] == 3
    assert isinstance(oracle.weights[0], nn.Parameter) and oracle.weights[0].dtype == torch.float64
    assert oracle.index.dtype == torch.int64 and oracle.steps.dtype == torch.int64  # integers stay integers
    assert model.w.dtype == torch.float32 and model.table[0].dtype == torch.float32  # the task's own model is untouched


def test_values_the_reference_gets_right_are_judged_by_themselves_too():
    """The allowance is one absolute bound scaled by max|output|: a cumprod returning zeros after each
    row's first 96 running products (each skipped value 100% wrong, all below 1.2e-8) passed it. Honest
    variants pass: another algorithm (sums of logarithms), bf16 partial sums of a split-K matmul."""
    from cuda_l1.evaluate.precision import GROSS_MIN, compare
    from cuda_l1.evaluate.tolerance import ToleranceConfig

    config, gen = ToleranceConfig(), torch.Generator().manual_seed(3)
    x = torch.randn(128, 4000, generator=gen)
    oracle, ref = torch.cumprod(x.double(), 1), torch.cumprod(x, 1)
    truncated = torch.zeros_like(x)
    truncated[:, :96] = torch.cumprod(x[:, :96], 1)
    verdict = compare(truncated, ref, oracle, config)
    assert not verdict.ok and "are off by more than 50% of their size" in verdict.detail, verdict
    assert verdict.candidate_error < verdict.allowed_error  # what the max-scaled allowance alone let through
    by_logs = torch.exp(torch.cumsum(torch.log(x.abs()), 1)) * torch.cumprod(torch.sign(x), 1)
    assert compare(by_logs, ref, oracle, config).ok
    # A handful of grossly wrong values (a few zeros where the reference has tiny products) is let be.
    few = ref.clone()
    few[0, 40:40 + GROSS_MIN] = 0
    assert bool((ref[0, 40:40 + GROSS_MIN].abs() > 1e-30).all()) and compare(few, ref, oracle, config).ok
    a = torch.randn(512, 1024, generator=gen).bfloat16()
    b = torch.randn(1024, 512, generator=gen).bfloat16()
    oracle, ref = a.double() @ b.double(), (a.float() @ b.float()).bfloat16()
    split = torch.zeros(512, 512, dtype=torch.bfloat16)
    for part in range(8):  # each partial sum rounded to bf16, then added in bf16
        split = (split.float() + (a[:, part::8].float() @ b[part::8].float()).bfloat16().float()).bfloat16()
    assert compare(split, ref, oracle, config).ok


def test_outputs_of_one_call_overlapping_where_the_references_are_apart():
    """Two overlapping views of one buffer where the reference's two outputs are apart: incorrect, on a
    CPU (places by address on both sides) and on a GPU (the candidate's by handle, the reference's by
    its own address, as its side describes them: it exports no handle)."""
    from cuda_l1.evaluate import output_memory, verify
    from cuda_l1.evaluate.protocol import CallOutputs, LeafRef

    n = 1 << 16

    def leaf(device, offset, nbytes, address=0, handle=""):
        return LeafRef("tensor", "Tensor", "float32", [2 * n], [1], offset, nbytes, device, address, handle, 0)

    ref = CallOutputs(("tuple", 2), [leaf("cpu", 0, 8 * n, 1 << 20), leaf("cpu", 0, 8 * n, 1 << 24)])
    views = CallOutputs(("tuple", 2), [leaf("cpu", 0, 12 * n, 1 << 28), leaf("cpu", n, 12 * n, 1 << 28)])
    apart = CallOutputs(("tuple", 2), [leaf("cpu", 0, 8 * n, 1 << 28), leaf("cpu", 0, 8 * n, 1 << 29)])
    assert output_memory.overlapping_outputs(views) == {(0, 1)} and output_memory.overlapping_outputs(apart) == set()
    found = [(f.check, f.status) for f in verify.call_findings(views, ref, "", [])]
    assert found == [("output_ownership", "incorrect")]
    assert verify.call_findings(apart, ref, "", []) == []
    assert verify.call_findings(views, views, "", []) == []  # the reference's own outputs overlap alike
    gpu_ref = CallOutputs(("tuple", 2), [leaf("cuda:0", 0, 8 * n, 1 << 33), leaf("cuda:0", 0, 8 * n, 1 << 34)])
    gpu_views = CallOutputs(("tuple", 2), [leaf("cuda:0", 0, 12 * n, handle="h1"), leaf("cuda:0", n, 12 * n, handle="h1")])
    found = [(f.check, f.status) for f in verify.call_findings(gpu_views, gpu_ref, "input", [])]
    assert found == [("output_ownership", "incorrect")]
    gpu_apart = CallOutputs(("tuple", 2), [leaf("cuda:0", 0, 16 * n, handle="h1"), leaf("cuda:0", 2 * n, 16 * n, handle="h1")])
    assert verify.call_findings(gpu_apart, gpu_ref, "input", []) == []  # one allocation, no element shared


def test_a_call_whose_outputs_share_past_the_cap_is_incorrect_unless_the_references_do_too():
    """Past MAX_PAIRS sharing pairs (or MAX_TESTS pairs tested) a call is undecided, which used to
    skip the comparison: one tensor returned 96 times scored ok at 3.05 where the reference computes
    96. Undecided where the reference is not is incorrect; both undecided, nothing to hold to."""
    from cuda_l1.evaluate import output_memory, verify
    from cuda_l1.evaluate.protocol import CallOutputs, LeafRef

    def leaf(address):
        return LeafRef("tensor", "Tensor", "float32", [64, 64], [64, 1], 0, 64 * 64 * 4, "cpu", address)

    same = CallOutputs(("tuple", 96), [leaf(1 << 20)] * 96)
    apart = CallOutputs(("tuple", 96), [leaf((1 << 20) + k * (1 << 16)) for k in range(96)])
    assert output_memory.overlapping_outputs(same) is None and output_memory.overlapping_outputs(apart) == set()
    found = [(f.check, f.status) for f in verify.call_findings(same, apart, "", [])]
    assert found == [("output_ownership", "incorrect")]
    assert verify.call_findings(same, same, "", []) == []
    few = CallOutputs(("tuple", 8), [leaf(1 << 20)] * 8)  # below the cap: every pair, as before
    assert len(output_memory.overlapping_outputs(few)) == 28


@pytest.mark.parametrize("split,shared", [
    (lambda t: (t[:4], t[4:]), False),  # row blocks of one buffer: apart
    (lambda t: (t[:, :4], t[:, 4:]), False),  # column blocks: interleaved, no element shared
    (lambda t: (t[:, ::2], t[:, 1::2]), False),  # alternate columns
    (lambda t: (t[:5], t[3:]), True),  # rows 3 and 4 in both
    (lambda t: (t[:, :5], t[:, 4:]), True),  # column 4 in both
    (lambda t: (t.reshape(-1)[:20], t.reshape(-1)[19:39]), True),  # one element in both
    (lambda t: (t.t(), t), True),  # the same elements in another order
])
def test_outputs_of_one_buffer_share_memory_only_where_an_element_is_in_both(split, shared):
    """The outputs' memory is compared element by element, not by the bytes between each view's ends:
    the column blocks of a fused product's result interleave without sharing and are apart."""
    from cuda_l1.evaluate import output_memory
    from cuda_l1.evaluate.protocol import CallOutputs, LeafRef

    buf = torch.zeros(8, 8)
    leaves = [LeafRef("tensor", "Tensor", "float32", list(v.shape), list(v.stride()), v.storage_offset(), 256, "cpu",
                      1 << 20) for v in split(buf)]
    assert output_memory.overlapping_outputs(CallOutputs(("tuple", 2), leaves)) == ({(0, 1)} if shared else set())


@pytest.mark.parametrize("view,overlapping", [
    (lambda t: t, False), (lambda t: t.t(), False), (lambda t: t[:, ::2], False), (lambda t: t[:0], False),
    (lambda t: torch.zeros(6, 16)[:, 8:], False), (lambda t: torch.zeros(2, 3, 4).permute(2, 0, 1), False),
    (lambda t: t[:, :1].expand(-1, t.shape[1]), True),  # stride 0: a broadcast
    (lambda t: t.reshape(-1)[: t.shape[1] + 3].unfold(0, 4, 1), True),  # overlapping windows
])
def test_a_view_with_gaps_is_reported_and_only_an_overlapping_one_is_incorrect(view, overlapping):
    from cuda_l1.evaluate import output_memory, verify
    from cuda_l1.evaluate.protocol import CallOutputs, LeafRef

    t = view(torch.zeros(6, 8))
    assert output_memory.self_overlapping(list(t.shape), list(t.stride())) is overlapping
    cand = LeafRef("tensor", "Tensor", "float32", list(t.shape), list(t.stride()), t.storage_offset(), 4096, "cpu", 64)
    dense = t.contiguous()
    ref = LeafRef("tensor", "Tensor", "float32", list(dense.shape), list(dense.stride()), 0, 4096, "cpu", 4096)
    found = {f.check: f.status for f in verify.describe_mismatch(CallOutputs(None, [cand]), CallOutputs(None, [ref]))}
    assert found.get("strides") == ("incorrect" if overlapping else None if t.stride() == dense.stride() or not t.numel()
                                    else verify.NOTE)


def test_a_cuda_output_described_by_an_address_is_never_read_from_host_memory():
    """A CUDA output is read through its IPC handle only. A side that describes one by an address (the
    reference's do, to compare places; a forged harness might) is not read from its host memory."""
    import ctypes
    import os

    from cuda_l1.evaluate.protocol import LeafRef
    from cuda_l1.evaluate.remote import RemoteMemory, Unreadable

    host = (ctypes.c_float * 4)(1, 2, 3, 4)
    reader = RemoteMemory("cpu", lambda: os.getpid(), 1 << 20)
    on_cpu = LeafRef("tensor", "Tensor", "float32", [4], [1], 0, 16, "cpu", ctypes.addressof(host))
    assert reader.tensor(on_cpu).tolist() == [1, 2, 3, 4]
    with pytest.raises(Unreadable, match="without an IPC handle"):
        reader.tensor(LeafRef("tensor", "Tensor", "float32", [4], [1], 0, 16, "cuda:0", ctypes.addressof(host)))


def test_speedup_ci_trims_each_side_for_replays_and_takes_medians_by_default():
    """`trim` (for replaying recorded rounds) takes the mean of each side's middle times; the default
    is the median verdicts use."""
    from cuda_l1.evaluate.speedup_stats import speedup_ci

    ref, cand = [1, 1, 1, 1, 2, 3, 3, 3, 3, 100], [1.0] * 10
    assert speedup_ci(ref, cand, seed=1)[0] == pytest.approx(2.5)
    assert speedup_ci(ref, cand, seed=1, trim=0.2)[0] == pytest.approx(13 / 6)
    point, lo, hi = speedup_ci(ref, cand, seed=1, trim=0.2)
    assert lo <= point <= hi


def test_ninety_six_column_blocks_of_one_buffer_are_apart_within_the_cap():
    """Answers looked up are not solves: 96 column blocks of one fused projection's result meet pairwise
    (4560 pairs) but sit in 95 relative places, and were refused past a cap that counted every pair."""
    from cuda_l1.evaluate import output_memory, verify
    from cuda_l1.evaluate.protocol import CallOutputs, LeafRef

    rows, heads, width = 256, 96, 8
    blocks = [LeafRef("tensor", "Tensor", "float32", [rows, width], [heads * width, 1], k * width,
                      rows * heads * width * 4, "cpu", 1 << 20) for k in range(heads)]
    call = CallOutputs(("tuple", heads), blocks)
    assert output_memory.overlapping_outputs(call) == set()
    apart = CallOutputs(("tuple", heads), [LeafRef("tensor", "Tensor", "float32", [rows, width], [width, 1], 0,
                                                   rows * width * 4, "cpu", (1 << 20) + k * (1 << 16)) for k in range(heads)])
    assert {f.status for f in verify.call_findings(call, apart, "", [])} == {verify.NOTE}  # views with gaps


def test_outputs_in_one_shared_memory_at_several_addresses_are_placed_by_the_memory():
    """A memfd mapped twice gives two addresses of one memory: outputs there are placed by the file
    and the offset (as a GPU output by its allocation), so they are seen to share; an output reaching
    out of a shared mapping is no placement at all."""
    from cuda_l1.evaluate import output_memory
    from cuda_l1.evaluate.protocol import CallOutputs, LeafRef

    def leaf(address):
        return LeafRef("tensor", "Tensor", "float32", [1024], [1], 0, 4096, "cpu", address)

    shared = [(0x10000, 0x12000, "00:01:77", 0), (0x20000, 0x22000, "00:01:77", 0), (0x30000, 0x31000, "00:01:78", 0)]
    twice = CallOutputs(("tuple", 2), [leaf(0x10000), leaf(0x20000)])
    assert output_memory.overlapping_outputs(twice) == set()  # by address: apart
    placed = output_memory.physical(twice, shared)
    assert [x.handle for x in placed.leaves] == ["file:00:01:77"] * 2
    assert [x.address for x in placed.leaves] == [0x10000, 0x20000]  # kept: is it in the input buffer?
    assert output_memory.overlapping_outputs(placed) == {(0, 1)}
    assert output_memory.shared_storage([placed]) is None  # one call: what overlapping_outputs judges
    second_page = output_memory.physical(CallOutputs(("tuple", 2), [leaf(0x10000), leaf(0x21000)]), shared)
    assert output_memory.overlapping_outputs(second_page) == set()  # the other page of the file
    other_file = output_memory.physical(CallOutputs(("tuple", 2), [leaf(0x10000), leaf(0x30000)]), shared)
    assert output_memory.overlapping_outputs(other_file) == set()
    private = CallOutputs(("tuple", 1), [leaf(0x40000)])
    assert output_memory.physical(private, shared) == private
    assert output_memory.physical(CallOutputs(("tuple", 1), [leaf(0x11800)]), shared) is None  # past its end
    assert output_memory.physical(CallOutputs(("tuple", 1), [leaf(0x2f800)]), shared) is None  # into one


def test_a_calls_outputs_are_read_once_over_the_union_of_their_spans_within_one_limit():
    """On a CPU a call's outputs are read stretch by stretch over the union of their spans, each once,
    and the limit bounds that union: 16 gappy views of a 32-column buffer were each read whole (the
    cost grew with the square of the outputs), and any layout reads back the same values."""
    import os

    from cuda_l1.evaluate import output_memory, remote
    from cuda_l1.evaluate.protocol import LeafRef
    from cuda_l1.evaluate.remote import RemoteMemory, Unreadable

    buf, small, wide = torch.randn(64, 32), torch.arange(10, dtype=torch.int16), torch.randn(5, 7).t()

    def ref_of(t):
        return LeafRef("tensor", "Tensor", str(t.dtype).replace("torch.", ""), list(t.shape), list(t.stride()),
                       t.storage_offset(), t.untyped_storage().nbytes(), "cpu", t.untyped_storage().data_ptr())

    views = [buf[:, k] for k in range(16)] + [buf[3:9, 2:5], small[1:], wide, buf.reshape(-1)[7:8]]
    memory = RemoteMemory("cpu", os.getpid, 1 << 30)
    reads = []
    original = remote._vm_read
    try:
        remote._vm_read = lambda pid, address, nbytes, into=None: reads.append(nbytes) or original(pid, address, nbytes)
        got = memory.call_tensors([ref_of(v) for v in views], output_memory.read_limit([16 * 64 * 4]))
    finally:
        remote._vm_read = original
    assert all(not isinstance(g, Unreadable) and torch.equal(g, v) for g, v in zip(got, views))
    # each stretch once: the buffer from its first element to row 63's 16th, the int16 tensor from its second
    assert sorted(reads) == sorted([(63 * 32 + 16) * 4, (small.numel() - 1) * 2, wide.numel() * 4])
    assert all(isinstance(g, Unreadable) for g in memory.call_tensors([ref_of(v) for v in views], 1000))
    # An output with no address is refused alone and nothing is read for it (it once sent the whole call
    # down a path that read each output in full, each up to the call's limit, and held them all).
    reads.clear()
    nowhere = LeafRef("tensor", "Tensor", "float32", [64], [1], 0, 256, "cpu", 0)
    try:
        remote._vm_read = lambda pid, address, nbytes, into=None: reads.append(nbytes) or original(pid, address, nbytes)
        got = memory.call_tensors([ref_of(buf[:, 0]), nowhere], output_memory.read_limit([512]))
    finally:
        remote._vm_read = original
    assert torch.equal(got[0], buf[:, 0]) and isinstance(got[1], Unreadable) and reads == [(63 * 32 + 1) * 4]
    # Two outputs, each a view of its own buffer with three times its rows' pitch, are read.
    assert output_memory.read_limit([16 << 20, 16 << 20]) >= 2 * 3 * (16 << 20)


@pytest.mark.timeout(60)
def test_the_static_scan_takes_bounded_time():
    # It runs in the parent, holding the GIL, before the evaluation's deadline. A line of `compile(`
    # repeated made an unbounded span quadratic (12 s at 256 KB, 38 s at 512 KB), and CPython's parser is
    # quadratic on an f-string of many fields (93 s at 1 MiB): each took minutes at the sizes below.
    from cuda_l1.evaluate import static_scan

    size = "1024 KiB of source; its first 256 KiB searched, 64 KiB parsed"
    assert static_scan.scan("import torch\n# " + "compile(" * (1 << 17) + "\n") == {"size": [size]}
    assert static_scan.scan("x = f'" + "{a}" * ((1 << 20) // 3) + "'\n")["size"][0].startswith("1024 KiB")
    huge = "x = 1\n" * (1 << 19) + "import threading\n"  # past what is searched: named, not read whole
    assert static_scan.scan(huge) == {"size": ["3072 KiB of source; its first 256 KiB searched, 64 KiB parsed"]}
    near = static_scan.scan("a = 1\ny = compile(src, 'f', 'exec')\r\nimport threading\n")
    assert near == {"harness inspection": ["line 2: y = compile(src, 'f', 'exec')"],
                    "threads or processes": ["line 3: import threading"]}


def test_a_reference_whose_outputs_ignore_its_inputs_is_named_in_its_verdicts():
    # KernelBench level 2 task 66: a softmax over a dimension of size 1 is all ones whatever the input, so a
    # candidate returning ones is correct (it scored 8-9x). Not refused: the verdict says it is the task's.
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.evaluator import evaluate
    from cuda_l1.tasks import Task
    from cuda_l1.tasks.runtime import load_task_module, run_reference_once

    source = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, 16)

    def forward(self, x):
        return torch.softmax(self.linear(x).mean(dim=1, keepdim=True), dim=1)


def get_inputs():
    return [torch.randn(32, 24)]


def get_init_inputs():
    return [24]
"""
    run = lambda text: run_reference_once(load_task_module(Task(name="t", level=2, source=text)), "t.py")  # noqa: E731
    assert run(source).ignores_inputs is True
    assert run(source.replace("dim=1)\n", "dim=0)\n")).ignores_inputs is False  # over the batch: it depends
    assert run(source.replace("torch.randn(32, 24)", "torch.ones(32, 24)")).ignores_inputs is False  # cannot tell
    ones = "import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self, n):\n        super().__init__()\n" \
           "    def forward(self, x):\n        return torch.ones(x.shape[0], 1)\n"
    config = EvalConfig(device="cpu", timing=TimingConfig(enabled=False))
    verdict = evaluate(Task(name="t", level=2, source=source), ones, config)
    assert verdict.status == "ok", verdict.reasons
    check = verdict.check("reference_uses_inputs")
    assert check is not None and check.passed is False and check.blocking is False
    over_batch = source.replace("dim=1)\n", "dim=0)\n")
    honest = evaluate(Task(name="t", level=2, source=over_batch), over_batch.replace("class Model(", "class ModelNew("),
                      config)
    assert honest.status == "ok" and honest.check("reference_uses_inputs") is None
