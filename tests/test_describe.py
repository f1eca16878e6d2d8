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
