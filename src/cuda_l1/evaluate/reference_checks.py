"""The reference side's half of verification on CUDA (protocol.Verify): it opens the candidate's
outputs through their IPC handles and compares them with its own outputs of the same inputs, which
never leave its process. Runs inside the reference's side, on the requests of the trusted parent;
what it reads of the candidate is only ever data (remote.RemoteMemory checks every description)."""

from __future__ import annotations

import contextlib
import random
import time

import torch

from cuda_l1.evaluate import settled_outputs
from cuda_l1.evaluate import verify as judge
from cuda_l1.evaluate.inputs import flatten_outputs
from cuda_l1.evaluate.output_memory import read_limit
from cuda_l1.evaluate.precision import ToleranceConfig
from cuda_l1.evaluate.protocol import LeafVerdict, Verified, Verify
from cuda_l1.evaluate.remote import RemoteMemory, Unreadable


class OracleMemory:
    """The device memory of a request's float64 oracles, in a pool of its own, given back to the driver
    when the request ends. A large task's oracle holds several times its inputs in float64 (36 GiB
    for KernelBench's 6 GiB elementwise inputs): left cached in this side's allocator, that memory is
    lost to everyone else on the GPU, the parent making the next round's inputs among them. Emptying
    the whole cache would also drop the blocks the reference's timed windows reuse, and its next
    window would pay for new ones (a bias in the candidate's favour): a pool of its own gives back the
    oracle's memory alone."""

    def __init__(self, device: str):
        self.usable = device.startswith("cuda") and all(hasattr(torch.cuda, n) for n in ("MemPool", "use_mem_pool"))
        self.pool = None  # made at the request's first oracle

    def using(self):
        """The block's device allocations go to the pool."""
        if not self.usable:
            return contextlib.nullcontext()
        if self.pool is None:
            self.pool = torch.cuda.MemPool()
        return torch.cuda.use_mem_pool(self.pool)

    def release(self) -> None:
        """Gives the pool's memory back (its destructor frees what it caches); every tensor allocated in
        it must be gone by then."""
        if self.pool is not None:
            torch.cuda.synchronize()
            self.pool = None


# Pools of requests that lost the side's CUDA context: never destroyed (a pool's destructor frees its
# memory, which on a lost context fails inside a destructor and ends the process before it can reply).
# The parent ends the side after such a reply.
_LOST_POOLS: list = []


class _OwnFault(Exception):
    """The side's own work (the float64 oracle) left its CUDA context unusable: not the candidate's."""


def verify_request(side, msg: Verify) -> Verified:
    """One verdict per output of every call of the request (`side`: the harness's child.Side, whose
    last window's outputs are `side.kept`). Spot checks of all calls are judged together at the end:
    one copy to the device and one back for all of them. A request that fails with the side's CUDA
    context lost says so (device_fault), unless its own oracle lost it: the rest of a request touches
    only the candidate's memory, its own kept outputs and what it allocates to compare them."""
    memory, lost = OracleMemory(side.device), False
    try:
        reply = _verify(side, msg, memory)  # its locals, the oracles' outputs among them, gone on return
    except _OwnFault as exc:
        reply, lost = Verified(False, str(exc)), True
    except Exception as exc:  # noqa: BLE001 - reported; the parent decides (a reference failure)
        lost = _context_lost(side.device)
        reply = Verified(False, f"{type(exc).__name__}: {exc}", device_fault=lost)
    if lost:
        _LOST_POOLS.append(memory.pool)
    else:
        memory.release()
    return reply


def _sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _context_lost(device: str) -> bool:
    """Whether this process's CUDA context is unusable: a device fault is sticky, so synchronising
    reports it again. Nothing is allocated here: a device the candidate filled fails an allocation
    without any fault, and that stays the reference's failure beside it (reference_ran)."""
    try:
        _sync(device)
    except Exception:  # noqa: BLE001 - any failure here is the answer
        return True
    return False


