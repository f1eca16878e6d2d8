"""Every message between the trusted parent and a sandboxed side, one dataclass each.

Both ends import this module. A frame's header is a JSON object; `validate.decode(header)` turns it
into the dataclass of its `op` after checking every field (type, finite numbers, ranges, lengths).
The parent decodes what a side sends with `decode(..., from_side=True)`; anything that does not
validate raises ProtocolError, which the parent turns into a `rejected` verdict, never a traceback.

What a side says is still only a claim: a `LeafRef` tells the parent where a side says an output
lives, and the parent reads that memory itself (remote.py) instead of believing values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

MAX_LEAVES = 1024  # output or input leaves of one call
MAX_CALLS = 4096  # calls of one window
MAX_ORACLE_THREADS = 16  # CPU threads of a float64 oracle fallen back to the CPU (a host's worker per GPU may each)
INPUT_SHIFT_SPAN = 4096  # bytes of a CPU input buffer past its slots, for the round's shift (slots.py)
INPUT_SHIFT_STEP = 64  # a shift is a multiple of this: PyTorch's own CPU alignment
MAX_INPUT_SHIFT = INPUT_SHIFT_SPAN - INPUT_SHIFT_STEP
MAX_DIMS = 16
MAX_TEXT = 16_000
HANDLE_HEX = 128  # a CUDA IPC handle is 64 bytes

MODULE_MODES = ("train", "eval")  # Setup.mode: the model as constructed, or after model.eval()
DTYPES = ("float64", "float32", "float16", "bfloat16", "complex64", "complex128", "int64", "int32", "int16",
          "int8", "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16, "int64": 8,
            "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
            "uint16": 2, "uint32": 4, "uint64": 8}


class ProtocolError(Exception):
    """A frame that is not a valid message of this protocol."""


# -- shared value types -------------------------------------------------------------------------------
@dataclass
class LeafSpec:
    """One input leaf of one slot: a tensor in the parent's input buffer, or a plain value."""

    kind: str  # "tensor" | "value"
    dtype: str = ""
    shape: list[int] = field(default_factory=list)
    stride: list[int] = field(default_factory=list)
    offset: int = 0  # bytes from the start of the input buffer
    value: object = None



@dataclass
class LeafRef:
    """Where a side says one output leaf lives (tensors) or what it is (values and foreign objects)."""

    kind: str  # "tensor" | "value" | "foreign" (a tensor subclass, a meta/sparse tensor, anything else)
    type: str = ""
    dtype: str = ""
    shape: list[int] = field(default_factory=list)
    stride: list[int] = field(default_factory=list)
    storage_offset: int = 0  # elements
    nbytes: int = 0  # bytes of the storage the tensor views
    device: str = ""
    address: int = 0  # CPU: address of the storage in the side's memory
    handle: str = ""  # CUDA: IPC handle (hex) of the allocation that holds the storage
    handle_offset: int = 0  # CUDA: bytes from that allocation's start to the storage
    value: object = None

    def to_wire(self) -> list:
        """Positional on the wire (validate.leaf_ref reads it back): a reply describes every call of
        its window inside that window's timed span, and a list costs a fraction of a keyed object."""
        if self.kind == "value":
            return ["v", self.type, self.value]
        if self.kind == "foreign":
            return ["f", self.type, self.device]
        return ["t", self.type, self.dtype, self.shape, self.stride, self.storage_offset, self.nbytes, self.device,
                self.address, self.handle, self.handle_offset]

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def extent_bytes(self) -> int:
        """Bytes of storage the view reaches, from the storage's start."""
        if self.numel() == 0:
            return 0
        last = self.storage_offset + sum((s - 1) * st for s, st in zip(self.shape, self.stride))
        return (last + 1) * ITEMSIZE[self.dtype]



@dataclass
class CallOutputs:
    """One call's return value: its structure and its leaves."""

    structure: object
    leaves: list[LeafRef]



# -- messages ------------------------------------------------------------------------------------------
@dataclass
class Setup:
    """Parent -> side: which module to load and how."""

    role: str  # "reference" | "candidate"
    source: str  # the module to run (the candidate's, or the reference's own)
    reference_source: str  # the task's reference: its get_init_inputs builds the model's arguments
    class_name: str  # "Model" or "ModelNew"
    init_seed: int
    threads: int
    mode: str = "train"  # "train": the model as constructed; "eval": model.eval() right after it
    heap_reserve_bytes: int = 0  # CPU: main heap touched once after the model is built (warmup.reserve_heap)
    op: str = "setup"


@dataclass
class MapInputs:
    """Parent -> side: the input buffer and where every slot's leaves are in it. On CUDA the buffer is
    an allocation of the parent's, shared by IPC handle; on CPU it is the memfd the side was started with."""

    nbytes: int
    handle: str  # "" on CPU
    slots: list[list[LeafSpec]]
    op: str = "inputs"


@dataclass
class Run:
    """Parent -> side: call the model once per listed slot, keep every output, synchronise, report."""

    slots: list[int]
    signals: bool = False  # also report re-bound guarded names (costs a snapshot, so only when asked)
    go: int = 0  # CPU: the window's first sequence number; call k rings go+k+1 and waits for go (doorbell.py)
    rings: int = 0  # a null window (no slots): ring this many times without calling the model
    poll: bool = True  # CPU: poll the go word briefly before sleeping on it (not where the parent shares the core)
    shift: int = 0  # CPU: bytes this round's slots start into the input buffer (slots.SHIFT_SPAN)
    op: str = "run"


