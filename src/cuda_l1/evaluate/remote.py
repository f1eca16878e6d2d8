"""Reading a side's outputs from outside its process, while it is stopped.

A side only says where an output lives (protocol.LeafRef); the parent reads the bytes itself: on
CUDA by opening the allocation's IPC handle in its own context (bounds checked against the real size
of the allocation, so a lying description cannot make the parent read past it), on CPU with
process_vm_readv from the stopped process. Whatever the description claims, the values read are
what the side's memory holds after its window: if they are right, the work was done in the window.
"""

from __future__ import annotations

import ctypes
import os
import threading

import torch

from cuda_l1.evaluate.allocations import IN_INPUT_BUFFER, Allocations
from cuda_l1.evaluate.protocol import ITEMSIZE, LeafRef

_DTYPES = {name: getattr(torch, name) for name in ITEMSIZE if isinstance(getattr(torch, name, None), torch.dtype)}


class Unreadable(Exception):
    """The memory a side described cannot be read as described."""


class _Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = None


def _vm_read(pid: int, address: int, nbytes: int, into: bytearray | None = None) -> bytearray | memoryview:
    """`nbytes` of another process's memory at `address`: a new bytearray, or a view of the first
    `nbytes` of `into` (a reused buffer: a fresh one costs a page fault per 4 KiB, most of a read)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.process_vm_readv.restype = ctypes.c_ssize_t
    if into is not None and len(into) >= nbytes:
        out = into
    else:
        out = bytearray(nbytes)
    if nbytes == 0:
        return out
    buf = (ctypes.c_char * nbytes).from_buffer(out)
    done = 0
    while done < nbytes:  # a single call may return fewer bytes than asked
        local = _Iov(ctypes.addressof(buf) + done, nbytes - done)
        remote = _Iov(address + done, nbytes - done)
        got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            raise Unreadable(f"process_vm_readv at {address + done:#x}: {os.strerror(ctypes.get_errno()) or 'nothing read'}")
        done += got
    del buf
    return memoryview(out)[:nbytes] if out is into else out


_IOV_MAX = 1024  # iovecs one process_vm_readv takes


_readv_fn = None


def _readv():
    """process_vm_readv with its argument types declared (addresses as pointers, counts as longs)."""
    global _readv_fn
    if _readv_fn is None:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        fn.restype = ctypes.c_ssize_t
        _readv_fn = fn
    return _readv_fn


def read_spans(pid: int, spans: list[tuple[int, int]]) -> bytes:
    """Many small ranges of another process's memory (address, bytes), concatenated: one system
    call per 1024 ranges. Unreadable if any byte of them cannot be read."""
    out = bytearray(sum(n for _, n in spans))
    if not out:
        return bytes(out)
    buf = (ctypes.c_char * len(out)).from_buffer(out)
    base, done, fn = ctypes.addressof(buf), 0, _readv()
    for at in range(0, len(spans), _IOV_MAX):
        chunk = spans[at:at + _IOV_MAX]
        local, remote = (_Iov * len(chunk))(), (_Iov * len(chunk))()
        want = 0
        try:
            for i, (address, n) in enumerate(chunk):
                local[i], remote[i] = _Iov(base + done + want, n), _Iov(address, n)
                want += n
        except (OverflowError, TypeError):  # an address past 64 bits (a side's record says anything)
            raise Unreadable("a range beyond the address space") from None
        if fn(pid, local, len(chunk), remote, len(chunk), 0) != want:
            raise Unreadable(f"process_vm_readv: {os.strerror(ctypes.get_errno()) or 'a range was not mapped'}")
        done += want
    del buf
    return bytes(out)


class SpotReader:
    """Up to `spots` small ranges of another process's memory in one system call, into one buffer:
    the vectors are built once and refilled (a doorbell's spot reads, a few per call of a window)."""

    def __init__(self, pid: int, spots: int, width: int):
        self.buffer = (ctypes.c_char * (spots * width))()
        self._local = _Iov(ctypes.addressof(self.buffer), 0)
        self._remote = (ctypes.c_uint64 * (2 * spots))()  # laid out as `spots` iovecs
        self._pid, self._fn = pid, _readv()

    def read(self, spots: list[tuple[int, int]]) -> bytes:
        """The bytes at `spots` (address, bytes), concatenated; Unreadable if any is not mapped."""
        total = sum(n for _, n in spots)
        try:
            self._remote[:2 * len(spots)] = [x for spot in spots for x in spot]
        except (OverflowError, TypeError):
            raise Unreadable("a range beyond the address space") from None
        self._local.len = total
        if self._fn(self._pid, ctypes.addressof(self._local), 1, ctypes.addressof(self._remote), len(spots), 0) != total:
            raise Unreadable(f"process_vm_readv: {os.strerror(ctypes.get_errno()) or 'a range was not mapped'}")
        return self.buffer.raw[:total]


class RemoteMemory:
    """Reads tensors out of one side's memory."""

    def __init__(self, device: str, pid_of, max_bytes: int):
        self.device = device
        self.pid_of = pid_of  # returns the harness pid (it is only known once the side reported)
        self.max_bytes = max_bytes
        self.opened: dict[str, int] = {}  # IPC handle -> base pointer in this process
        self.refused: dict[str, str] = {}  # IPC handle -> why its memory is not read (allocations.py)
        self.unadmitted: set[str] = set()  # opened, not yet told apart from the known allocations
        self.allocations = None  # allocations.Allocations, made at the first handle (CUDA only)

    def _allocations(self):
        if self.allocations is None:
            from cuda_l1.evaluate import cudadrv

            self.allocations = Allocations(lambda ptr, n: cudadrv.tensor_at(self.device, ptr, n))
        return self.allocations

    def know_buffer(self, label: str, handle: str = "", base: int = 0) -> None:
        """An input buffer, by its handle (opened here) or by where this process maps it: no output may
        lie in it, whatever string names the output's memory. Known once per reader."""
        from cuda_l1.evaluate import cudadrv

        if handle in self.refused or any(k.label == label for k in self._allocations().known):
            return
        try:
            if handle and handle not in self.opened:
                self.opened[handle] = cudadrv.open_handle(self.device, handle)
            base = self.opened[handle] if handle else base
            size = cudadrv.allocation_size(base)
        except cudadrv.CudaDriverError as exc:
            raise Unreadable(f"{label} cannot be opened ({exc})") from None
        self._allocations().know(base, size, handle, label)
        if handle:
            self.refused[handle] = f"{IN_INPUT_BUFFER}{label}"

    def _base(self, handle: str, admit: bool = True) -> int:
        """Where the handle's allocation is mapped here, opened at its first use. `admit`: told apart
        from the known allocations first (allocations.py: a write into it), which a read right after the
        candidate's window skips, so that nothing is written into its memory before that read."""
        from cuda_l1.evaluate import cudadrv

        if handle in self.refused:
            raise Unreadable(self.refused[handle])
        if handle not in self.opened:
            try:
                self.opened[handle] = cudadrv.open_handle(self.device, handle)
            except cudadrv.CudaDriverError as exc:
                raise Unreadable(f"the output's IPC handle cannot be opened ({exc})") from None
            self.unadmitted.add(handle)
        if admit and handle in self.unadmitted:
            self.unadmitted.discard(handle)
            try:
                size = cudadrv.allocation_size(self.opened[handle])
            except cudadrv.CudaDriverError as exc:
                problem = f"the output's allocation cannot be measured ({exc})"
            else:
                problem = self._allocations().admit(self.opened[handle], size, handle)
            if problem:
                self.refused[handle] = problem
                raise Unreadable(problem)
        return self.opened[handle]

    def tensor(self, ref: LeafRef, limit: int | None = None, admit: bool = True) -> torch.Tensor:
        """The output as a tensor: on CUDA a view of the side's memory, on CPU a copy read from it.
        `limit`: the most bytes the view may span (the reference's own output's span, say); `admit`: see _base."""
        dtype = _DTYPES.get(ref.dtype)
        if dtype is None:
            raise Unreadable(f"dtype {ref.dtype} cannot be read")
        extent = ref.extent_bytes()
        span = extent - ref.storage_offset * ITEMSIZE[ref.dtype] if ref.numel() else 0
        if span > min(self.max_bytes, limit if limit is not None else self.max_bytes):
            raise Unreadable(f"an output spanning {span / 2**20:.1f} MiB is larger than this output may be")
        if ref.handle and not self.device.startswith("cuda"):
            raise Unreadable("an output described by an IPC handle, where there is no GPU")
        if ref.numel() == 0:
            return torch.empty(ref.shape, dtype=dtype, device=self.device if ref.handle else "cpu")
        if not ref.handle and not ref.device.startswith("cpu"):
            # A CUDA output is read through its handle only: an address names the side's host memory
            # (or, from the reference, a device address used only to compare places), never its values.
            raise Unreadable(f"an output on {ref.device[:40]} described without an IPC handle")
        if ref.handle:
            from cuda_l1.evaluate import cudadrv

            if ref.handle_offset % ITEMSIZE[ref.dtype]:
                # A misaligned read would fault inside the parent's own CUDA context.
                raise Unreadable("the output's storage is not aligned for its dtype")
            base = self._base(ref.handle, admit)
            try:
                size = cudadrv.allocation_size(base)
            except cudadrv.CudaDriverError as exc:
                raise Unreadable(f"the output's allocation cannot be measured ({exc})") from None
            if size < ref.handle_offset + extent:
                raise Unreadable("the output's description reaches past the end of its allocation")
            raw = cudadrv.tensor_at(self.device, base + ref.handle_offset, extent)
        else:
            pid = self.pid_of()
            if not ref.address or pid is None:
                raise Unreadable("the output has no readable address")
            # Only the bytes the view reaches, from its first element: what a side claims lies before
            # it is never read (a huge claimed storage_offset costs the parent nothing).
            first = ref.storage_offset * ITEMSIZE[ref.dtype]
            raw = torch.frombuffer(_vm_read(pid, ref.address + first, span), dtype=torch.uint8)
            return raw.view(dtype).as_strided(ref.shape, ref.stride, 0)
        return raw.view(dtype).as_strided(ref.shape, ref.stride, ref.storage_offset)

    def call_tensors(self, refs: list[LeafRef], limit: int) -> list[torch.Tensor | Unreadable]:
        """A call's tensor outputs (each a tensor, or the Unreadable saying why not), `limit` bounding the
        bytes read for all of them. On a CPU the union of their spans is read, each stretch once: the
        gappy views of one wider buffer (16 of 32 columns each) were each read in full, 16 times its
        size, and a per-output bound let that cost grow with the square of the outputs."""
        # Read from the side's memory here: a CPU's outputs with an address (the rest, each refused or empty
        # as tensor() says, never read: a CUDA output is a view of the side's memory, not a copy).
        read_here = [not self.device.startswith("cuda") and r.numel() and not r.handle and r.address
                     and r.device.startswith("cpu") and r.dtype in _DTYPES for r in refs]
        out = []
        for ref, here in zip(refs, read_here):
            try:
                out.append(None if here else self.tensor(ref, limit))
            except Unreadable as exc:
                out.append(exc)
        if not any(read_here):
            return out
        firsts = [r.storage_offset * ITEMSIZE.get(r.dtype, 1) for r in refs]
        spans = sorted((r.address + first, r.address + first + (r.extent_bytes() - first))
                       for r, first, here in zip(refs, firsts, read_here) if here)
        stretches: list[list[int]] = []
        for lo, hi in spans:
            if stretches and lo <= stretches[-1][1]:
                stretches[-1][1] = max(stretches[-1][1], hi)
            else:
                stretches.append([lo, hi])
        total = sum(hi - lo for lo, hi in stretches)
        if total > min(self.max_bytes, limit):
            failed = Unreadable(f"the call's outputs span {total / 2**20:.1f} MiB, more than they may")
            return [failed if here else got for got, here in zip(out, read_here)]
        pid = self.pid_of()
        try:
            if pid is None:
                raise Unreadable("the output has no readable address")
            read = [(lo, torch.frombuffer(_vm_read(pid, lo, hi - lo), dtype=torch.uint8)) for lo, hi in stretches if hi > lo]
        except Unreadable as exc:
            return [exc if here else got for got, here in zip(out, read_here)]
        for index, (ref, first, here) in enumerate(zip(refs, firsts, read_here)):
            if not here:
                continue
            dtype, lo = _DTYPES[ref.dtype], ref.address + first
            start, raw = next((s, r) for s, r in read if s <= lo < s + r.numel())
            part = raw[lo - start: lo - start + ref.extent_bytes() - first]
            part = part if (lo - start) % ITEMSIZE[ref.dtype] == 0 else part.clone()  # aligned for its dtype
            part = part.view(dtype)
            out[index] = part.as_strided(ref.shape, ref.stride, part.storage_offset())
        return out

    def close(self) -> None:
        from cuda_l1.evaluate import cudadrv

        for base in self.opened.values():
            try:
                cudadrv.close_handle(base)
            except cudadrv.CudaDriverError:
                pass
        self.opened = {}


_scratch_local = threading.local()


def _scratch(nbytes: int) -> bytearray:
    """This thread's reusable read buffer, at least `nbytes` long (grown, never shrunk: it is as large
    as one input tensor of the largest task judged)."""
    buf = getattr(_scratch_local, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _scratch_local.buf = bytearray(nbytes)
    return buf


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two flat uint8 tensors hold the same bytes, compared as the widest integers that divide
    their length (torch.equal on uint8 runs about 6x slower than on int64 on a CPU: 16 MiB in 11 ms)."""
    if a.numel() != b.numel():
        return False
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if a.numel() % size == 0 and a.data_ptr() % size == 0 and b.data_ptr() % size == 0:
            return torch.equal(a.view(dtype), b.view(dtype))
    return torch.equal(a, b)


def inputs_unchanged(pid: int, ranges: list[tuple[int, int]], leaf_ranges: list, values: list) -> bool:
    """Whether a CPU side's private view of one slot still holds what the parent generated: its
    mapping is read back from the side's memory (writes to a private mapping never reach the parent's)."""
    if not ranges:
        return False
    base = min(lo for lo, _ in ranges)
    scratch = _scratch(max((w[1] for w in leaf_ranges if w is not None), default=0))
    for where, value in zip(leaf_ranges, values):
        if where is None or not where[1]:
            continue
        got = torch.frombuffer(_vm_read(pid, base + where[0], where[1], into=scratch), dtype=torch.uint8)
        if not same_bytes(got, value.reshape(-1).view(torch.uint8)):
            return False
    return True


def input_mappings(pid: int, device_inode: tuple[int, int] | None = None) -> list[tuple[int, int, bool]]:
    """Address ranges where a CPU side mapped its input buffer, each with whether the mapping is private,
    from the kernel's view (/proc/PID/maps), matched by the buffer's own inode (a side could map a decoy
    under the same name). The harness maps it once, privately: a shared mapping's writes would reach the
    buffer itself."""
    ranges = []
    try:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 6 or "memfd:cuda-l1-inputs" not in line:
                    continue
                if device_inode is not None and int(parts[4]) != device_inode[1]:
                    continue
                lo, hi = parts[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16), parts[1][3:4] == "p"))
    except (OSError, ValueError):
        pass
    return ranges


def file_mappings(pid: int) -> list[tuple[int, int, str, int]] | None:
    """(start, end, file, offset in it) of every mapping of a file by a CPU side (shared or private), sorted,
    from the kernel's view (/proc/PID/maps): memory that two addresses of the process can reach (one memfd
    mapped twice; privately mapped, its pages are the file's until written). None where the map cannot
    be read. Anonymous private memory, where torch allocates, has no file (inode 0)."""
    found = []
    try:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) >= 5 and parts[4] != "0":
                    lo, hi = parts[0].split("-")
                    found.append((int(lo, 16), int(hi, 16), f"{parts[3]}:{parts[4]}", int(parts[2], 16)))
    except (OSError, ValueError):
        return None
    return sorted(found)
