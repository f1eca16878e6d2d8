"""Checking a frame field by field before anything uses it: every message of protocol.py.

`decode(header, from_side=...)` returns the message's dataclass or raises ProtocolError. Frames from a
side are untrusted (the candidate's code shares the side's process and holds the channel's key), so
every type, number, length and range is checked; frames to a side come from the trusted parent and
are checked the same way, so that a harness bug reads as a clear error rather than a misread field.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields

from cuda_l1.evaluate import describe
from cuda_l1.evaluate.protocol import (DTYPES, HANDLE_HEX, INPUT_SHIFT_STEP, MAX_CALLS, MAX_DIMS, MAX_INPUT_SHIFT,
                                       MAX_LEAVES, MAX_ORACLE_THREADS, MAX_TEXT, MODULE_MODES, BuildReply,
                                       BuildRequest, Bye, CallOutputs, CallToVerify, Confined, LeafRef, LeafSpec,
                                       LeafVerdict, Loaded, MapInputs, Mapped, Oracle, Oracled, ProtocolError, Ran,
                                       Release, Run, Setup, Verified, Verify)
from cuda_l1.text import encodable

_HANDLE = re.compile(f"[0-9a-f]{{{HANDLE_HEX}}}")

_MAX_INT = 1 << 62


# -- fields ---------------------------------------------------------------------------------------------
def _int(v, name, lo=0, hi=_MAX_INT) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise ProtocolError(f"{name}: expected an integer in [{lo}, {hi}], got {type(v).__name__}")
    return v


def _num(v, name) -> float:
    # An integer too large for a float (JSON has no limit: 10**400) is not finite either.
    if type(v) not in (int, float) or not math.isfinite(_as_float(v, name)):
        raise ProtocolError(f"{name}: expected a finite number")
    return float(v)


def _as_float(v: int | float, name: str) -> float:
    try:
        return float(v)
    except OverflowError:
        raise ProtocolError(f"{name}: a number beyond a float's range") from None


def _bool(v, name) -> bool:
    if type(v) is not bool:
        raise ProtocolError(f"{name}: expected true/false")
    return v


def _str(v, name, limit=MAX_TEXT) -> str:
    if type(v) is not str:
        raise ProtocolError(f"{name}: expected a string")
    return encodable(v[:limit])


def _list(v, name, limit) -> list:
    if type(v) is not list or len(v) > limit:
        raise ProtocolError(f"{name}: expected a list of at most {limit} items")
    return v


def _strs(v, name, limit=64) -> list[str]:
    return [_str(x, name, 300) for x in _list(v, name, limit)]


def _scalar(v, name):
    """A JSON scalar: what a non-tensor output or input may be."""
    if v is None or type(v) in (bool, int, str):
        return v if type(v) is not str else encodable(v[:300])
    if type(v) is float:
        return v  # NaN/inf allowed: a scalar output may legitimately be one
    raise ProtocolError(f"{name}: expected a scalar")


def _structure(v, depth=0):
    """The shape of a forward's return value: "tensor", a type name, or {"seq", "items"}."""
    if depth > 8:
        raise ProtocolError("structure: nested too deeply")
    if type(v) is str:
        return encodable(v[:100])
    if type(v) is dict and set(v) == {"seq", "items"}:
        return {"seq": _str(v["seq"], "structure", 20),
                "items": [_structure(x, depth + 1) for x in _list(v["items"], "structure", MAX_LEAVES)]}
    raise ProtocolError("structure: malformed")


# -- value types ----------------------------------------------------------------------------------------
def leaf_spec(d) -> LeafSpec:
    if type(d) is not dict:
        raise ProtocolError("input leaf: expected an object")
    kind = d.get("kind")
    if kind == "value":
        return LeafSpec("value", value=_scalar(d.get("value"), "input value"))
    if kind != "tensor" or d.get("dtype") not in DTYPES:
        raise ProtocolError("input leaf: unknown kind or dtype")
    shape = [_int(s, "shape", 0, 1 << 40) for s in _list(d.get("shape"), "shape", MAX_DIMS)]
    stride = [_int(s, "stride", 0, 1 << 48) for s in _list(d.get("stride"), "stride", MAX_DIMS)]
    if len(stride) != len(shape):
        raise ProtocolError("input leaf: stride and shape differ in length")
    return LeafSpec("tensor", d["dtype"], shape, stride, _int(d.get("offset"), "offset"))