@dataclass
class Oracle:
    """Parent -> reference side: compute this slot's outputs in float64 and keep them for reading."""

    slot: int
    threads: int = 1  # torch CPU threads for a fallback to the CPU (the parent spread the side over as many cores)
    op: str = "oracle"


@dataclass
class CallToVerify:
    """One checked call of a Verify request."""

    ref_index: int  # which call of the reference's last run
    slot: int  # the input slot of that call (for the float64 oracle)
    mode: str  # "spots" | "full" | "oracle"; "settle": read a few positions now, again at the next Verify
    bounds: list[float]  # allowed difference per output for spots/full (negative: none known yet: the oracle)
    seed: int  # positions for spot checks are drawn from this (chosen by the parent after the window)
    leaves: list[LeafRef]  # where the candidate says this call's outputs live


@dataclass
class Verify:
    """Parent -> reference side (CUDA): compare the checked calls of a round, whose outputs the
    reference side reads through the candidate's IPC handles, with its own outputs of the same inputs.
    The reference's outputs never leave its process: no handle of its memory exists for anyone to
    guess. All checked calls of a round go in one request: each request resumes and stops the side."""

    calls: list[CallToVerify]
    spots: int
    tolerance: dict  # precision.ToleranceConfig fields
    input_handle: str = ""  # the candidate's input buffer: no output may lie in it, under any handle
    oracle_threads: int = 1  # as Oracle.threads, for this request's float64 oracle
    op: str = "verify"


@dataclass
class LeafVerdict:
    """One output leaf compared by the reference side (or by the parent, on CPU)."""

    ok: bool
    detail: str = ""
    unreadable: str = ""  # set when the candidate's memory could not be read as described
    compared: bool = False  # a full float64 comparison was made (the fields below hold its numbers)
    candidate_error: float = 0.0
    allowed_error: float = 0.0
    reference_error: float = 0.0


@dataclass
class Verified:
    ok: bool
    message: str = ""
    calls: list[list[LeafVerdict]] = field(default_factory=list)  # per call of the request, one per output
    oracle_note: str = ""  # why no float64 oracle was available, if none was
    spent_s: dict[str, float] = field(default_factory=dict)  # where the side's time went (read, oracle, judge)
    unsettled: str = ""  # an output read after its window that changed by verification (settled_outputs.py)
    device_fault: bool = False  # the request failed and left the side's CUDA context unusable (see reference_checks)
    op: str = "verified"


@dataclass
class Release:
    """Parent -> reference side: forget everything of the candidate just judged (close its handles)."""

    op: str = "release"


@dataclass
class Bye:
    op: str = "bye"


@dataclass
class BuildRequest:
    """Side -> parent: the arguments of a load_inline call (checked by the build layer, not here)."""

    args: list
    kwargs: dict
    op: str = "build"


@dataclass
class BuildReply:
    """Parent -> side: where the built library is, or why it failed."""

    ok: bool
    log: str = ""
    so_path: str = ""
    module_name: str = ""
    is_python_module: bool = True
    cached: bool = False
    build_s: float = 0.0
    op: str = "build_reply"


@dataclass
class Confined:
    """Side -> parent, before any module is imported: what confinement is in force."""

    sandbox: dict[str, str]
    op: str = "confined"


@dataclass
class Loaded:
    """Side -> parent: the module imported and the model built, or why not."""

    ok: bool
    kind: str = ""  # "compile_error" | "runtime_error" when not ok (nothing the side says is the evaluator's failure)
    message: str = ""
    signals: list[str] = field(default_factory=list)  # guarded names the import re-bound (informational)
    op: str = "loaded"


@dataclass
class Mapped:
    ok: bool
    message: str = ""
    ring_fd: int = -1  # CPU: the side's descriptor of its doorbell page (doorbell.py)
    op: str = "mapped"


@dataclass
class Ran:
    """Side -> parent: the window is done (or raised). `signals` are informational only."""

    ok: bool
    message: str = ""
    # one per call: the first in full, a later one in full or, in the first call's layout, as the
    # pointers of its tensors (describe.py); decoded, every call is in full
    calls: list[CallOutputs | list[int]] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    # the harness's own per-call work over the window (describing a later call by its pointers, timed
    # warm, times the calls): trusted from the reference's side only; sets the shortest measurable call
    harness_s: float = 0.0
    exports: list[list] = field(default_factory=list)  # CUDA: [IPC handle, base, size] holding the pointers
    op: str = "ran"


@dataclass
class Oracled:
    ok: bool
    message: str = ""
    call: CallOutputs | None = None
    op: str = "oracled"


_FIELDS: dict[type, tuple[str, ...]] = {}
_SCALARS = frozenset((int, float, str, bool, type(None)))


def _plain(v):
    t = type(v)
    if t in _SCALARS:
        return v
    if t is LeafRef:
        return v.to_wire()
    names = _FIELDS.get(t)
    if names is None and is_dataclass(v) and not isinstance(v, type):
        names = _FIELDS[t] = tuple(f.name for f in fields(v))
    if names is not None:
        return {name: _plain(getattr(v, name)) for name in names}
    if t is list or t is tuple:
        return [x if type(x) in _SCALARS else _plain(x) for x in v]
    if t is dict:
        return {k: _plain(x) for k, x in v.items()}
    return v


def encode(message) -> dict:
    """The message as a JSON-ready dict (validate.decode is its inverse). Not dataclasses.asdict,
    which deep-copies every value: a window's reply is encoded inside the timed window. Output leaves
    go positional (LeafRef.to_wire)."""
    return _plain(message)
