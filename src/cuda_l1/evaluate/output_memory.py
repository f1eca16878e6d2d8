"""Where a call's outputs lie, from the sides' descriptions alone: which outputs share memory (one
call's, element by element; different calls', by storage), whether a view overlaps itself, whether an
output lies in the input buffer, and how many bytes reading one may cost. Nothing here reads memory.
"""

from __future__ import annotations

import bisect
import dataclasses

from cuda_l1.evaluate.protocol import ITEMSIZE, CallOutputs, LeafRef


def self_overlapping(shape: list[int], stride: list[int]) -> bool:
    """Whether two positions of a view may share memory: unless each dimension's stride, from the
    smallest, clears everything the smaller ones reach (a dense layout in any order, or one with gaps),
    it counts as overlapping. Layouts that interleave without sharing and are not nested this way
    count too: no PyTorch operation makes one, and a candidate building one by hand gets the doubt."""
    if any(n == 0 for n in shape):
        return False  # no elements, no memory
    reach = 1  # elements the dimensions so far span, plus one
    for st, n in sorted((st, n) for st, n in zip(stride, shape) if n > 1):
        if st < reach:
            return True
        reach += (n - 1) * st
    return False


def dense_layout(shape: list[int], stride: list[int]) -> bool:
    """Whether a layout is some order of a dense, non-overlapping one: each dimension's stride, taken
    from the smallest, is the product of the sizes before it (no stride 0, no two dimensions sharing
    memory, no gaps)."""
    if any(n == 0 for n in shape):
        return True  # no elements, no memory
    expected = 1
    for st, n in sorted((st, n) for st, n in zip(stride, shape) if n > 1):
        if st != expected:
            return False
        expected *= n
    return True


MAX_PAIRS = 4096  # sharing pairs of one call's outputs collected; at the cap the call is undecided
MAX_TESTS = 4096  # pairs of one call solved element by element (_share_elements), answers kept aside; past it, undecided
MAX_LOOKS = 1 << 16  # pairs of one call whose bytes meet, answered or looked up (a few us each); past it, undecided


def placed(call: CallOutputs) -> bool:
    """Whether every tensor output of the call says where its memory is: an IPC handle (a candidate's
    CUDA output), or an address in the side's own memory (a CPU output; the reference's CUDA output,
    which its side describes by address since it exports no handle)."""
    return all(leaf.handle or leaf.address for leaf in call.leaves if leaf.kind == "tensor" and leaf.numel())


def overlapping_outputs(call: CallOutputs) -> set[tuple[int, int]] | None:
    """Pairs (i, j), i < j, of one call's tensor outputs that share memory: the bytes from each view's
    first element to its last, sorted and swept (each output compared with those still open only),
    then each pair whose bytes meet tested element by element (_share_elements), so that two column
    blocks of one buffer, interleaved but apart, are not a pair. None (undecided) once MAX_PAIRS pairs
    share, MAX_TESTS pairs needed a solve of their own (each costs the parent up to 0.2 ms) or MAX_LOOKS
    pairs met. (Solves were once counted with the answers looked up: 96 column blocks of one fused
    projection's result, 95 solves, were 4560 tests, and an honest candidate was refused.)"""
    spans = sorted((_view_span(leaf), index) for index, leaf in enumerate(call.leaves)
                   if leaf.kind == "tensor" and leaf.numel())
    pairs: set[tuple[int, int]] = set()
    looks = solves = 0
    open_spans: list[tuple[str, int, int]] = []  # (allocation, end, output index)
    for (alloc, lo, hi), index in spans:
        open_spans = [span for span in open_spans if span[0] == alloc and span[1] > lo]
        for _, _, other in open_spans:
            looks += 1
            shares, solved = _share_elements(call.leaves[other], call.leaves[index])
            solves += solved
            if looks > MAX_LOOKS or solves > MAX_TESTS:
                return None
            if shares:
                pairs.add((min(other, index), max(other, index)))
                if len(pairs) >= MAX_PAIRS:
                    return None
        open_spans.append((alloc, hi, index))
    return pairs


def _view_span(ref: LeafRef) -> tuple[str, int, int]:
    """(allocation, first byte, end) of the bytes a view reaches from its first element (strides are
    never negative, so that is its lowest)."""
    alloc, start, end = _span(ref)
    return alloc, start + ref.storage_offset * ITEMSIZE[ref.dtype], end


SHARE_WORK = 1000  # numpy's effort bound for one pair (a layout harder than that counts as shared): torch's
# splits, chunks, unbinds and step slices of one buffer are solved within 1; a hard pair costs about 0.2 ms


def _share_elements(a: LeafRef, b: LeafRef) -> tuple[bool, bool]:
    """Whether two views of one allocation have a byte in common, solved exactly (numpy's bounded
    Diophantine test on views at made-up addresses with the leaves' offsets, shapes, strides and item
    sizes: nothing is read), and whether that took a solve. Layouts too hard to solve within
    SHARE_WORK, or too large for numpy, count as sharing. Only where the two views sit relative to each
    other matters, so answers are kept by that (every checked call of a candidate returns the same
    layout, each round)."""
    (_, lo_a, _), (_, lo_b, _) = _view_span(a), _view_span(b)
    key = (lo_b - lo_a, tuple(a.shape), tuple(a.stride), ITEMSIZE[a.dtype], tuple(b.shape), tuple(b.stride),
           ITEMSIZE[b.dtype])
    known = _SOLVED.get(key)
    if known is not None:
        return known, False
    if len(_SOLVED) >= _SOLVED_KEPT:
        _SOLVED.clear()
    _SOLVED[key] = answer = _share_solved(*key)
    return answer, True


