"""A window's later calls described by pointers in the first call's layout (describe.py), and rebuilt
by the parent when it decodes the reply (validate.py)."""

import pytest
import torch

from cuda_l1.evaluate import describe, doorbell
from cuda_l1.evaluate.describe import Describer
from cuda_l1.evaluate.protocol import ProtocolError, Ran, encode
from cuda_l1.evaluate.validate import decode


def _decoded(calls, exports=()):
    return decode(encode(Ran(True, calls=calls, exports=[list(e) for e in exports])), from_side=True)


def test_later_calls_of_one_layout_are_pointers_and_rebuild_to_their_full_description():
    d = Describer()
    outs = [torch.randn(8, 4) for _ in range(3)] + [torch.randn(4, 8).t()]  # the last: other strides
    calls = [d.first(outs[0])] + [d.later(o) for o in outs[1:]]
    assert [type(c) for c in calls[1:]] == [list, list, type(calls[0])]
    assert calls[1] == [outs[1].data_ptr()]
    ran = _decoded(calls)
    for out, call in zip(outs, ran.calls):
        full = d.full(out)
        # the same memory, as the parent reads it and as a ring names it
        assert [doorbell.leaf_span(leaf) for leaf in call.leaves] == [doorbell.leaf_span(leaf) for leaf in full.leaves]
        assert [(leaf.dtype, leaf.shape, leaf.stride) for leaf in call.leaves] == \
            [(leaf.dtype, leaf.shape, leaf.stride) for leaf in full.leaves]


def test_tuples_of_tensors_by_pointer_anything_else_in_full():
    d = Describer()
    pair = lambda: (torch.randn(3), torch.randn(2, 2))  # noqa: E731
    d.first(pair())
    second = pair()
    assert d.later(second) == [t.data_ptr() for t in second]
    assert not isinstance(d.later([*pair()]), list)  # a list where the first call returned a tuple
    assert not isinstance(d.later((torch.randn(3), torch.randn(2, 2).double())), list)
    d.first((torch.randn(3), 7))  # a value among the outputs: every call in full
    assert not isinstance(d.later((torch.randn(3), 7)), list)
    d.first(((torch.randn(3),), torch.randn(3)))  # nested
    assert not isinstance(d.later(((torch.randn(3),), torch.randn(3))), list)
    d.first(torch.randn(3))
    assert not isinstance(d.later(torch.randn(3).to_sparse()), list)  # no strides: in full, no error
    meta = d.later(torch.empty(3, device="meta"))  # in full, or at pointer 0, which no read gets past
    assert not isinstance(meta, list) or meta == [0]


def test_a_reply_that_cannot_be_rebuilt_is_a_protocol_error():
    d = Describer()
    first = d.first(torch.randn(4))
    with pytest.raises(ProtocolError, match="first call"):
        _decoded([[123]])
    with pytest.raises(ProtocolError, match="one pointer each"):
        _decoded([first, [1, 2]])
    with pytest.raises(ProtocolError):
        _decoded([first, [-1]])
    with pytest.raises(ProtocolError, match="export"):
        _decoded([first], exports=[("zz", 1, 1)])
    cpu_with_handle = d.full(torch.randn(4))
    cpu_with_handle.leaves[0].handle = "ab" * 64  # would skip the address checks, then fail to open
    with pytest.raises(ProtocolError, match="not on a GPU"):
        _decoded([cpu_with_handle])
    # An output described by IPC handle: its later pointers must fall inside an allocation the reply names.
    gpu = d.full(torch.randn(4))
    gpu.leaves[0].device, gpu.leaves[0].handle, gpu.leaves[0].address = "cuda:0", "ab" * 64, 0
    handle = "cd" * 64
    ran = _decoded([gpu, [5000 + 16]], exports=[(handle, 5000, 64)])
    leaf = ran.calls[1].leaves[0]
    assert (leaf.handle, leaf.handle_offset, leaf.address) == (handle, 16, 0)
    with pytest.raises(ProtocolError, match="no allocation"):
        _decoded([gpu, [4000]], exports=[(handle, 5000, 64)])
    with pytest.raises(ProtocolError, match="reaches past"):
        _decoded([gpu, [5000 + 60]], exports=[(handle, 5000, 64)])


