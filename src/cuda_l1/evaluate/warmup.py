"""What a side does before any work arrives: warm the device (so a spare side started ahead is ready
in milliseconds), fix the host allocator's policy (and keep the oracle's work off the timed calls'
heap: in_own_arena) and, for its windows, the garbage collector's and the autograd state (window_state), and,
when probing, exercise CUDA IPC."""

from __future__ import annotations

import contextlib
import gc
import json
import sys


# glibc serves large blocks with fresh mmap()s until a freed one raises its threshold (up to 32 MiB),
# so the same forward can page-fault on every call in a fresh process and reuse heap memory in one that
# has run for a while: identical code then timed 25% apart on CPU. Both sides pin the policy instead:
# the main thread's blocks all come from the heap, which is kept. Any size: with blocks of 256 MiB or
# more still mapped afresh, a candidate that called mallopt itself kept its 256 MiB outputs on the
# heap while the reference's side page-faulted through each of its own, and identical code scored
# 1.43. No policy mallopt can set is known to serve a forward's large blocks faster than this one,
# so a candidate gains nothing by setting its own. (On a GPU the timed work is on the device.)
_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: the largest it can say


def steady_host_allocator() -> bool:
    """The same host-allocator policy on both sides (glibc only; else a no-op): no block mapped on its
    own (a new thread's arena still maps its large ones: in_own_arena), no heap given back."""
    try:
        import ctypes

        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def reserve_heap(nbytes: int) -> bool:
    """Touch `nbytes` of the main heap once and give them back to it (kept: steady_host_allocator), so the
    forward's large blocks find pages already mapped. Under that policy glibc still creeps: torch asks for
    its blocks aligned (posix_memalign), a freed block is a little short of the next request, small
    allocations split the free ones, and the heap grows by a block at a time until it settles. A
    forward keeping 32 MiB outputs of two windows alive grew it by 17 such blocks, page-faulting in about
    half of its first 20 windows (about 2x the call's time on the CPU host), at a round that depends on
    the side's history: one side settled after 2 windows, the other after 7, and identical code read
    1.22. Both sides touch the same amount ahead instead (TaskEnv.heap_reserve_bytes). glibc only."""
    if nbytes <= 0:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):
        return False
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    block = malloc(nbytes)
    if not block:  # no room (an address-space limit): the side runs as it would have
        return False
    ctypes.memset(block, 0, nbytes)
    free(block)
    return True


@contextlib.contextmanager
def no_collection():
    """No garbage collection inside the block (a window's calls), on either side: a candidate that
    turned it off for itself ran a launch-bound forward about 2% faster than the same code with it on
    (on the CPU host, 190 against 193 us a call). Back on after the block if it was on before."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@contextlib.contextmanager
def window_state():
    """How a window's calls run, the same on both sides: no gradients, inference mode off, no garbage
    collection. A candidate that entered inference mode at import and never left it (the mode is per
    thread, and the main thread runs the windows) ran small forwards 8-10% faster than the same code
    without it (2-core CPU host). A forward may still enter it itself, as a deployment would."""
    import torch

    with torch.inference_mode(False), torch.no_grad(), no_collection():
        yield


def in_own_arena(work, *args):
    """`work(*args)` in a thread of its own. glibc gives a new thread its own malloc arena, whose heaps
    cannot hold blocks of 64 MiB or more (those are mapped and unmapped whole), so the reference
    side's float64 oracle does not grow and reshape the heap its timed calls allocate from: in the
    main thread it did, and that side then page-faulted 5-55% less inside its windows than the
    candidate's running the same code. CPU sides only: a new thread's current GPU is device 0."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuda-l1-oracle") as pool:
            future = pool.submit(work, *args)
    except RuntimeError:  # no thread to be had (address-space limit): the work is done, here
        return work(*args)
    return future.result()  # its value, or its exception raised here


def prewarm(device: str) -> None:
    """Import torch and create the device context before any work arrives, so a spare side started
    ahead of time is ready in milliseconds."""
    import torch

    from cuda_l1.evaluate import inputs  # noqa: F401
    from cuda_l1.tasks import runtime  # noqa: F401

    if device.startswith("cuda"):
        from cuda_l1.evaluate import cudadrv  # noqa: F401

        torch.cuda.set_device(torch.device(device))
        a = torch.randn(256, 256, device=device)
        (a @ a).sum().item()  # context and cuBLAS handles
        torch.nn.functional.conv2d(a[None, None], a[None, None, :3, :3]).sum().item()
    a = torch.randn(256, 256)
    (a @ a).sum().item()  # the intra-op thread pool
    if device == "cpu":
        steady_host_allocator()


def probe_ipc(device: str, handle: str) -> int:
    """Both directions of CUDA IPC from inside the confinement: read the parent's bytes, export ours.
    (Some drivers refuse IPC across PID namespaces; the parent then tries a weaker set.)"""
    from cuda_l1.evaluate import cudadrv

    try:
        theirs = cudadrv.tensor_at(device, cudadrv.open_handle(device, handle), 4096)
        ours_ptr = cudadrv.alloc(device, 4096)
        ours = cudadrv.tensor_at(device, ours_ptr, 4096)
        ours.copy_(theirs)
        import torch

        torch.cuda.synchronize()
        print(json.dumps({"handle": cudadrv.export_base(ours_ptr)}), flush=True)
        sys.stdin.readline()  # keep the allocation alive until the parent has read it
        return 0
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 5
