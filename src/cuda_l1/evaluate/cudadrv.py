"""The few CUDA driver calls the evaluator needs, through ctypes: raw allocations and IPC handles.

Why not torch's own sharing (`storage._share_cuda_()`): it exports whole caching-allocator segments,
keeps reference-count files in /dev/shm and expects torch.multiprocessing on both ends. The evaluator
needs less and must trust less: allocations of its own for the input slots that both sides map, and,
on the other direction, opening a handle that an untrusted side *claims* holds its output. Every call
is checked; a bad handle is an error string, never a crash.

A handle is 64 opaque bytes (hex on the wire). Tensors over foreign memory are built from a byte view
(`__cuda_array_interface__`), then given their dtype, shape and strides by torch.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from cuda_l1.devices import normalize_device

HANDLE_BYTES = 64
_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
_lib = None
_lock = threading.Lock()


class CudaDriverError(RuntimeError):
    """A driver call failed (its error name is in the message)."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


def _driver():
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            for name, args in {
                "cuInit": [ctypes.c_uint],
                "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
                "cuMemFree_v2": [ctypes.c_uint64],
                "cuIpcGetMemHandle": [ctypes.POINTER(_Handle), ctypes.c_uint64],
                "cuIpcOpenMemHandle_v2": [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint],
                "cuIpcCloseMemHandle": [ctypes.c_uint64],
                "cuMemGetAddressRange_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.c_uint64],
                "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
                "cuPointerGetAttribute": [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64],
            }.items():
                fn = getattr(lib, name)
                fn.argtypes = args
                fn.restype = ctypes.c_int
            _lib = lib
    return _lib


def _check(code: int, what: str) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(code, ctypes.byref(name))
        raise CudaDriverError(f"{what} failed: {(name.value or b'error %d' % code).decode()}")


def _ready(device: str) -> None:
    """Make the device's primary context (the one torch uses) current on this thread."""
    torch.cuda.set_device(torch.device(normalize_device(device)))  # "cuda" has no index to set
    torch.cuda.init()
    torch.empty(1, device=device)  # the runtime binds the primary context to this thread
    _check(_driver().cuInit(0), "cuInit")


def alloc(device: str, nbytes: int) -> int:
    """A plain cudaMalloc-style allocation of its own (so its IPC handle covers exactly it)."""
    _ready(device)
    ptr = ctypes.c_uint64()
    _check(_driver().cuMemAlloc_v2(ctypes.byref(ptr), max(int(nbytes), 1)), "cuMemAlloc")
    return ptr.value


def free(ptr: int) -> None:
    _check(_driver().cuMemFree_v2(ptr), "cuMemFree")


def allocation_range(ptr: int) -> tuple[int, int]:
    """(base, size) of the allocation that holds device pointer `ptr`."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(_driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr), "cuMemGetAddressRange")
    return base.value, int(size.value)


def export_base(base: int) -> str:
    """The IPC handle (hex) of the allocation starting at `base`."""
    handle = _Handle()
    _check(_driver().cuIpcGetMemHandle(ctypes.byref(handle), base), "cuIpcGetMemHandle")
    # string_at, not .reserved: a c_char array's value stops at the first zero byte.
    return ctypes.string_at(ctypes.addressof(handle), HANDLE_BYTES).hex()


def export_handle(ptr: int) -> tuple[str, int]:
    """(handle hex, offset of `ptr` in its allocation) for a device pointer of this process."""
    base, _ = allocation_range(ptr)
    return export_base(base), ptr - base


def open_handle(device: str, handle_hex: str) -> int:
    """Map another process's allocation; returns its base pointer in this process."""
    raw = bytes.fromhex(handle_hex)
    if len(raw) != HANDLE_BYTES:
        raise CudaDriverError("an IPC handle must be 64 bytes")
    _ready(device)
    handle = _Handle()
    ctypes.memmove(ctypes.addressof(handle), raw, HANDLE_BYTES)
    ptr = ctypes.c_uint64()
    _check(_driver().cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, _CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
           "cuIpcOpenMemHandle")
    return ptr.value


def close_handle(ptr: int) -> None:
    _check(_driver().cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")


def buffer_id(ptr: int) -> int:
    """The driver's process-wide unique id of the allocation holding `ptr` (never reused, unlike an
    address: memory freed and allocated again at the same place gets a new id)."""
    value = ctypes.c_uint64()
    _check(_driver().cuPointerGetAttribute(ctypes.byref(value), _CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr),
           "cuPointerGetAttribute")
    return value.value


def allocation_size(ptr: int) -> int:
    """Bytes from `ptr` to the end of its allocation."""
    base, size = allocation_range(ptr)
    return size - (ptr - base)


class _ByteView:
    """A `__cuda_array_interface__` over raw device bytes, for torch.as_tensor."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


def tensor_at(device: str, ptr: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over `nbytes` of device memory at `ptr` (memory not owned by torch)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.as_tensor(_ByteView(ptr, nbytes), device=device)
