"""settled_outputs.py: positions of a window's outputs read right after it, held against the same positions
later. Checked on CPU tensors (the reference's side does the same with views of the candidate's GPU memory)."""

import random

import torch

from cuda_l1.evaluate.settled_outputs import SPOTS, changed, draw_calls, take


def test_nothing_changed_is_settled():
    outputs = [(0, [torch.randn(64, 32), None], random.Random(1)),
               (3, [torch.randn(8).t(), torch.tensor([], dtype=torch.float32)], random.Random(2))]
    held = take(outputs)
    assert len(held) == 2 and all(len(h.positions) == SPOTS for h in held)
    assert changed(held) == ""


def test_a_write_after_the_window_is_seen():
    late = torch.zeros(256)  # the output as it was when the window ended: its work had not run
    held = take([(5, [torch.ones(4), late], random.Random(2))], spots=64)
    late.copy_(torch.randn(256))  # the deferred work, finished before verification
    reason = changed(held)
    assert reason.startswith("call 6, output 1:") and "after its window" in reason


def test_strided_views_are_read_where_they_lie():
    base = torch.zeros(16, 16)
    column = base[:, 3]  # a view with gaps
    held = take([(0, [column], random.Random(3))], spots=32)
    base[:, 4] = 1.0  # beside it: not the output
    assert changed(held) == ""
    base[:, 3] = 1.0
    assert changed(held) != ""


def test_bytes_not_values():
    nan = torch.full((8,), float("nan"))
    assert changed(take([(0, [nan], random.Random(4))])) == ""  # NaN stays NaN
    zero = torch.zeros(8)
    held = take([(0, [zero], random.Random(5))])
    zero.neg_()  # -0.0 == 0.0 as a value, not as bytes
    assert changed(held) != ""


def test_other_dtypes():
    flags, pairs = torch.zeros(32, dtype=torch.bool), torch.zeros(8, dtype=torch.complex64)
    held = take([(0, [flags, pairs], random.Random(6))], spots=64)
    assert changed(held) == ""
    pairs.add_(1j)
    assert "output 1" in changed(held)


def test_nothing_to_take():
    assert take([(0, [None, torch.empty(0)], random.Random(8))]) == []
    assert changed([]) == ""


def test_calls_are_drawn_without_repeats():
    rng = random.Random(7)
    assert draw_calls(3, 4, rng) == [0, 1, 2]
    drawn = draw_calls(100, 4, rng)
    assert len(set(drawn)) == 4 and drawn == sorted(drawn)
