"""A CPU input buffer's slots start at a shift drawn for each pair of rounds, the same for both sides (slots.SHIFT_SPAN):
where an output lies against its input modulo a page changed one task's speed twofold, and a fixed
placement gave one side's process the fast case. The parent's writes, checks and leaf ranges and the
side's views must all agree on the round's shift."""

from __future__ import annotations

import os

import pytest
import torch

from cuda_l1.evaluate import child, protocol
from cuda_l1.evaluate.slots import SHIFT_SPAN, SHIFT_STEP, InputSource, SlotBuffer
from cuda_l1.tasks import Task
from cuda_l1.tasks.runtime import load_task_module

TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b, k):
        return a * k + b.sum()


def get_inputs():
    return [torch.randn(8, 5), torch.randn(3), 2]


def get_init_inputs():
    return []
"""


@pytest.fixture
def source():
    return InputSource(load_task_module(Task(name="shift", level=1, source=TASK)), "cpu", "shift")


def test_shifts_are_drawn_over_the_whole_span_in_aligned_steps(source):
    buffer = SlotBuffer(source, 2, os.memfd_create("shift-draw", os.MFD_ALLOW_SEALING))
    try:
        assert buffer.nbytes == 2 * source.slot_bytes + SHIFT_SPAN
        drawn = {buffer.draw_shift() for _ in range(4000)}
        assert drawn == set(range(0, SHIFT_SPAN, SHIFT_STEP))  # every residue a 64-byte-aligned output may have
        for bad in (SHIFT_STEP // 2, SHIFT_SPAN, -SHIFT_STEP):
            with pytest.raises(ValueError):
                buffer.set_shift(bad)
    finally:
        buffer.close()


def test_the_parent_and_the_side_agree_on_a_rounds_shift(source):
    """The parent writes and checks a round's slots at its shift; the side, told the shift in its Run,
    calls the model on exactly those bytes, at addresses that move with the shift."""
    memfd = os.memfd_create("shift-inputs", os.MFD_ALLOW_SEALING)
    buffer = SlotBuffer(source, 2, memfd)
    side = child.Side(chan=None, device="cpu", notes={}, inputs_fd=memfd)
    sent, seen = [], []

    class Probe(torch.nn.Module):
        def forward(self, a, b, k):
            seen.append((a.data_ptr(), a.clone(), b.clone(), k))
            return a * k

    side.send = sent.append
    try:
        side.map_inputs(buffer.message())
        assert sent.pop().ok
        side.model = Probe()
        base = None
        for shift in (0, 64, 1344, SHIFT_SPAN - SHIFT_STEP):
            buffer.set_shift(shift)
            values = [source.generate(shift + slot) for slot in range(2)]
            for slot in range(2):
                buffer.write(slot, values[slot])
            side.run(protocol.Run([0, 1], shift=shift))
            assert sent.pop().ok
            for slot, (ptr, a, b, k) in enumerate(seen):
                assert torch.equal(a, values[slot][0]) and torch.equal(b, values[slot][1]) and k == 2
                assert buffer.unchanged(slot, values[slot])
                offset, nbytes = buffer.leaf_ranges(slot)[0]
                base = ptr - offset if base is None else base
                assert ptr - base == offset and nbytes == a.numel() * a.element_size()
            seen.clear()
        packed, _ = source.pack(values)
        buffer.write_packed(packed, 2)
        assert buffer.holds_packed(packed, 2)
        buffer.set_shift(0)  # the same bytes, read at another round's shift
        assert not buffer.unchanged(1, values[1])
    finally:
        side.shifted, side.slots = {}, []
        if side.mapping is not None:
            side.mapping.close()
        buffer.close()


def test_a_run_message_carries_its_shift_and_one_off_the_steps_is_refused():
    from cuda_l1.evaluate.validate import decode

    header = protocol.encode(protocol.Run([0], shift=128))
    assert decode(header, from_side=False).shift == 128
    for bad in (SHIFT_SPAN, SHIFT_STEP // 2, -SHIFT_STEP):
        with pytest.raises(protocol.ProtocolError):
            decode({**header, "shift": bad}, from_side=False)


class Scale(torch.nn.Module):
    def forward(self, a, b, k):
        return a * k


def test_a_window_builds_no_views_the_side_built_every_shifts_views_when_it_mapped_its_inputs(source, monkeypatch):
    """Built in the window, the views were harness work (about 10 us a tensor) that a candidate could
    patch away while the reference's side paid for it: a window only picks the round's set."""
    from cuda_l1.evaluate import input_views

    memfd = os.memfd_create("shift-ahead", os.MFD_ALLOW_SEALING)
    buffer = SlotBuffer(source, 3, memfd)
    side = child.Side(chan=None, device="cpu", notes={}, inputs_fd=memfd)
    sent = []
    side.send = sent.append
    try:
        side.map_inputs(buffer.message())
        assert sent.pop().ok and sorted(side.shifted) == list(range(0, SHIFT_SPAN, SHIFT_STEP))
        monkeypatch.setattr(input_views, "slot_views", lambda *a: pytest.fail("views built in a window"))
        side.model = Scale()
        for shift in (640, 0, 4032):
            side.run(protocol.Run([0, 1, 2], shift=shift))
            assert sent.pop().ok and side.shift == shift
        side.run(protocol.Run([0], shift=4032))
        assert sent.pop().ok
    finally:
        side.shifted, side.slots = {}, []
        if side.mapping is not None:
            side.mapping.close()
        buffer.close()


def test_a_buffer_of_many_input_tensors_is_not_shifted(source):
    """Many slots hold small inputs and many calls a window: 64 sets of views would cost the side more
    than the shift is worth there (input_views.MAX_SHIFTED_TENSORS)."""
    from cuda_l1.evaluate.input_views import MAX_SHIFTED_TENSORS

    many = MAX_SHIFTED_TENSORS  # two tensors a slot: twice the cap
    buffer = SlotBuffer(source, many, os.memfd_create("shift-many", os.MFD_ALLOW_SEALING))
    side = child.Side(chan=None, device="cpu", notes={}, inputs_fd=-1)
    try:
        assert buffer.span == 0 and {buffer.draw_shift() for _ in range(50)} == {0}
        assert buffer.nbytes == many * source.slot_bytes
        side.send = lambda msg: None
        side.inputs_fd = os.memfd_create("shift-many-side", os.MFD_ALLOW_SEALING)
        os.ftruncate(side.inputs_fd, buffer.nbytes)
        side.map_inputs(buffer.message())
        assert list(side.shifted) == [0]
    finally:
        if side.mapping is not None:
            side.mapping.close()
        buffer.close()
