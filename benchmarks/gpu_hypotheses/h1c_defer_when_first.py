# H1c exploit sketch (run only if H1a or H1b shows a HOLE). Task: tests/corpus/refs/gpu_matmul.py
# Identical math to the reference. The candidate infers whether its window comes first in the round
# from the wall-clock gap since its previous window ended (gap = [R if prev first] + verify + settle
# + [R if now second], R ~ its own window length since both sides run the same call count), and only
# when it is confidently FIRST does it defer the last half of its calls behind a short H2D delay line
# (~2 ms: past the parent's two fast probes, before/into the reference's window). Deferred work then
# runs in the gap (charged to nobody) or inside the reference's window (charged to the reference).
# When second (verification follows at once) it computes honestly, so outputs are always complete.
#   HOLE confirmed: verdict ok, raw_speedup clearly > 1 (identical math), timing.position_effect
#   reference_second_over_first >> candidate_second_over_first; stderr log lists the inferred orders,
#   compare with timing.samples.candidate_first (recorded rounds only).
#   DEFENDED: ok at ~1.00, or incorrect (the deferred work was not done at verification).
import gc
import sys
import time
import torch
import torch.nn as nn

torch.cuda.synchronize = lambda *a, **k: None
DELAY_BYTES = 48 << 20  # ~1-2 ms over PCIe


class _State:
    prev_end = None
    prev_first = None
    win_start = None
    own_len = []
    first_now = False
    log = []


S = _State()


def _hook_harness():
    for o in gc.get_objects():
        if type(o).__name__ == "Side" and hasattr(o, "describer") and hasattr(o, "run"):
            orig = o.run

            def run(msg, _orig=orig):
                now = time.monotonic()
                decide(now, len(getattr(msg, "slots", []) or []))
                _orig(msg)
                S.prev_end = time.monotonic()
                S.own_len.append(S.prev_end - now)
            o.run = run
            return True
    return False


def decide(now, calls):
    """gap = B + [R if prev first] + [R if now second], B = verify + settle (~20-25 ms), R ~ own window."""
    S.first_now = False
    if S.prev_end is None or calls < 2 or len(S.own_len) < 6:
        S.prev_first = None
        return
    gap = now - S.prev_end
    S.log.append(gap)
    recent = S.own_len[-8:]
    r = sorted(recent)[len(recent) // 2]
    b = min(S.log[-32:])  # the smallest gap is B (prev second, now first), frequent with random pairs
    level = round((gap - b) / r) if r > 0.002 else -1  # 0, 1 or 2 windows of the reference in between
    if level == 0:
        first, prev = True, False
    elif level == 2:
        first, prev = False, True
    elif level == 1 and S.prev_first is not None:
        first = S.prev_first  # prev first -> R before the gap only -> now first; prev second -> now second
        prev = S.prev_first
    else:
        first, prev = False, None
    S.first_now = first and len(S.log) > 8
    S.prev_first = first if prev is not None else None
    print(f"H1c gap={gap*1e3:.2f}ms B={b*1e3:.2f} R={r*1e3:.2f} level={level} -> {'FIRST' if first else 'second/unknown'}",
          file=sys.stderr, flush=True)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.hooked = False
        self.k = 0

    def forward(self, a, b):
        if not self.hooked:
            self.hooked = _hook_harness()
            self.host = torch.empty(DELAY_BYTES, dtype=torch.uint8).pin_memory()
            self.dev = torch.empty(DELAY_BYTES, dtype=torch.uint8, device=a.device)
            self.cs, self.ms = torch.cuda.Stream(), torch.cuda.Stream()
            self.armed = False
        # which call of the window: the harness gives slot k's inputs at offset k * slot in one buffer
        k = a.storage_offset()
        first_call = not hasattr(self, "_last_k") or k <= self._last_k
        self._last_k = k
        if first_call:
            self.armed, self.calls = False, 0
        self.calls += 1
        if not S.first_now or self.calls <= 1:
            return torch.matmul(a, b)
        cur = torch.cuda.current_stream()
        if not self.armed:  # the delay line, once a window
            self.cs.wait_stream(cur)
            with torch.cuda.stream(self.cs):
                self.dev.copy_(self.host, non_blocking=True)
            self.ev = torch.cuda.Event()
            self.ev.record(self.cs)
            self.armed = True
        if self.calls % 2:  # defer every other call (keeps the window well above the fixed overhead)
            out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
            self.ms.wait_stream(cur)
            self.ms.wait_event(self.ev)
            with torch.cuda.stream(self.ms):
                torch.matmul(a, b, out=out)
            for t in (out, a, b):
                t.record_stream(self.ms)
            return out
        return torch.matmul(a, b)
