"""Every message between the trusted parent and a sandboxed side, one dataclass each.

Both ends import this module. A frame's header is a JSON object; `decode(header)` turns it into the
dataclass of its `op` after checking every field (type, finite numbers, ranges, lengths). The parent
decodes what a side sends with `decode(..., from_side=True)`; anything that does not validate raises
ProtocolError, which the parent turns into a `rejected` verdict, never a traceback.

What a side says is still only a claim: a `LeafRef` tells the parent where a side says an output
lives, and the parent reads that memory itself (remote.py) instead of believing values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

MAX_LEAVES = 1024  # output or input leaves of one call
MAX_CALLS = 4096  # calls of one window
MAX_DIMS = 16
MAX_TEXT = 16_000
_MAX_INT = 1 << 62
HANDLE_HEX = 128  # a CUDA IPC handle is 64 bytes

DTYPES = ("float64", "float32", "float16", "bfloat16", "complex64", "complex128", "int64", "int32", "int16",
          "int8", "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16, "int64": 8,
            "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
            "uint16": 2, "uint32": 4, "uint64": 8}


class ProtocolError(Exception):
    """A frame that is not a valid message of this protocol."""


# -- field checks -------------------------------------------------------------------------------------
def _int(v, name, lo=0, hi=_MAX_INT) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise ProtocolError(f"{name}: expected an integer in [{lo}, {hi}], got {type(v).__name__}")
    return v


def _num(v, name) -> float:
    if type(v) not in (int, float) or not math.isfinite(v):
        raise ProtocolError(f"{name}: expected a finite number")
    return float(v)


def _bool(v, name) -> bool:
    if type(v) is not bool:
        raise ProtocolError(f"{name}: expected true/false")
    return v


def _str(v, name, limit=MAX_TEXT) -> str:
    if type(v) is not str:
        raise ProtocolError(f"{name}: expected a string")
    return v[:limit]


def _list(v, name, limit) -> list:
    if type(v) is not list or len(v) > limit:
        raise ProtocolError(f"{name}: expected a list of at most {limit} items")
    return v


def _strs(v, name, limit=64) -> list[str]:
    return [_str(x, name, 300) for x in _list(v, name, limit)]


def _scalar(v, name):
    """A JSON scalar: what a non-tensor output or input may be."""
    if v is None or type(v) in (bool, int, str):
        return v if type(v) is not str else v[:300]
    if type(v) is float:
        return v  # NaN/inf allowed: a scalar output may legitimately be one
    raise ProtocolError(f"{name}: expected a scalar")


def _structure(v, depth=0):
    """The shape of a forward's return value: "tensor", a type name, or {"seq", "items"}."""
    if depth > 8:
        raise ProtocolError("structure: nested too deeply")
    if type(v) is str:
        return v[:100]
    if type(v) is dict and set(v) == {"seq", "items"}:
        return {"seq": _str(v["seq"], "structure", 20),
                "items": [_structure(x, depth + 1) for x in _list(v["items"], "structure", MAX_LEAVES)]}
    raise ProtocolError("structure: malformed")


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

    @classmethod
    def check(cls, d) -> "LeafSpec":
        if type(d) is not dict:
            raise ProtocolError("input leaf: expected an object")
        kind = d.get("kind")
        if kind == "value":
            return cls("value", value=_scalar(d.get("value"), "input value"))
        if kind != "tensor" or d.get("dtype") not in DTYPES:
            raise ProtocolError("input leaf: unknown kind or dtype")
        shape = [_int(s, "shape", 0, 1 << 40) for s in _list(d.get("shape"), "shape", MAX_DIMS)]
        stride = [_int(s, "stride", 0, 1 << 48) for s in _list(d.get("stride"), "stride", MAX_DIMS)]
        if len(stride) != len(shape):
            raise ProtocolError("input leaf: stride and shape differ in length")
        return cls("tensor", d["dtype"], shape, stride, _int(d.get("offset"), "offset"))


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

    @classmethod
    def check(cls, d) -> "LeafRef":
        if type(d) is not dict:
            raise ProtocolError("output leaf: expected an object")
        kind, typename = d.get("kind"), _str(d.get("type", ""), "type", 200)
        if kind == "value":
            return cls("value", typename, value=_scalar(d.get("value"), "output value"))
        if kind == "foreign":
            return cls("foreign", typename, device=_str(d.get("device", ""), "device", 40))
        if kind != "tensor" or d.get("dtype") not in DTYPES:
            raise ProtocolError("output leaf: unknown kind or dtype")
        shape = [_int(s, "shape", 0, 1 << 40) for s in _list(d.get("shape"), "shape", MAX_DIMS)]
        stride = [_int(s, "stride", 0, 1 << 48) for s in _list(d.get("stride"), "stride", MAX_DIMS)]
        if len(stride) != len(shape):
            raise ProtocolError("output leaf: stride and shape differ in length")
        ref = cls("tensor", typename, d["dtype"], shape, stride, _int(d.get("storage_offset"), "storage_offset"),
                  _int(d.get("nbytes"), "nbytes", 0, 1 << 44), _str(d.get("device"), "device", 40),
                  _int(d.get("address", 0), "address", 0, (1 << 64) - 1), _str(d.get("handle", ""), "handle", 200),
                  _int(d.get("handle_offset", 0), "handle_offset", 0, 1 << 44))
        if ref.numel() > (1 << 40) or ref.extent_bytes() > ref.nbytes:
            raise ProtocolError("output leaf: the view reaches past its storage")
        if ref.handle and (len(ref.handle) != HANDLE_HEX or any(c not in "0123456789abcdef" for c in ref.handle)):
            raise ProtocolError("output leaf: malformed IPC handle")
        return ref


