"""A side's views of its input slots, in the buffer the parent writes (slots.py), at every shift a round
may start them at.

On a CPU the parent starts each pair of rounds' slots a drawn number of bytes into the buffer (slots.SHIFT_SPAN)
when a buffer has few input tensors in all. The side builds its views for every such shift once, when
it maps the buffer, outside any window: a window only picks the round's set. Rebuilt in the window (about
10 us a tensor) they were harness work that a candidate could patch away while the reference's side
paid for it.
"""

from __future__ import annotations

from cuda_l1.evaluate.protocol import INPUT_SHIFT_SPAN, INPUT_SHIFT_STEP

# Input tensors of all slots together up to which a CPU buffer is shifted: 64 shifts of that many views
# cost the side about 0.1 s (2-core host) and some MB when it maps its inputs. Buffers of more hold
# small inputs in many slots (at most 256), whose windows hold many calls; they stay at shift 0.
MAX_SHIFTED_TENSORS = 256


def shift_positions(n_slots: int, tensors_per_slot: int, device: str) -> int:
    """How many shifts a buffer's rounds draw from (1: never shifted), the same on both ends."""
    if device.startswith("cuda") or n_slots * tensors_per_slot > MAX_SHIFTED_TENSORS:
        return 1
    return INPUT_SHIFT_SPAN // INPUT_SHIFT_STEP


def dtype_table() -> dict:
    """torch's dtypes by name ("float32": torch.float32), as LeafSpec names them."""
    import torch

    return {name: getattr(torch, name) for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}


def slot_views(buffer, layout: list, dtypes: dict, shift: int) -> list[list]:
    """Every slot's arguments: its tensors as views of `buffer` (a uint8 tensor) `shift` bytes further in
    than their LeafSpec offsets, its values as they are."""
    import torch

    slots = []
    for leaves in layout:
        args = []
        for leaf in leaves:
            if leaf.kind == "value":
                args.append(leaf.value)
                continue
            dtype = dtypes[leaf.dtype]
            item = torch.empty((), dtype=dtype).element_size()
            span = (1 + sum((s - 1) * st for s, st in zip(leaf.shape, leaf.stride))) * item if all(leaf.shape) else 0
            raw = buffer[shift + leaf.offset:shift + leaf.offset + span]
            flat = raw.view(dtype) if span else torch.empty(0, dtype=dtype, device=buffer.device)
            args.append(flat.as_strided(leaf.shape, leaf.stride))
        slots.append(args)
    return slots


def views_by_shift(buffer, layout: list, device: str) -> dict[int, list[list]]:
    """{shift: every slot's arguments} for every shift the buffer's rounds may draw."""
    dtypes = dtype_table()
    tensors = sum(leaf.kind == "tensor" for leaf in layout[0]) if layout else 0
    positions = shift_positions(len(layout), tensors, device)
    return {k * INPUT_SHIFT_STEP: slot_views(buffer, layout, dtypes, k * INPUT_SHIFT_STEP) for k in range(positions)}