def _verify(side, msg: Verify, memory: OracleMemory) -> Verified:
    if side.reader is None:
        side.reader = RemoteMemory(side.device, lambda: None, 1 << 44)
    # Both input buffers are known before any output is opened: an output in either, named by any
    # string, is refused by its memory (allocations.py).
    try:
        if side.input_base:
            side.reader.know_buffer("the reference's input buffer", base=side.input_base)
        if msg.input_handle:
            side.reader.know_buffer("the candidate's input buffer", handle=msg.input_handle)
    except Unreadable as exc:
        return Verified(False, str(exc))
    if msg.calls and all(call.mode == "settle" for call in msg.calls):
        return _settle(side, msg)
    tolerance = ToleranceConfig(**{k: v for k, v in msg.tolerance.items() if k in ToleranceConfig.__dataclass_fields__})
    note, verdicts = "", []
    spent = {"read": 0.0, "oracle": 0.0, "judge": 0.0}
    spots = []  # (call, output, spot_values' arguments) of every output checked at spots
    for call in msg.calls:
        _, mine = flatten_outputs(side.kept[call.ref_index])
        limit = read_limit(r.numel() * r.element_size() for r in mine if isinstance(r, torch.Tensor))
        oracle = None
        if call.mode == "oracle":
            started = time.perf_counter()
            _sync(side.device)  # a fault of the reads before it surfaces here, as theirs
            try:
                _, oracle = flatten_outputs(side._oracle_outputs(call.slot, memory.using, msg.oracle_threads))
                _sync(side.device)  # and one of the oracle's own work here, as its own
            except RuntimeError as exc:
                if _context_lost(side.device):
                    raise _OwnFault(f"the float64 oracle lost the side's CUDA context: {exc}") from None
                note = str(exc)
            spent["oracle"] += time.perf_counter() - started
        rng = random.Random(call.seed)
        results = []
        for index, (leaf, ref) in enumerate(zip(call.leaves, mine)):
            if leaf.kind != "tensor" or not isinstance(ref, torch.Tensor):
                results.append(LeafVerdict(True))
                continue
            started = time.perf_counter()
            try:
                cand = side.reader.tensor(leaf, limit=limit)
            except Unreadable as exc:
                results.append(LeafVerdict(False, unreadable=str(exc)))
                continue
            finally:
                spent["read"] += time.perf_counter() - started
            started = time.perf_counter()
            o = oracle[index] if oracle is not None and isinstance(oracle[index], torch.Tensor) else None
            bound = call.bounds[index] if index < len(call.bounds) and call.bounds[index] >= 0 else None
            if call.mode == "spots" and bound is not None:  # all of the request's spots at once, below
                spots.append((len(verdicts), len(results), (cand, ref, msg.spots, rng, bound)))
                results.append(None)
            else:
                results.append(judge.judge_leaf(cand, ref, o, call.mode, bound, rng, msg.spots, tolerance))
            spent["judge"] += time.perf_counter() - started
        verdicts.append(results)
    started = time.perf_counter()
    for (i, j, _), problem in zip(spots, judge.spots_at_once([item for *_, item in spots])):
        verdicts[i][j] = LeafVerdict(problem is None, problem or "")
    spent["spots"] = time.perf_counter() - started
    _sync(side.device)
    # Last, after every read and write of this request: what the outputs held right after the window,
    # against what they hold now (work that something here released would have changed them).
    unsettled, side.settled = settled_outputs.changed(side.settled), []
    return Verified(True, calls=verdicts, oracle_note=note, spent_s=spent, unsettled=unsettled)


def _settle(side, msg: Verify) -> Verified:
    """Right after the candidate's window: a few positions of the listed calls' outputs, read and kept
    for the next Verify (settled_outputs.py). Each call's seed draws its positions."""
    started = time.perf_counter()
    outputs, verdicts = [], []
    for call in msg.calls:
        tensors, results = [], []
        for leaf in call.leaves:
            try:
                # Read only: nothing is written into the candidate's memory before these positions are taken.
                # Outputs without a handle are left to verification (which refuses them as described).
                tensors.append(side.reader.tensor(leaf, admit=False) if leaf.kind == "tensor" and leaf.handle else None)
                results.append(LeafVerdict(True))
            except Unreadable as exc:
                tensors.append(None)
                results.append(LeafVerdict(False, unreadable=str(exc)))
        outputs.append((call.ref_index, tensors))
        verdicts.append(results)
    side.settled = settled_outputs.take([(index, tensors, random.Random(call.seed))
                                         for call, (index, tensors) in zip(msg.calls, outputs)], msg.spots)
    _sync(side.device)  # read now, and nothing of this side's left running into the next window
    return Verified(True, calls=verdicts, spent_s={"settle": time.perf_counter() - started})