@dataclass
class CallOutputs:
    """One call's return value: its structure and its leaves."""

    structure: object
    leaves: list[LeafRef]

    @classmethod
    def check(cls, d) -> "CallOutputs":
        if type(d) is not dict:
            raise ProtocolError("call outputs: expected an object")
        return cls(_structure(d.get("structure")), [LeafRef.check(x) for x in _list(d.get("leaves"), "leaves", MAX_LEAVES)])


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
    op: str = "run"


@dataclass
class Oracle:
    """Parent -> reference side: compute this slot's outputs in float64 and keep them for reading."""

    slot: int
    op: str = "oracle"


@dataclass
class Verify:
    """Parent -> reference side (CUDA): compare a candidate call's outputs, which the reference side
    reads through the candidate's IPC handles, with its own outputs of the same inputs. The reference's
    outputs never leave its process: no handle of its memory exists for anyone to guess."""

    ref_index: int  # which call of the reference's last run
    slot: int  # the input slot of that call (for the float64 oracle)
    mode: str  # "spots" | "full" | "oracle"
    bound: float  # allowed difference for spots/full (negative: none known yet, compare against the oracle)
    seed: int  # positions for spot checks are drawn from this (chosen by the parent after the window)
    spots: int
    leaves: list[LeafRef]
    tolerance: dict  # precision.ToleranceConfig fields
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
    leaves: list[LeafVerdict] = field(default_factory=list)
    oracle_note: str = ""  # why no float64 oracle was available, if none was
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
    kind: str = ""  # "compile_error" | "runtime_error" | "harness_error" when not ok
    message: str = ""
    signals: list[str] = field(default_factory=list)  # guarded names the import re-bound (informational)
    op: str = "loaded"


@dataclass
class Mapped:
    ok: bool
    message: str = ""
    op: str = "mapped"


@dataclass
class Ran:
    """Side -> parent: the window is done (or raised). `signals` are informational only."""

    ok: bool
    message: str = ""
    calls: list[CallOutputs] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    op: str = "ran"


@dataclass
class Oracled:
    ok: bool
    message: str = ""
    call: CallOutputs | None = None
    op: str = "oracled"


def encode(message) -> dict:
    return asdict(message)


_TO_SIDE = {"setup": Setup, "inputs": MapInputs, "run": Run, "oracle": Oracle, "bye": Bye, "build_reply": BuildReply,
            "verify": Verify, "release": Release}
_FROM_SIDE = {"confined": Confined, "build": BuildRequest, "loaded": Loaded, "mapped": Mapped, "ran": Ran,
              "oracled": Oracled, "verified": Verified, "bye": Bye}


def decode(header: dict, *, from_side: bool):
    """The message a header holds, every field checked."""
    if type(header) is not dict:
        raise ProtocolError("a message must be an object")
    op = header.get("op")
    table = _FROM_SIDE if from_side else _TO_SIDE
    if op not in table:
        raise ProtocolError(f"unexpected message {str(op)[:40]!r}")
    return _CHECKS[op](header)


def _fields(cls, header) -> None:
    unknown = set(header) - {f.name for f in fields(cls)}
    if unknown:
        raise ProtocolError(f"{cls.__name__}: unknown fields {sorted(unknown)[:5]}")


def _check_ran(h) -> Ran:
    _fields(Ran, h)
    return Ran(_bool(h.get("ok"), "ok"), _str(h.get("message", ""), "message"),
               [CallOutputs.check(c) for c in _list(h.get("calls", []), "calls", MAX_CALLS)],
               _strs(h.get("signals", []), "signals"))


def _check_oracled(h) -> Oracled:
    _fields(Oracled, h)
    call = h.get("call")
    return Oracled(_bool(h.get("ok"), "ok"), _str(h.get("message", ""), "message"),
                   CallOutputs.check(call) if call is not None else None)


def _check_confined(h) -> Confined:
    _fields(Confined, h)
    sandbox = h.get("sandbox")
    if type(sandbox) is not dict or len(sandbox) > 64:
        raise ProtocolError("confined: sandbox must be an object")
    return Confined({_str(k, "key", 60): _str(v, "value", 400) for k, v in sandbox.items()})


def _check_loaded(h) -> Loaded:
    _fields(Loaded, h)
    kind = _str(h.get("kind", ""), "kind", 40)
    if kind not in ("", "compile_error", "runtime_error", "harness_error"):
        raise ProtocolError("loaded: unknown kind")
    return Loaded(_bool(h.get("ok"), "ok"), kind, _str(h.get("message", ""), "message"),
                  _strs(h.get("signals", []), "signals"))