def leaf_ref(d) -> LeafRef:
    """An output leaf from its positional wire form (LeafRef.to_wire)."""
    if type(d) is not list or not d:
        raise ProtocolError("output leaf: expected a list")
    kind = d[0]
    if kind == "v" and len(d) == 3:
        return LeafRef("value", _str(d[1], "type", 200), value=_scalar(d[2], "output value"))
    if kind == "f" and len(d) == 3:
        return LeafRef("foreign", _str(d[1], "type", 200), device=_str(d[2], "device", 40))
    if kind != "t" or len(d) != 11 or d[2] not in DTYPES:
        raise ProtocolError("output leaf: unknown kind or dtype")
    _, typename, dtype, shape, stride, offset, nbytes, device, address, handle, handle_offset = d
    shape = [_int(x, "shape", 0, 1 << 40) for x in _list(shape, "shape", MAX_DIMS)]
    stride = [_int(x, "stride", 0, 1 << 48) for x in _list(stride, "stride", MAX_DIMS)]
    if len(stride) != len(shape):
        raise ProtocolError("output leaf: stride and shape differ in length")
    ref = LeafRef("tensor", _str(typename, "type", 200), dtype, shape, stride, _int(offset, "storage_offset"),
                  _int(nbytes, "nbytes", 0, 1 << 44), _str(device, "device", 40),
                  _int(address, "address", 0, (1 << 64) - 1), _str(handle, "handle", 200),
                  _int(handle_offset, "handle_offset", 0, 1 << 44))
    if ref.numel() > (1 << 40) or ref.extent_bytes() > ref.nbytes:
        raise ProtocolError("output leaf: the view reaches past its storage")
    if ref.handle and not _HANDLE.fullmatch(ref.handle):
        raise ProtocolError("output leaf: malformed IPC handle")
    if ref.handle and not ref.device.startswith("cuda"):  # an IPC handle names GPU memory only
        raise ProtocolError("output leaf: an IPC handle for a tensor not on a GPU")
    return ref


def call_outputs(d) -> CallOutputs:
    if type(d) is not dict:
        raise ProtocolError("call outputs: expected an object")
    return CallOutputs(_structure(d.get("structure")), [leaf_ref(x) for x in _list(d.get("leaves"), "leaves", MAX_LEAVES)])


# -- messages -------------------------------------------------------------------------------------------
_TO_SIDE = {"setup": Setup, "inputs": MapInputs, "run": Run, "oracle": Oracle, "bye": Bye, "build_reply": BuildReply,
            "verify": Verify, "release": Release}
_FROM_SIDE = {"confined": Confined, "build": BuildRequest, "loaded": Loaded, "mapped": Mapped, "ran": Ran,
              "oracled": Oracled, "verified": Verified, "bye": Bye}


def decode(header: dict, *, from_side: bool, max_calls: int | None = None):
    """The message a header holds, every field checked. `max_calls`: a reply with more calls than were
    asked for is refused before its leaves are checked (tens of megabytes of well-formed leaves would
    otherwise cost the parent seconds and gigabytes)."""
    if type(header) is not dict:
        raise ProtocolError("a message must be an object")
    op = header.get("op")
    table = _FROM_SIDE if from_side else _TO_SIDE
    if op not in table:
        raise ProtocolError(f"unexpected message {str(op)[:40]!r}")
    calls = header.get("calls")
    if max_calls is not None and type(calls) is list and len(calls) > max_calls:
        raise ProtocolError(f"{len(calls)} calls reported, {max_calls} asked for")
    try:
        return _CHECKS[op](header)
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a check did not foresee is still a malformed frame
        raise ProtocolError(f"{op}: malformed ({type(exc).__name__}: {str(exc)[:200]})") from None


def _fields(cls, header) -> None:
    unknown = set(header) - {f.name for f in fields(cls)}
    if unknown:
        raise ProtocolError(f"{cls.__name__}: unknown fields {sorted(unknown)[:5]}")


