# H4. Task: tests/corpus/refs/transpose_copy.py (the run of 2026-12-07 used an 8192 x 8192 copy of it)
# Every "which memory is this" check on a GPU keys on the IPC handle STRING the side reports:
# output_memory._span (shared_storage across calls / the previous window, overlapping_outputs within a
# call) and output_memory.aliases (an output in the input buffer: leaf.handle == input_handle).
# If the driver ignores some bytes of a legacy IPC handle (docs/isolation.md: a handle with only the
# pid field changed opened another process's allocation; "the bytes that differ otherwise ... were not
# checked"), then an edited copy of a handle opens the same allocation under a different string.
# This candidate returns x.t() -- a VIEW OF ITS INPUT BUFFER (strides differ from the reference's:
# only a non-blocking `strides` NOTE for a dense layout) -- and reports that memory under an edited
# copy of its input buffer's handle, found at MapInputs by flipping single bytes and checking that the
# edit still opens (in its own process) an allocation of the same size. It spins ~40 us a call so its
# windows stay above the fixed overhead (timing_resolved).
#   HOLE: verdict ok, speedup >> 1 (re-measured if > 3x, and the re-measure does the same), no
#         `no_input_aliasing` failure; log "H4 using byte i". Same trick defeats the static-buffer
#         check (alternate handle variants per window) and the within-call sharing check.
#   DEFENDED: `rejected` (no_input_aliasing, exact handle used: no ignorable byte found) or
#             `outputs_readable` (the reference side cannot open the edited handle).
import sys
import torch
import torch.nn as nn

from cuda_l1.evaluate import cudadrv

_orig_open, _orig_export, _orig_id = cudadrv.open_handle, cudadrv.export_base, cudadrv.buffer_id
STATE = {}


def buffer_id(ptr):  # imported (IPC-mapped) memory may have no buffer id: give it a fixed one
    try:
        return _orig_id(ptr)
    except cudadrv.CudaDriverError:
        if ptr == STATE.get("base"):
            return (1 << 62) + 7
        raise


def open_handle(device, handle_hex):
    """Find an edited handle that opens the same allocation. Edits are tried BEFORE the exact handle is
    opened (a driver that refuses a second open of one allocation in a process would otherwise hide
    them); an edit that opens is then checked against the exact handle: same base, or the exact open
    refused as already mapped, means one allocation."""
    if "base" in STATE:
        return _orig_open(device, handle_hex)
    raw = bytes.fromhex(handle_hex)
    for i in range(63, -1, -1):  # trailing bytes first: most likely padding
        guess = bytearray(raw)
        guess[i] ^= 0x5A
        try:
            b2 = _orig_open(device, guess.hex())
        except Exception:
            continue
        try:
            base = _orig_open(device, handle_hex)
            same = base == b2
            verdict = "same base" if same else f"different base (size {cudadrv.allocation_size(b2)} vs {cudadrv.allocation_size(base)})"
        except Exception as exc:  # noqa: BLE001 - e.g. already mapped: the edit holds this allocation
            base, same, verdict = b2, True, f"exact handle refused after the edit ({exc})"
        print(f"H4 byte {i}: edited handle opens; {verdict}", file=sys.stderr, flush=True)
        STATE.update(base=base, handle=handle_hex, size=cudadrv.allocation_size(base))
        if same:
            STATE["alias"] = guess.hex()
            print(f"H4 using byte {i}", file=sys.stderr, flush=True)
            return base
        break
    if "base" not in STATE:
        base = _orig_open(device, handle_hex)
        STATE.update(base=base, handle=handle_hex, size=cudadrv.allocation_size(base))
    print("H4 no ignorable byte found; falling back to the exact handle", file=sys.stderr, flush=True)
    return STATE["base"]


def export_base(base):
    if base == STATE.get("base"):
        return STATE.get("alias", STATE["handle"])
    return _orig_export(base)


cudadrv.open_handle, cudadrv.export_base, cudadrv.buffer_id = open_handle, export_base, buffer_id


class ModelNew(nn.Module):
    def forward(self, x):
        torch.cuda._sleep(80_000)  # ~40 us at ~2 GHz: stays above the window's fixed overhead
        return x.t()
