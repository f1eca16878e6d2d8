"""What the kernel counted for a side's process over its timed rounds: page faults, CPU time and
context switches, read by the parent from /proc (numbers no side can write).

A diagnostic, never a rule: identical code on a CPU has now and then timed one side 1.6-2x slower for
a whole evaluation, the other side at its usual speed, and nothing else in a verdict told which of the
side's own behaviour differed. With these in `timing.sides`, a slow side shows whether it faulted
pages, was switched out, or spent the same CPU time more slowly. They cover the whole measurement,
windows and the rest (the reference's side also computes the float64 oracle there), except
`window_faults`: the minor faults inside the side's windows alone, read around each one.
"""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read(pid: int | None) -> dict | None:
    """The process's counters now (faults and CPU seconds of all its threads; context switches of
    its main thread), or None where /proc cannot tell (another OS, a process gone)."""
    fields = _stat(pid)
    if fields is None:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            status = dict(line.split(":", 1) for line in fh if ":" in line)
        # After the name: state is field 3 of stat(5), so field n is fields[n - 3].
        return {"minor_faults": int(fields[7]), "major_faults": int(fields[9]),
                "cpu_s": (int(fields[11]) + int(fields[12])) / _TICKS,
                "voluntary_switches": int(status["voluntary_ctxt_switches"]),
                "involuntary_switches": int(status["nonvoluntary_ctxt_switches"])}
    except (OSError, ValueError, IndexError, KeyError):
        return None


def minor_faults(pid: int | None) -> int | None:
    """The process's minor page faults so far (one file read, for around every window), or None."""
    fields = _stat(pid)
    try:
        return int(fields[7]) if fields is not None else None
    except (ValueError, IndexError):
        return None


def _stat(pid: int | None) -> list[str] | None:
    """/proc/PID/stat's fields after the process name (which may hold spaces and parentheses)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def change(before: dict | None, after: dict | None) -> dict | None:
    """What was counted between two readings of one process (None unless both were read)."""
    if not before or not after:
        return None
    return {k: round(after[k] - before[k], 3) for k in before}


def add(totals: dict[str, int], name: str, before: int | None, pid: int | None) -> None:
    """Add one window's faults to its side's total: read now, against `before` (None: not counted)."""
    after = minor_faults(pid) if before is not None else None
    if before is not None and after is not None:
        totals[name] = totals.get(name, 0) + after - before


def report(counted: dict[str, tuple], window_faults: dict[str, int]) -> dict:
    """`timing.sides`: per side, what was counted since `counted` (pid, reading) and its window faults."""
    out = {}
    for name, (pid, before) in counted.items():
        out[name] = change(before, read(pid))
        if out[name] is not None and name in window_faults:
            out[name]["window_faults"] = window_faults[name]
    return out