def test_span_bytes_is_what_a_ring_names():
    for t in (torch.randn(5, 3), torch.randn(5, 3)[:, 1:], torch.randn(0, 3), torch.randn(4, 4).t()):
        leaf = Describer().full(t).leaves[0]
        assert describe.span_bytes(leaf) == doorbell.leaf_span(leaf)[1]


def test_a_call_runs_forward_itself_only_where_module_call_would_add_nothing():
    from cuda_l1.evaluate.child import _entry

    plain = torch.nn.ReLU()
    assert _entry(plain) == plain.forward  # Module.__call__ would only call it
    hooked = torch.nn.ReLU()
    hooked.register_forward_hook(lambda module, args, out: out + 1)
    assert _entry(hooked) is hooked
    compiled = torch.nn.ReLU()
    compiled.compile()
    assert _entry(compiled) is compiled

    class OwnCall(torch.nn.Module):
        def __call__(self, x):
            return x * 2

    own = OwnCall()
    assert _entry(own) is own
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
    try:
        assert _entry(torch.nn.ReLU()) is not None and not hasattr(_entry(torch.nn.ReLU()), "__func__")
    finally:
        handle.remove()
    assert _entry(lambda x: x)(3) == 3  # not a module at all: called as it is


def test_past_a_window_that_matched_later_calls_ring_by_pointer_and_are_compared_after():
    """CPU: the layout comparison leaves the call's time once one window's later calls all matched; a
    call that then differs is described in full (its reply differs from its ring: refused as
    unstable), and from then on every window compares inside the call again."""
    d = Describer()
    assert not d.trusted
    outs = [torch.randn(8, 4) for _ in range(3)]
    d.window_done([d.first(outs[0])] + [d.later(o) for o in outs[1:]])
    assert d.trusted and d.matched_windows == 1
    d.first(outs[0])
    same, other = torch.randn(8, 4), torch.randn(4, 8).t()
    assert d.confirm(same, d.pointers(same)) == [same.data_ptr()]
    assert d.pointers(other) == [other.data_ptr()]  # no comparison before the ring ...
    described = d.confirm(other, d.pointers(other))  # ... it comes after, and finds the difference
    assert not isinstance(described, list) and described.leaves[0].stride == [1, 8]
    assert d.varied and not d.trusted


def test_a_window_whose_later_calls_differ_keeps_the_comparison_inside_the_call():
    d = Describer()
    d.window_done([d.first(torch.randn(8, 4)), d.later(torch.randn(4, 8).t())])
    assert d.varied and not d.trusted
    d.window_done([d.first(torch.randn(8, 4)), d.later(torch.randn(8, 4))])
    assert not d.trusted  # once varied, always compared in the call
    single = Describer()
    single.window_done([single.first(torch.randn(3))])  # a window of one call shows nothing
    assert not single.trusted and single.matched_windows == 0




_VARYING = '''
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls, self.since = 0, None

    def forward(self, x):
        self.since = self.since or time.monotonic()
        self.calls += 1
        if self.calls % 2 or time.monotonic() - self.since < 0.5:
            return torch.relu(x)
        return {other}
'''

_RELU = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("other, status, check", [
    ("torch.relu(x).t().contiguous().t()", "ok", "strides"),  # the same values and memory, column-major
    # rows 65 apart: refused as unstable on a window's later call; where the switch (0.5 s after the
    # first call) lands on a window's first call (a busy host: its windows run late), that call is
    # described in full and judged a broadcast or overlapping view
    ("torch.relu(nn.functional.pad(x, (0, 1)))[:, :64]", "rejected|incorrect", "outputs_stable|strides"),
    ("torch.relu(x).to_sparse()", "rejected", "output_type"),  # no storage: described in full, refused
])
def test_a_layout_that_changes_once_the_windows_matched(other, status, check):
    """Past its first windows a CPU side rings a later call's bare pointers and compares the layout
    after the ring. An honest output differs only in its order (a dense layout of the reference's
    shape spans the same memory), which is what the ring named: judged by the reply's full
    description, the strides noted. Other memory than the ring named is refused as unstable."""
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.evaluator import evaluate
    from cuda_l1.tasks import make_task

    timing = TimingConfig.quick()
    timing.max_time_s = 2.0
    verdict = evaluate(make_task(_RELU, name="relu", level=1, origin="test"), _VARYING.replace("{other}", other),
                       EvalConfig(device="cpu", timing=timing))
    assert verdict.status in status.split("|"), verdict.reasons
    assert any(verdict.check(name) is not None and verdict.check(name).passed is False for name in check.split("|"))
    if status == "ok":  # what the kernel counted for each side's process, read by the parent
        assert all(verdict.timing["sides"][name]["cpu_s"] > 0 for name in ("reference", "candidate"))


