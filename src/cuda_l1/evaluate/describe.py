"""How a side tells the parent where its calls' outputs are (`Describer`, in the side), and how the
parent rebuilds that (`rebuild`, in validate.py).

A window's first call is described in full: its structure and, for each leaf, type, dtype, shape,
strides, storage and where it lives (an address on a CPU, an IPC handle on a GPU). Every later call
whose outputs have the first call's layout (the same structure; each tensor of the same type, dtype,
shape, strides and device, as a module returns for inputs of one shape) is described by one pointer
a tensor, to its first element, and the parent rebuilds the description from the first call's.

Why: describing is the harness's own work, inside the side's timed window. In full it cost about
3.5 us a call on a CPU (a GPU adds two driver lookups a tensor), which a candidate that rewrites the
harness's loop could skip: ok at 1.3-1.7x on calls of 20-70 us for code as fast as the reference.
What is left a call (a pointer a tensor and a comparison of its layout) is under half a microsecond.
A side that lies about a pointer only changes which of its own memory the parent reads and checks.

On a CPU, where every call rings (doorbell.py), even that comparison (~0.75 us) was a few percent of a
20 us call that a leaner loop skipped. So once the side has seen one window whose later calls all
matched (a warm-up window: honest code whose layout varies shows it there), a later call rings with
its bare pointers (`pointers`) and its layout is compared after the ring (`confirm`), while the
parent reads the ring and writes the next call's inputs, outside any call's time. A call found
different then is described in full in the reply. Its byte size was compared before the ring (an
output's shape can follow its input's values, as x[x > t] does), and a dense tensor spans its byte
size from its first element, so a dense output spans what its ring named whatever its shape and
order, and is judged by that full description. Any other layout spans other memory than it rang
with, and the parent refuses the window as unstable (gating.unstable), as it refuses any side whose
reply and rings disagree (an output that is not dense and changes layout at the same byte size
inside one evaluation: no honest case is known). Empty outputs always take the full path.

On a GPU the reply also names, once, each allocation its pointers fall in (`Ran.exports`: IPC handle,
base, size); the parent maps every pointer into one of them. The side keeps the allocations it has
seen and confirms each one it names by the driver's buffer id once a window (an allocation freed and
made again at the same address gets a new id), so a call costs a lookup in a sorted list, not two
driver calls. The reference's side makes the same lookups without exporting (it verifies itself).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from cuda_l1.evaluate.doorbell import leaf_span
from cuda_l1.evaluate.protocol import CallOutputs, LeafRef

MAX_POINTERS = 100  # tensors a call described by pointers may return (doorbell.RING_LEAVES: a ring names them all)
_MAX_ALLOCATIONS = 4096  # allocations a side remembers (ids of freed ones are never reused)


def span_bytes(leaf: LeafRef) -> int:
    """Bytes from a tensor leaf's first element to its last (0 when it has none): what a ring names."""
    return leaf_span(leaf)[1]


@dataclass
class Layout:
    """The first call's layout: what a later call must match to be described by pointers."""

    sequence: type | None  # the tuple or list type the tensors came in (None: one tensor)
    tensors: list  # (dtype, shape, strides, on a GPU) of each tensor
    spans: list[int]  # span_bytes of each (what a CPU ring names)