_SOLVED: dict[tuple, bool] = {}  # _share_elements' answers by relative layout
_SOLVED_KEPT = 1 << 14


def _share_solved(gap: int, shape_a: tuple, stride_a: tuple, item_a: int, shape_b: tuple, stride_b: tuple,
                  item_b: int) -> bool:
    """_share_elements for two views whose first elements are `gap` bytes apart (b's minus a's)."""
    import numpy as np

    try:
        a = np.asarray(_ArrayAt(_FAKE_BASE + max(-gap, 0), shape_a, stride_a, item_a))
        b = np.asarray(_ArrayAt(_FAKE_BASE + max(gap, 0), shape_b, stride_b, item_b))
        return bool(np.shares_memory(a, b, max_work=SHARE_WORK))
    except (getattr(np, "exceptions", np).TooHardError, ValueError, OverflowError):  # (a layout numpy
        return True  # cannot hold: leaves passed validate.py's bounds do not make one; in doubt, shared)


_FAKE_BASE = 1 << 40  # where _share_elements places the lower view: any address numpy will not take for NULL


class _ArrayAt:
    """A numpy array interface describing a view at `start` (its first element), never read."""

    def __init__(self, start: int, shape: tuple, stride: tuple, item: int):
        self.__array_interface__ = {"data": (start, True), "shape": shape, "version": 3,
                                    "strides": tuple(st * item for st in stride), "typestr": f"|V{item}"}


def _span(ref: LeafRef) -> tuple[str, int, int]:
    """(allocation, first byte, end) of the storage a leaf views, from the storage's start."""
    if ref.handle:
        return ref.handle, ref.handle_offset, ref.handle_offset + max(ref.extent_bytes(), 1)
    return "cpu", ref.address, ref.address + max(ref.extent_bytes(), 1)


def physical(call: CallOutputs, files: list[tuple[int, int, str, int]]) -> CallOutputs | None:
    """The call with every CPU output that lies in a mapping of a file (remote.file_mappings: start, end,
    file, offset) placed by that file and offset instead of its address, as a GPU output is placed by
    its allocation: one memfd mapped at 96 addresses, shared or private and never written there, gave 96
    outputs that seemed apart and were one. Its address stays (is it in the input buffer?). None where an
    output reaches from such a mapping into other memory (no allocator makes that)."""
    if not files:
        return call
    starts, leaves = [m[0] for m in files], []
    for leaf in call.leaves:
        if leaf.kind != "tensor" or leaf.handle or not leaf.numel():
            leaves.append(leaf)
            continue
        lo, hi = leaf.address, leaf.address + max(leaf.extent_bytes(), 1)
        first = max(bisect.bisect_right(starts, lo) - 1, 0)
        met = [m for m in files[first:bisect.bisect_left(starts, hi)] if m[0] < hi and lo < m[1]]
        if not met:
            leaves.append(leaf)
        elif len(met) == 1 and met[0][0] <= lo and hi <= met[0][1]:
            start, _, file, offset = met[0]
            leaves.append(dataclasses.replace(leaf, handle="file:" + file, handle_offset=offset + lo - start))
        else:
            return None
    return dataclasses.replace(call, leaves=leaves)


def shared_storage(calls: list[CallOutputs]) -> str | None:
    """Outputs of different calls of one window that share memory: a static buffer reused per call,
    which overwrites what an earlier caller already received. (Sorted by address and swept once, so
    a window of many calls with many outputs costs the parent n log n, not n squared.)"""
    spans = sorted((_span(leaf), index) for index, call in enumerate(calls) for leaf in call.leaves
                   if leaf.kind == "tensor" and leaf.numel())
    reach: dict[str, tuple[int, int]] = {}  # allocation -> (furthest end so far, the call it belongs to)
    for (alloc, lo, hi), index in spans:
        end, owner = reach.get(alloc, (-1, -1))
        if lo < end and owner != index:
            first, second = sorted((owner, index))
            return f"calls {first + 1} and {second + 1} of one window returned outputs in the same memory"
        if hi > end:
            reach[alloc] = (hi, index)
    return None


def read_limit(reference_spans) -> int:
    """The most bytes a candidate's call's outputs may span when read (on a CPU, their union, each
    stretch read once; on a GPU, each output's own view): four times what all of the reference's
    outputs of the call span together, plus 16 MiB. Refused before: two outputs, each a view of a
    buffer with three times its rows' pitch (twice plus 16 MiB); the three column blocks of a fused
    QKV projection's result (one output's own span); a one-column slice of a 256-column product, an
    8 KiB output spanning 2 MiB (plus 1 MiB)."""
    return 4 * sum(reference_spans) + (16 << 20)


def span_bytes(leaf: LeafRef) -> int:
    """Bytes from a view's first element to its last: what reading it costs."""
    return leaf.extent_bytes() - leaf.storage_offset * ITEMSIZE.get(leaf.dtype, 1) if leaf.numel() else 0


def aliases(leaf: LeafRef, input_handle: str, input_ranges: list[tuple[int, int]]) -> bool:
    """An output in the side's input buffer (its handle, or inside the mapping the kernel lists)."""
    if leaf.kind != "tensor" or leaf.numel() == 0:
        return False
    if leaf.handle and not leaf.handle.startswith("file:"):  # a CPU output placed by its file keeps its address
        return leaf.handle == input_handle
    lo, hi = leaf.address, leaf.address + leaf.extent_bytes()
    return any(lo < b and a < hi for a, b in input_ranges)