def _check_ran(h) -> Ran:
    _fields(Ran, h)
    exports = sorted((_export(e) for e in _list(h.get("exports", []), "exports", MAX_CALLS)), key=lambda e: e[1])
    calls = []
    for item in _list(h.get("calls", []), "calls", MAX_CALLS):
        if type(item) is not list:
            calls.append(call_outputs(item))
            continue
        # A later call by its pointers, in the first call's layout (describe.py).
        if not calls:
            raise ProtocolError("a window's first call must be described in full")
        pointers = [_int(p, "pointer", 0, (1 << 64) - 1) for p in _list(item, "pointers", MAX_LEAVES)]
        try:
            calls.append(describe.rebuild(calls[0], pointers, exports))
        except describe.Unmapped as exc:
            raise ProtocolError(str(exc)) from None
    return Ran(_bool(h.get("ok"), "ok"), _str(h.get("message", ""), "message"), calls,
               _strs(h.get("signals", []), "signals"), max(_num(h.get("harness_s", 0.0), "harness_s"), 0.0),
               [list(e) for e in exports])


def _export(d) -> tuple[str, int, int]:
    """An allocation a reply names for its pointers: (IPC handle, base, size)."""
    if type(d) is not list or len(d) != 3 or type(d[0]) is not str or not _HANDLE.fullmatch(d[0]):
        raise ProtocolError("export: expected [IPC handle, base, size]")
    return d[0], _int(d[1], "export base", 0, (1 << 64) - 1), _int(d[2], "export size", 1, 1 << 44)


def _check_oracled(h) -> Oracled:
    _fields(Oracled, h)
    call = h.get("call")
    return Oracled(_bool(h.get("ok"), "ok"), _str(h.get("message", ""), "message"),
                   call_outputs(call) if call is not None else None)


def _check_confined(h) -> Confined:
    _fields(Confined, h)
    sandbox = h.get("sandbox")
    if type(sandbox) is not dict or len(sandbox) > 64:
        raise ProtocolError("confined: sandbox must be an object")
    return Confined({_str(k, "key", 60): _str(v, "value", 400) for k, v in sandbox.items()})


def _check_loaded(h) -> Loaded:
    _fields(Loaded, h)
    kind = _str(h.get("kind", ""), "kind", 40)
    # No kind blames the evaluation: the harness never sends one, and a side whose candidate has been imported
    # could forge it (an evaluation failure is not the candidate's, is judged again, and is never a hack).
    if kind not in ("", "compile_error", "runtime_error"):
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
    return Mapped(_bool(h.get("ok"), "ok"), _str(h.get("message", ""), "message"),
                  _int(h.get("ring_fd", -1), "ring_fd", -1, 1 << 20))


# Messages to a side come from the trusted parent; they are checked the same way so that a harness bug
# shows up as a clear error rather than a misread field.
def _check_setup(h) -> Setup:
    _fields(Setup, h)
    return Setup(_str(h.get("role"), "role", 20), _str(h.get("source"), "source", 1 << 24),
                 _str(h.get("reference_source"), "reference_source", 1 << 24), _str(h.get("class_name"), "class_name", 100), _int(h.get("init_seed"), "init_seed"),
                 _int(h.get("threads"), "threads", 1, 4096), _mode(h.get("mode", "train")),
                 _int(h.get("heap_reserve_bytes", 0), "heap_reserve_bytes", 0, 1 << 40))


def _mode(value) -> str:
    if value not in MODULE_MODES:
        raise ProtocolError(f"mode is one of {', '.join(MODULE_MODES)}")
    return value


def _check_inputs(h) -> MapInputs:
    _fields(MapInputs, h)
    slots = [[leaf_spec(x) for x in _list(s, "slot", MAX_LEAVES)] for s in _list(h.get("slots"), "slots", MAX_CALLS)]
    return MapInputs(_int(h.get("nbytes"), "nbytes"), _str(h.get("handle", ""), "handle", 200), slots)


def _check_run(h) -> Run:
    _fields(Run, h)
    return Run([_int(s, "slot", 0, MAX_CALLS) for s in _list(h.get("slots"), "slots", MAX_CALLS)],
               _bool(h.get("signals", False), "signals"), _int(h.get("go", 0), "go"),
               _int(h.get("rings", 0), "rings", 0, MAX_CALLS), _bool(h.get("poll", True), "poll"),
               _shift(h.get("shift", 0)))