class Describer:
    """The side's half: one per side process."""

    def __init__(self, export: bool = True):
        self.export = export  # CUDA: describe outputs by IPC handle (not the reference's: it verifies itself)
        self.handles: dict[int, str] = {}  # CUDA: the driver's buffer id of an allocation -> its IPC handle
        self.bases: list[int] = []  # CUDA: allocations seen, sorted by base ...
        self.allocations: list[tuple[int, int, int]] = []  # ... as (base, end, buffer id)
        self.layout: Layout | None = None
        self.match = None  # the layout's test of a later call's outputs: their pointers, or None
        self.pointers = None  # the same call's pointers without the test (compared after its ring)
        self.matched_windows = 0  # windows with later calls, every one matching (CPU: see `trusted`)
        self.varied = False  # a later call's layout differed from its window's first call's

    # -- in full -------------------------------------------------------------------------------------
    def full(self, out) -> CallOutputs:
        import torch

        from cuda_l1.evaluate.inputs import flatten_outputs

        structure, leaves = flatten_outputs(out)
        refs = []
        for leaf in leaves:
            # Strings cut here as the parent cuts them (validate.py): a call's record stays within
            # the bytes the parent allows it (reply_limit.py).
            typename = (type(leaf).__module__ + "." + type(leaf).__qualname__)[:200]
            if not isinstance(leaf, torch.Tensor):
                value = leaf if leaf is None or isinstance(leaf, (bool, int, float)) else (
                    leaf[:300] if isinstance(leaf, str) else repr(leaf)[:200])
                refs.append(LeafRef("value", typename, value=value))
                continue
            if type(leaf) is not torch.Tensor or leaf.layout != torch.strided or leaf.device.type not in ("cpu", "cuda"):
                refs.append(LeafRef("foreign", typename, device=str(leaf.device)))
                continue
            if leaf.is_conj() or leaf.is_neg():  # its memory holds other values than it has (read raw: wrong)
                refs.append(LeafRef("foreign", typename + (" with a lazy conjugate bit" if leaf.is_conj() else
                                                           " with a lazy negative bit"), device=str(leaf.device)))
                continue
            storage = leaf.untyped_storage()
            ref = LeafRef("tensor", typename, str(leaf.dtype).replace("torch.", ""), list(leaf.shape),
                          list(leaf.stride()), leaf.storage_offset(), storage.nbytes(), str(leaf.device))
            ptr = storage.data_ptr()
            if leaf.device.type == "cuda" and storage.nbytes():
                from cuda_l1.evaluate import cudadrv

                # Both sides alike: two lookups a tensor (~1 us each); a handle is exported once per
                # allocation (~10-20 us) and reused while the driver's buffer id says it is the same
                # allocation. The reference exports none: no handle to its memory ever exists.
                try:
                    base, _ = cudadrv.allocation_range(ptr)
                    key = cudadrv.buffer_id(base)
                    if self.export and key not in self.handles:
                        if len(self.handles) > _MAX_ALLOCATIONS:
                            self.handles.clear()
                        self.handles[key] = cudadrv.export_base(base)
                except cudadrv.CudaDriverError as exc:  # memory no IPC handle covers (mapped, managed, pooled)
                    if self.export:
                        refs.append(LeafRef("foreign", f"{typename} in memory that cannot be shared ({exc})"[:200],
                                            device=str(leaf.device)))
                        continue
                if self.export:
                    ref.handle, ref.handle_offset = self.handles[key], ptr - base
                else:  # the reference: its own address, only to tell which of its outputs share memory
                    ref.address = ptr  # (output_memory.overlapping_outputs); nothing reads a CUDA output by one
            else:
                ref.address = ptr
            refs.append(ref)
        return CallOutputs(structure, refs)

    # -- a window ------------------------------------------------------------------------------------
    def first(self, out) -> CallOutputs:
        """A window's first call, in full; its layout is what the later calls are compared with."""
        import torch

        call = self.full(out)
        self.layout = self.match = self.pointers = None
        tensors = (out,) if type(out) is torch.Tensor else out if type(out) in (tuple, list) else ()
        if (0 < len(call.leaves) <= MAX_POINTERS and len(tensors) == len(call.leaves)
                and all(leaf.kind == "tensor" and type(t) is torch.Tensor for leaf, t in zip(call.leaves, tensors))):
            self.layout = Layout(None if type(out) is torch.Tensor else type(out),
                                 [(t.dtype, t.shape, t.stride(), t.is_cuda) for t in tensors],
                                 [span_bytes(leaf) for leaf in call.leaves])
            self.match = _matcher(self.layout, torch.Tensor)
            self.pointers = _pointers(self.layout, torch.Tensor)
        return call

    @property
    def trusted(self) -> bool:
        """Whether later calls ring by bare pointers, their layout compared after the ring: once a
        window's later calls all matched, and never after one differed."""
        return self.matched_windows > 0 and not self.varied and self.pointers is not None

    def confirm(self, out, pointers: list[int]) -> CallOutputs | list[int]:
        """After its ring: a later call rung by `pointers`, kept so when its layout is the first call's,
        else in full (the reply then differs from the ring, see the module's docstring)."""
        if self.match is not None:
            try:
                if self.match(out) == pointers:
                    return pointers
            except Exception:  # noqa: BLE001 - as in later()
                pass
        self.varied = True
        return self.full(out)

    def window_done(self, calls: list) -> None:
        """Count a window whose later calls were all described by pointers (all matched)."""
        if len(calls) > 1:
            if all(type(call) is list for call in calls[1:]):
                self.matched_windows += 1
            else:
                self.varied = True

    def later(self, out) -> CallOutputs | list[int]:
        """A later call of the window: the pointers of its tensors when its layout is the first call's,
        else in full."""
        if self.match is not None:
            try:
                pointers = self.match(out)
            except Exception:  # noqa: BLE001 - an output without strides (sparse, say): in full
                pointers = None
            if pointers is not None:
                return pointers
        return self.full(out)

    def exports(self, calls: list) -> list[list]:
        """CUDA: the allocations the window's pointer-described calls fall in, each once, as
        [IPC handle, base, size] (none from the reference's side, which makes the same lookups)."""
        named: dict[int, list] = {}
        for call in calls:
            if type(call) is list:
                for ptr in call:
                    if ptr:
                        self._allocation(ptr, named)
        return list(named.values()) if self.export else []

    def _allocation(self, ptr: int, named: dict) -> None:
        from cuda_l1.evaluate import cudadrv

        i = bisect.bisect_right(self.bases, ptr) - 1
        if i >= 0 and ptr < self.allocations[i][1]:
            base, end, key = self.allocations[i]
            if base in named:
                return
            try:
                if cudadrv.buffer_id(base) == key:  # still the allocation it was: once a window
                    named[base] = [self.handles.get(key, ""), base, end - base]
                    return
            except cudadrv.CudaDriverError:
                pass
            del self.bases[i], self.allocations[i]
        try:
            base, size = cudadrv.allocation_range(ptr)
            key = cudadrv.buffer_id(base)
            if self.export and key not in self.handles:
                self.handles[key] = cudadrv.export_base(base)
        except cudadrv.CudaDriverError:
            return  # named nowhere: the parent refuses the pointer
        if len(self.bases) > _MAX_ALLOCATIONS:
            self.bases, self.allocations = [], []
        j = bisect.bisect_right(self.bases, base)
        self.bases.insert(j, base)
        self.allocations.insert(j, (base, base + size, key))
        named[base] = [self.handles.get(key, ""), base, size]


