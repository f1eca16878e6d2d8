# H2 diagnostic. Task: tests/corpus/refs/big_relu_add.py (any task works; the search is at load time).
# The side is handed its input buffer's legacy CUDA IPC handle (MapInputs). That buffer is a cuMemAlloc
# of the PARENT, exported; so is the reference side's buffer (same size: both SlotBuffer(source,
# n_slots)), and so is every other candidate side's. The candidate wraps cudadrv.open_handle (it is
# imported before MapInputs), keeps its own handle and tries small edits of it (each 4-byte word
# +-1..16) with cuIpcOpenMemHandle. Every success that is NOT its own buffer is logged with its size.
# Then, in every window, it compares the first 64 bytes of each foreign buffer with its own slot 0.
#   HOLE: log shows "FOREIGN ... size == own" (the reference's input buffer), and the per-window
#         "same_as_mine" flags line up with the round order (timing.samples.candidate_first: the
#         reference's buffer already holds this round's inputs exactly when the reference went first).
#         That gives (1) the round order to the candidate in every window and (2) a word that the
#         parent writes at the start of the reference's window: a release for work queued behind
#         cuStreamWaitValue32 (H1b) -> deferred work charged to the reference.
#   DEFENDED: no foreign allocation opens (log "no foreign allocation").
import struct
import sys
import torch
import torch.nn as nn

from cuda_l1.evaluate import cudadrv

_orig_open = cudadrv.open_handle
FOUND = []  # (handle, base, size)
MINE = {}


def _search(device, handle_hex, own_base):
    raw = bytearray.fromhex(handle_hex)
    own_size = cudadrv.allocation_size(own_base)
    tried = 0
    for pos in range(0, 64, 4):
        (word,) = struct.unpack_from("<I", raw, pos)
        for delta in list(range(-16, 0)) + list(range(1, 17)):
            guess = bytearray(raw)
            struct.pack_into("<I", guess, pos, (word + delta) & 0xFFFFFFFF)
            tried += 1
            try:
                base = _orig_open(device, guess.hex())
            except Exception:
                continue
            if base == own_base:
                continue
            try:
                size = cudadrv.allocation_size(base)
            except Exception:
                size = -1
            FOUND.append((guess.hex(), base, size))
            print(f"H2 FOREIGN word@{pos} delta={delta:+d} size={size} own_size={own_size} "
                  f"{'SAME SIZE' if size == own_size else ''}", file=sys.stderr, flush=True)
    if not FOUND:
        print(f"H2 no foreign allocation in {tried} guesses; handle={handle_hex}", file=sys.stderr, flush=True)


def open_handle(device, handle_hex):
    base = _orig_open(device, handle_hex)
    if not MINE:
        MINE.update(handle=handle_hex, base=base)
        print(f"H2 own input handle {handle_hex}", file=sys.stderr, flush=True)
        try:
            _search(device, handle_hex, base)
        except Exception as exc:  # noqa: BLE001
            print(f"H2 search failed: {exc}", file=sys.stderr, flush=True)
    return base


cudadrv.open_handle = open_handle


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = -1

    def forward(self, x, y):
        off = x.storage_offset()
        if off <= self.k or self.k < 0:  # first call of a window
            mine = cudadrv.tensor_at(x.device.type, MINE["base"], 64) if MINE else None
            flags = []
            for _, base, size in FOUND:
                if mine is not None and size > 64:
                    theirs = cudadrv.tensor_at(x.device.type, base, 64)
                    flags.append(bool(torch.equal(theirs, mine)))
            print(f"H2 window: same_as_mine={flags}", file=sys.stderr, flush=True)
        self.k = off
        return torch.relu(x) + y