def _shift(v) -> int:
    shift = _int(v, "shift", 0, MAX_INPUT_SHIFT)
    if shift % INPUT_SHIFT_STEP:
        raise ProtocolError(f"shift: expected a multiple of {INPUT_SHIFT_STEP}")
    return shift


def _check_oracle(h) -> Oracle:
    _fields(Oracle, h)
    return Oracle(_int(h.get("slot"), "slot", 0, MAX_CALLS), _int(h.get("threads", 1), "threads", 1, MAX_ORACLE_THREADS))


def _check_build_reply(h) -> BuildReply:
    _fields(BuildReply, h)
    return BuildReply(_bool(h.get("ok"), "ok"), _str(h.get("log", ""), "log"), _str(h.get("so_path", ""), "so_path", 4096),
                      _str(h.get("module_name", ""), "module_name", 300), _bool(h.get("is_python_module", True), "py"),
                      _bool(h.get("cached", False), "cached"), _num(h.get("build_s", 0.0) or 0.0, "build_s"))


def _anyfloat(v, name) -> float:
    if type(v) not in (int, float):
        raise ProtocolError(f"{name}: expected a number")
    return _as_float(v, name)


def _check_call_to_verify(h) -> CallToVerify:
    if type(h) is not dict:
        raise ProtocolError("verify: a call must be an object")
    _fields(CallToVerify, h)
    mode = _str(h.get("mode"), "mode", 10)
    if mode not in ("spots", "full", "oracle", "settle"):
        raise ProtocolError("verify: unknown mode")
    return CallToVerify(_int(h.get("ref_index"), "ref_index", 0, MAX_CALLS), _int(h.get("slot"), "slot", 0, MAX_CALLS),
                        mode, [_anyfloat(b, "bound") for b in _list(h.get("bounds"), "bounds", MAX_LEAVES)],
                        _int(h.get("seed"), "seed"), [leaf_ref(x) for x in _list(h.get("leaves"), "leaves", MAX_LEAVES)])


def _check_verify(h) -> Verify:
    _fields(Verify, h)
    tol = h.get("tolerance")
    if type(tol) is not dict:
        raise ProtocolError("verify: tolerance must be an object")
    return Verify([_check_call_to_verify(c) for c in _list(h.get("calls"), "calls", MAX_CALLS)],
                  _int(h.get("spots"), "spots", 0, 1 << 20), tol, _str(h.get("input_handle", ""), "input_handle", 256),
                  _int(h.get("oracle_threads", 1), "oracle_threads", 1, MAX_ORACLE_THREADS))


def _leaf_verdict(d) -> LeafVerdict:
    if type(d) is not dict:
        raise ProtocolError("verified: leaf must be an object")
    _fields(LeafVerdict, d)
    return LeafVerdict(_bool(d.get("ok"), "ok"), _str(d.get("detail", ""), "detail", 2000),
                       _str(d.get("unreadable", ""), "unreadable", 2000), _bool(d.get("compared", False), "compared"),
                       _anyfloat(d.get("candidate_error", 0.0), "candidate_error"),
                       _anyfloat(d.get("allowed_error", 0.0), "allowed_error"),
                       _anyfloat(d.get("reference_error", 0.0), "reference_error"))


def _check_verified(h) -> Verified:
    _fields(Verified, h)
    calls = [[_leaf_verdict(d) for d in _list(call, "leaves", MAX_LEAVES)]
             for call in _list(h.get("calls", []), "calls", MAX_CALLS)]
    spent = h.get("spent_s", {})
    if type(spent) is not dict or len(spent) > 8:
        raise ProtocolError("verified: spent_s must be an object of at most 8 numbers")
    return Verified(_bool(h.get("ok"), "ok"), _str(h.get("message", ""), "message"), calls,
                    _str(h.get("oracle_note", ""), "oracle_note", 2000),
                    {_str(k, "spent_s", 20): _num(v, "spent_s") for k, v in spent.items()},
                    _str(h.get("unsettled", ""), "unsettled", 2000), _bool(h.get("device_fault", False), "device_fault"))


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