_MASKED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x[x > 3.5]  # the values above 3.5: most calls none, now and then one or two


def get_inputs():
    return [torch.randn(256)]


def get_init_inputs():
    return []
'''


def test_an_output_whose_shape_follows_the_input_values_is_judged_ok():
    """A later call rings its bare pointers only with the first call's shapes: x[x > t] has as many
    values as its input puts above t (mostly none here, so the first windows match), so its calls
    differ in shape now and then, and each that does is described in full."""
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.evaluator import evaluate
    from cuda_l1.tasks import make_task

    timing = TimingConfig.quick()
    timing.max_time_s = 2.0
    for _ in range(3):
        verdict = evaluate(make_task(_MASKED, name="mask", level=1, origin="test"),
                           _MASKED.replace("class Model(", "class ModelNew("), EvalConfig(device="cpu", timing=timing))
        assert verdict.status == "ok", verdict.reasons


def test_empty_outputs_never_ring_bare_pointers():
    """An empty tensor's data_ptr() is 0 while its full description names its storage: rung by a
    bare pointer it would name other memory than the reply, and honest code would be refused."""
    d = Describer()
    d.first(torch.randn(4, 8)[:0])
    assert d.pointers is None
    d.first((torch.randn(3), torch.randn(2)[:0]))
    assert d.pointers is None
    d.first(torch.randn(4, 8))
    assert d.pointers(torch.randn(8, 4)) is not None  # the same byte size: rung by pointer


def test_the_harness_work_of_a_call_is_timed_whole_on_a_page_no_parent_reads():
    """What a loop of the candidate's own could skip in a CPU call is all of the harness's work in it
    (the go word, the pointers, the ring, the layout compared after it): timed warm, as the bound of
    timing.harness_cap, on a page of the side's own, without touching the real ring or the describer."""
    d = Describer()
    d.first(torch.randn(8, 4))
    bell, out = doorbell.SideBell(), torch.randn(8, 4)
    before = bytes(bell.page)
    work = bell.harness_work_s(out, d)
    assert 0 < work < 0.01
    assert bytes(bell.page) == before  # the real ring untouched
    assert not d.varied and bell.harness_work_s(torch.randn(4, 8).t(), d) > 0 and not d.varied
    assert work > _timed(lambda: d.pointers(out))  # more than the pointer reader alone, the old measure


def _timed(fn, repeats: int = 5) -> float:
    import time

    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return sorted(samples)[repeats // 2]


def test_a_cpu_speedup_is_credited_only_with_the_harness_work_added_to_the_candidate():
    from cuda_l1.evaluate.timing import harness_cap

    assert harness_cap(1.10, 0.0140, 0.0127, 3.5e-6) == 1.0  # what a skipped loop gains: nothing
    assert harness_cap(2.0, 0.050, 0.025, 3.5e-6) == pytest.approx(0.050 / 0.0285)  # an honest 2x on 50 us calls
    assert harness_cap(2.0, 5.0, 2.5, 3.5e-6) == pytest.approx(2.0, rel=0.003)  # ms calls: next to nothing
    assert harness_cap(0.8, 0.0140, 0.0175, 3.5e-6) == 0.8  # never below what was measured, nor below 1 for it
    assert harness_cap(1.5, 0.050, 0.030, 0.0) == 1.5  # no measure of the work (a GPU side): as it was