def _check_build(h) -> BuildRequest:
    _fields(BuildRequest, h)
    args, kwargs = h.get("args"), h.get("kwargs")
    if type(args) is not list or type(kwargs) is not dict:
        raise ProtocolError("build: malformed arguments")
    return BuildRequest(args, kwargs)


def _check_mapped(h) -> Mapped:
    _fields(Mapped, h)
    return Mapped(_bool(h.get("ok"), "ok"), _str(h.get("message", ""), "message"))


# Messages to a side come from the trusted parent; they are checked the same way so that a harness bug
# shows up as a clear error rather than a misread field.
def _check_setup(h) -> Setup:
    _fields(Setup, h)
    return Setup(_str(h.get("role"), "role", 20), _str(h.get("source"), "source", 1 << 24),
                 _str(h.get("reference_source"), "reference_source", 1 << 24), _str(h.get("class_name"), "class_name", 100), _int(h.get("init_seed"), "init_seed"),
                 _int(h.get("threads"), "threads", 1, 4096))


def _check_inputs(h) -> MapInputs:
    _fields(MapInputs, h)
    slots = [[LeafSpec.check(x) for x in _list(s, "slot", MAX_LEAVES)] for s in _list(h.get("slots"), "slots", MAX_CALLS)]
    return MapInputs(_int(h.get("nbytes"), "nbytes"), _str(h.get("handle", ""), "handle", 200), slots)


def _check_run(h) -> Run:
    _fields(Run, h)
    return Run([_int(s, "slot", 0, MAX_CALLS) for s in _list(h.get("slots"), "slots", MAX_CALLS)],
               _bool(h.get("signals", False), "signals"))


def _check_oracle(h) -> Oracle:
    _fields(Oracle, h)
    return Oracle(_int(h.get("slot"), "slot", 0, MAX_CALLS))


def _check_build_reply(h) -> BuildReply:
    _fields(BuildReply, h)
    return BuildReply(_bool(h.get("ok"), "ok"), _str(h.get("log", ""), "log"), _str(h.get("so_path", ""), "so_path", 4096),
                      _str(h.get("module_name", ""), "module_name", 300), _bool(h.get("is_python_module", True), "py"),
                      _bool(h.get("cached", False), "cached"), _num(h.get("build_s", 0.0) or 0.0, "build_s"))


def _anyfloat(v, name) -> float:
    if type(v) not in (int, float):
        raise ProtocolError(f"{name}: expected a number")
    return float(v)


def _check_verify(h) -> Verify:
    _fields(Verify, h)
    mode = _str(h.get("mode"), "mode", 10)
    if mode not in ("spots", "full", "oracle"):
        raise ProtocolError("verify: unknown mode")
    tol = h.get("tolerance")
    if type(tol) is not dict:
        raise ProtocolError("verify: tolerance must be an object")
    return Verify(_int(h.get("ref_index"), "ref_index", 0, MAX_CALLS), _int(h.get("slot"), "slot", 0, MAX_CALLS), mode,
                  _anyfloat(h.get("bound"), "bound"), _int(h.get("seed"), "seed"), _int(h.get("spots"), "spots", 0, 1 << 20),
                  [LeafRef.check(x) for x in _list(h.get("leaves"), "leaves", MAX_LEAVES)], tol)


def _check_verified(h) -> Verified:
    _fields(Verified, h)
    leaves = []
    for d in _list(h.get("leaves", []), "leaves", MAX_LEAVES):
        if type(d) is not dict:
            raise ProtocolError("verified: leaf must be an object")
        _fields(LeafVerdict, d)
        leaves.append(LeafVerdict(_bool(d.get("ok"), "ok"), _str(d.get("detail", ""), "detail", 2000),
                                  _str(d.get("unreadable", ""), "unreadable", 2000), _bool(d.get("compared", False), "compared"),
                                  _anyfloat(d.get("candidate_error", 0.0), "candidate_error"),
                                  _anyfloat(d.get("allowed_error", 0.0), "allowed_error"),
                                  _anyfloat(d.get("reference_error", 0.0), "reference_error")))
    return Verified(_bool(h.get("ok"), "ok"), _str(h.get("message", ""), "message"), leaves,
                    _str(h.get("oracle_note", ""), "oracle_note", 2000))


def _check_release(h) -> Release:
    _fields(Release, h)
    return Release()


def _check_bye(h) -> Bye:
    _fields(Bye, h)
    return Bye()


_CHECKS = {"ran": _check_ran, "oracled": _check_oracled, "confined": _check_confined, "loaded": _check_loaded,
           "build": _check_build, "mapped": _check_mapped, "setup": _check_setup, "inputs": _check_inputs,
           "run": _check_run, "oracle": _check_oracle, "build_reply": _check_build_reply, "bye": _check_bye,
           "verify": _check_verify, "verified": _check_verified, "release": _check_release}