def _matcher(layout: Layout, tensor: type):
    """A later call's pointers when its outputs have `layout`, else None. Written out for one tensor,
    the common case: the test is the harness's only work a call (Ran.harness_s), ~0.5 us."""
    if layout.sequence is None:
        ((dtype, shape, strides, cuda),) = layout.tensors

        def one(out):  # (a meta tensor's pointer is 0: unreadable, the call refused, as in full)
            if (type(out) is tensor and out.dtype is dtype and out.shape == shape and out.stride() == strides
                    and out.is_cuda is cuda):
                return [out.data_ptr()]
            return None
        return one
    sequence, n, expected = layout.sequence, len(layout.tensors), layout.tensors

    def many(out):
        if type(out) is not sequence or len(out) != n:
            return None
        pointers = []
        for t, (dtype, shape, strides, cuda) in zip(out, expected):
            if (type(t) is not tensor or t.dtype is not dtype or t.shape != shape or t.stride() != strides
                    or t.is_cuda is not cuda or t.is_meta):
                return None
            pointers.append(t.data_ptr())
        return pointers
    return many


def _pointers(layout: Layout, tensor: type):
    """A later call's pointers once its outputs have the first call's structure and each tensor its
    first call's byte size (an output's shape may follow its input's values: x[x > t]), or None. The
    rest of its layout is compared after its ring (`confirm`). A dense tensor spans its byte size from
    its first element, so an output of the same byte size that is dense, or in the first call's
    layout, spans what the ring names. (An output that is not dense and changes its layout at the
    same byte size inside one evaluation is refused as unstable: no honest case is known.)
    The byte size, not the shape: comparing shapes cost 160 ns a call here, nbytes 70 ns."""
    sizes = [math.prod(shape) * dtype.itemsize for dtype, shape, _, _ in layout.tensors]
    if not all(sizes):  # an empty tensor's data_ptr() is 0, while its full description names its storage
        return None
    if layout.sequence is None:
        (nbytes,) = sizes

        def one(out):
            if type(out) is tensor:
                try:
                    if out.nbytes == nbytes:
                        return [out.data_ptr()]
                except Exception:  # noqa: BLE001 - no storage (sparse, say): described in full
                    return None
            return None
        return one
    sequence, n = layout.sequence, len(sizes)

    def many(out):
        if type(out) is not sequence or len(out) != n:
            return None
        try:
            for t, nbytes in zip(out, sizes):
                if type(t) is not tensor or t.nbytes != nbytes:
                    return None
            return [t.data_ptr() for t in out]
        except Exception:  # noqa: BLE001 - as in one()
            return None
    return many


# -- the parent's half --------------------------------------------------------------------------------
class Unmapped(ValueError):
    """A pointer that no allocation of the reply holds, or a call that cannot be rebuilt."""


def rebuild(first: CallOutputs, pointers: list[int], exports: list[tuple[str, int, int]]) -> CallOutputs:
    """A later call's description from the window's first call and its pointers (checked integers);
    `exports`: (handle, base, size) sorted by base."""
    if len(pointers) != len(first.leaves) or not all(leaf.kind == "tensor" for leaf in first.leaves):
        raise Unmapped("a call described by pointers must return the first call's tensors, one pointer each")
    leaves = []
    for leaf, ptr in zip(first.leaves, pointers):
        span = span_bytes(leaf)
        ref = LeafRef("tensor", leaf.type, leaf.dtype, leaf.shape, leaf.stride, 0, span, leaf.device)
        if leaf.handle:
            handle, base, size = exports[_holder(exports, ptr)]
            if ptr + span > base + size:
                raise Unmapped("a call's output reaches past the allocation the reply names for it")
            ref.handle, ref.handle_offset = handle, ptr - base
        else:  # a CPU output, or the reference's CUDA output (described by address, see Describer.full)
            ref.address = ptr
        leaves.append(ref)
    return CallOutputs(first.structure, leaves)


def _holder(exports: list[tuple[str, int, int]], ptr: int) -> int:
    """The index of the export holding `ptr` (the last whose base is at most it)."""
    i = bisect.bisect_right(exports, ptr, key=lambda e: e[1]) - 1
    if i < 0 or ptr >= exports[i][1] + exports[i][2] or not exports[i][0]:
        raise Unmapped("a call's output is in no allocation the reply names")
    return i
