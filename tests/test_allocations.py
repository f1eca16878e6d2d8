"""allocations.py tells mappings apart by their memory, not by the names they came under: checked here on
host memory, where one memfd mapped twice is one memory at two addresses, as an edited IPC handle that
opens an allocation already mapped may give (the GPU case is tests/corpus/gpu/input_buffer_other_handle.py)."""

import ctypes
import mmap
import os

import pytest
import torch

from cuda_l1.evaluate.allocations import IN_INPUT_BUFFER, MAX_KNOWN, Allocations, same_memory

SIZE = 1 << 16


def _view(address: int, nbytes: int) -> torch.Tensor:
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


class Mapping:
    """A shared mapping of a file, at an address of its own."""

    def __init__(self, fd: int):
        self.map = mmap.mmap(fd, SIZE, flags=mmap.MAP_SHARED)
        self.array = (ctypes.c_uint8 * SIZE).from_buffer(self.map)
        self.base = ctypes.addressof(self.array)


@pytest.fixture
def memories():
    fds = [os.memfd_create("allocation"), os.memfd_create("other")]
    for fd in fds:
        os.ftruncate(fd, SIZE)
    maps = {"buffer": Mapping(fds[0]), "buffer_again": Mapping(fds[0]), "other": Mapping(fds[1]),
            "other_again": Mapping(fds[1])}
    maps["buffer"].map[:8] = b"abcdefgh"
    yield maps
    for m in maps.values():
        del m.array
        m.map.close()
    for fd in fds:
        os.close(fd)


def test_same_memory_by_a_write_and_restored(memories):
    a, b, c = memories["buffer"], memories["buffer_again"], memories["other"]
    assert a.base != b.base
    assert same_memory(_view, b.base, [c.base, a.base]) == 1
    assert same_memory(_view, c.base, [a.base, b.base]) is None
    assert bytes(a.map[:8]) == b"abcdefgh"  # what the probe wrote is undone
    assert bytes(c.map[:8]) == bytes(8)


def test_an_output_in_an_input_buffer_under_another_name(memories):
    allocations = Allocations(_view)
    allocations.know(memories["buffer"].base, SIZE, "handle-of-buffer", "the candidate's input buffer")
    assert allocations.admit(memories["other"].base, SIZE, "output-1") == ""
    reason = allocations.admit(memories["buffer_again"].base, SIZE, "edited-handle")
    assert reason.startswith(IN_INPUT_BUFFER) and "the candidate's input buffer" in reason


def test_an_input_buffer_is_tested_whatever_size_its_mapping_reports(memories):
    allocations = Allocations(_view)
    allocations.know(memories["buffer"].base, SIZE, "handle-of-buffer", "the reference's input buffer")
    reason = allocations.admit(memories["buffer_again"].base, SIZE // 2, "edited-size")
    assert reason.startswith(IN_INPUT_BUFFER)


def test_one_allocation_under_two_names(memories):
    allocations = Allocations(_view)
    assert allocations.admit(memories["other"].base, SIZE, "output-1") == ""
    assert "two IPC handles" in allocations.admit(memories["other_again"].base, SIZE, "output-1-edited")
    assert "two IPC handles" in allocations.admit(memories["other"].base, SIZE, "same-place-other-string")


def test_outputs_of_other_sizes_are_not_tested_input_buffers_always():
    calls = []
    allocations = Allocations(_view, probe=lambda view, a, bases: calls.append((a, list(bases))) or None)
    allocations.know(1000, 64, "h", "an input buffer")
    assert allocations.admit(2000, 128, "o") == ""
    assert calls == [(2000, [1000])]
    assert allocations.admit(3000, 128, "p") == ""
    assert calls[-1] == (3000, [1000, 2000])  # one gather for all of them


def test_the_known_allocations_are_bounded():
    allocations = Allocations(_view, probe=lambda view, a, bases: None)
    for i in range(MAX_KNOWN):
        allocations.know(10 + i, 64, f"h{i}", "")
    assert "too many" in allocations.admit(1, 64, "o")
