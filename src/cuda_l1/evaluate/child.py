"""The harness of a side: the process that runs one module (the reference's Model or a candidate's
ModelNew) inside the sandbox. The reference and the candidate run this same code.

Started by sandbox.py as `python -m cuda_l1.evaluate.child --read-fd R --write-fd W --inputs-fd F
--device D --plan JSON`. Order matters: confine first (confine.py: before torch and before any thread),
import torch and warm the device, then wait for the parent's key and a Setup. Nothing this process says
decides a verdict: the parent times it with its own clock, freezes it between windows, and reads its
outputs from outside (remote.py) at positions it draws afterwards. What it prints is a log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import sys
import time

from cuda_l1.evaluate.channel import KEY_BYTES, Channel, ChannelClosed
from cuda_l1.evaluate.confine import CONFINEMENT_FAILED, ConfinePlan, ConfinementError, confine_process
from cuda_l1.evaluate.describe import Describer
from cuda_l1.evaluate.doorbell import SideBell
from cuda_l1.evaluate.input_views import views_by_shift
from cuda_l1.evaluate.protocol import (BuildReply, BuildRequest, Confined, Loaded,
                                       MapInputs, Mapped, Oracle, Oracled, ProtocolError, Ran, Release, Run, Setup,
                                       Verify, encode)
from cuda_l1.evaluate.rebinding import rebound, snapshot
from cuda_l1.evaluate.validate import decode
from cuda_l1.evaluate.warmup import in_own_arena, prewarm, probe_ipc, reserve_heap, window_state


def _traceback(exc: BaseException, filename: str) -> str:
    """The module's own frames, named by its file (harness and library frames are left out)."""
    from cuda_l1.tasks.runtime import candidate_traceback

    return candidate_traceback(exc, filename)


def _plain(value):
    """load_inline arguments as JSON data (the build layer checks them in the parent)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks")


def _entry(model):
    """What a window's calls run: the module's own forward where Module.__call__ would do nothing but
    call it (no hooks, not compiled, __call__ not overridden). Its ~0.8 us a call would be harness work
    a candidate that rewrote the loop could skip; with a hook or a compiled module, the module itself."""
    import torch
    from torch.nn.modules import module

    if (not isinstance(model, torch.nn.Module) or type(model).__call__ is not torch.nn.Module.__call__
            or getattr(model, "_compiled_call_impl", None) is not None
            or any(getattr(model, name[7:], True) for name in _HOOKS) or any(getattr(module, name, True) for name in _HOOKS)):
        return model
    return model.forward


class Side:
    def __init__(self, chan: Channel, device: str, notes: dict, inputs_fd: int):
        self.chan = chan
        self.device = device
        self.notes = notes
        self.inputs_fd = inputs_fd
        self.slots: list[list] = []
        self.shifted: dict[int, list[list]] = {}  # every slot's arguments by shift (input_views.py)
        self.shift = 0  # bytes the current round's slots start into the input buffer
        self.kept: list = []  # outputs of the last window
        self.kept_previous: list = []  # and of the one before, alive until the next window ends
        self.oracle_kept = None
        self.oracle_model = None
        self.mapping = None
        self.describer = Describer()  # where the outputs of a window's calls are (describe.py)
        self.reader = None  # the reference side's reader of candidate memory (CUDA)
        self.input_base = 0  # where this side maps its input buffer (CUDA)
        self.settled = []  # the reference side's settled_outputs.Held of the candidate's last window (CUDA)
        self.bell: SideBell | None = None  # CPU: the per-call doorbell (doorbell.py)

    def send(self, message) -> None:
        self.chan.send(encode(message))

    # -- setup -------------------------------------------------------------------------------------
    def _install_build_hook(self) -> None:
        """load_inline is answered by the trusted parent, which checks the arguments, compiles in its
        own build layer (cached by content) and replies with a library path; this process only imports it."""
        import torch.utils.cpp_extension as cpp_extension

        from cuda_l1.evaluate.build.loader import load_built

        side, loaded = self, {}

        def load_inline(*args, **kwargs):
            # The same request again (load_inline in a layer's constructor, once per layer) gets the
            # module it got before, as torch's own would: it is neither built nor counted again.
            request = BuildRequest(_plain(list(args)), _plain(kwargs))
            key = json.dumps([request.args, request.kwargs], sort_keys=True)
            if key in loaded:
                return loaded[key]
            side.send(request)
            reply = decode(side.chan.recv().header, from_side=False)
            if not isinstance(reply, BuildReply) or not reply.ok:
                raise RuntimeError("extension build failed:\n" + (getattr(reply, "log", "") or "")[-8000:])
            loaded[key] = load_built(encode(reply))
            return loaded[key]

        cpp_extension.load_inline = load_inline

    def load(self, setup: Setup) -> None:
        import torch

        from cuda_l1.evaluate import inputs as harness_inputs
        from cuda_l1.tasks.runtime import load_module

        torch.set_num_threads(setup.threads)
        torch.backends.cuda.matmul.allow_tf32 = False  # the same precision as the reference: fp32 is fp32
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        if self.device == "cpu":  # subnormals flushed on both sides: a candidate that flushed them alone ran 1.3x
            torch.set_flush_denormal(True)
        self._install_build_hook()
        self.send(Confined({k: str(v) for k, v in self.notes.items()}))
        from cuda_l1.tasks.runtime import CANDIDATE_FILENAME, REFERENCE_FILENAME

        self.filename = REFERENCE_FILENAME if setup.role == "reference" else CANDIDATE_FILENAME
        self.describer.export = not (setup.role == "reference" and self.device.startswith("cuda"))
        reference = load_module(setup.reference_source, "cuda_l1_task_reference", REFERENCE_FILENAME)
        before = snapshot()
        try:
            module = reference if setup.role == "reference" else load_module(
                setup.source, "cuda_l1_candidate", self.filename)
        except BaseException as exc:  # noqa: BLE001 - any failure to import is the module's own
            self.send(Loaded(False, "compile_error", _traceback(exc, self.filename)))
            return
        cls = getattr(module, setup.class_name, None)
        if cls is None:
            self.send(Loaded(False, "compile_error", f"the module defines no {setup.class_name}"))
            return
        try:
            init_inputs = harness_inputs.make_init_inputs(reference, setup.init_seed)
            self.model = harness_inputs.build_model(cls, init_inputs, setup.init_seed, self.device, setup.mode)
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
            elif setup.heap_reserve_bytes:  # after the weights: the reserve lies above them, where the calls allocate
                reserve_heap(setup.heap_reserve_bytes)
        except BaseException as exc:  # noqa: BLE001
            self.send(Loaded(False, "runtime_error", f"{setup.class_name}(*get_init_inputs()) failed:\n"
                             + _traceback(exc, self.filename)))
            return
        self.before = before
        self.send(Loaded(True, signals=rebound(before)))

    def map_inputs(self, msg: MapInputs) -> None:
        import torch

        try:
            if self.device.startswith("cuda"):
                from cuda_l1.evaluate import cudadrv

                base = cudadrv.open_handle(self.device, msg.handle)
                buffer = cudadrv.tensor_at(self.device, base, msg.nbytes)
                self.input_base = base  # the reference side's verifier refuses outputs in it (allocations.py)
            else:
                # A private copy-on-write mapping of a read-only descriptor: writes stay in this process
                # (the parent reads the mapping back after every window to see whether any happened).
                self.mapping = mmap.mmap(self.inputs_fd, max(msg.nbytes, 1), flags=mmap.MAP_PRIVATE,
                                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
                buffer = torch.frombuffer(self.mapping, dtype=torch.uint8) if msg.nbytes else torch.empty(0, dtype=torch.uint8)
            self.shifted = views_by_shift(buffer, msg.slots, self.device)
            self.slots, self.shift = self.shifted[0], 0
            if not self.device.startswith("cuda") and self.bell is None:
                self.bell = SideBell()  # the per-call doorbell of a CPU side (doorbell.py)
        except Exception as exc:  # noqa: BLE001 - a harness failure: reported, the parent decides
            self.send(Mapped(False, f"{type(exc).__name__}: {exc}"))
            return
        self.send(Mapped(True, ring_fd=self.bell.fd if self.bell is not None else -1))

    # -- calls ---------------------------------------------------------------------------------------
    def run(self, msg: Run) -> None:
        import torch

        try:
            if msg.shift != self.shift:  # the round's placement of the inputs, built ahead (input_views.py)
                self.slots, self.shift = self.shifted[msg.shift], msg.shift
            # The last window's outputs stay alive through this one too, so memory reused from one call
            # to the next shows up as overlapping outputs even when a window holds a single call.
            self.kept_previous, self.kept = self.kept, []
            outs, calls, fast, bell = [], [], None, self.bell if msg.go else None
            describer, exports, forward = self.describer, [], _entry(self.model)
            with window_state():
                if bell is not None:  # CPU: one call per go, a ring after each (doorbell.py)
                    outs, calls, fast = self._ring_calls(msg, bell, forward)
                    for k in range(msg.rings):  # a null window: the same protocol without calls
                        if k:
                            bell.wait(msg.go + k, msg.poll)
                        bell.ring_empty(msg.go + k + 1)
                else:
                    for slot in msg.slots:
                        outs.append(forward(*self.slots[slot]))
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()  # device-wide (the parent also waits for the GPU to go idle)
            if bell is None and outs:
                calls = [describer.first(outs[0])] + [describer.later(out) for out in outs[1:]]
            if self.device.startswith("cuda"):
                exports = describer.exports(calls)
            # The harness's own per-call work (Ran.harness_s), warm, times the calls: timed after each call
            # it also held the misses of caches the call had just flushed (120-300 us after a 50 ms CPU
            # matmul, against 3.5 us warm), which no leaner loop saves. A CPU side past its first windows:
            # all of its work in a call (doorbell.SideBell.harness_work_s); else describing a call once more.
            started = time.perf_counter()
            if fast is not None and outs:
                harness_s = bell.harness_work_s(outs[-1], describer) * len(outs)
            else:
                if outs:
                    describer.later(outs[-1])
                harness_s = (time.perf_counter() - started) * len(outs)
            self.kept = outs
        except BaseException as exc:  # noqa: BLE001
            self.send(Ran(False, _traceback(exc, self.filename)))
            return
        self.send(Ran(True, calls=calls, signals=rebound(self.before) if msg.signals else [], harness_s=harness_s,
                      exports=exports))

    def _ring_calls(self, msg: Run, bell: SideBell, forward) -> tuple[list, list, object]:
        """CPU: the window's calls, one per go, a ring after each (doorbell.py). Past the side's first
        windows a later call rings its bare pointers and its layout is compared after the ring
        (describe.py). Written with locals: every lookup here is the harness's work in every call,
        which a leaner loop of the candidate's own would skip. Returns (outputs, their descriptions,
        the pointer reader the later calls rang with, or None)."""
        describer, slots, go, poll = self.describer, self.slots, msg.go, msg.poll
        wait, ring_pointers, outs, calls, fast = bell.wait, bell.ring_pointers, [], [], None
        spans = append = confirm = None
        for k, slot in enumerate(msg.slots):
            if k:
                wait(go + k, poll)  # slot k's inputs are written once call k-1 rang
            out = forward(*slots[slot])
            outs.append(out)
            if fast is not None:
                pointers = fast(out)
                if pointers is not None:
                    ring_pointers(go + k + 1, pointers, spans)
                    append(confirm(out, pointers))  # after the ring: outside the call's time
                    continue
            if not k:
                call = describer.first(out)
                bell.ring(go + 1, call)
                calls.append(call)
                if describer.trusted:
                    fast, spans, append, confirm = describer.pointers, describer.layout.spans, calls.append, describer.confirm
                continue
            call = describer.later(out)
            if type(call) is list:  # pointers in the first call's layout (describe.py)
                ring_pointers(go + k + 1, call, describer.layout.spans)
            else:
                bell.ring(go + k + 1, call)
            calls.append(call)
        describer.window_done(calls)
        return outs, calls, fast

    def _oracle_outputs(self, slot: int, memory=contextlib.nullcontext, threads: int = 1):
        """The slot's outputs computed in float64, on the device, else on the CPU (reference side only).
        `memory`: where the computation allocates on the device (the model's float64 copy, kept for
        later rounds, is made outside it); `threads`: CPU threads of a GPU side's fallback (oracle_run.on_threads)."""
        import torch

        from cuda_l1.evaluate.inputs import double_model, to_double
        from cuda_l1.evaluate.oracle_run import forward_in_float64, on_threads

        errors = []
        for device in ([self.device, "cpu"] if self.device != "cpu" else ["cpu"]):
            try:
                if self.oracle_model is None or self.oracle_model[0] != device:
                    self.oracle_model = (device, double_model(self.model, device))

                def forward(device=device):
                    with torch.no_grad(), (memory() if device.startswith("cuda") else contextlib.nullcontext()):
                        args = [to_double(a.to(device)) if isinstance(a, torch.Tensor) else a for a in self.slots[slot]]
                        return forward_in_float64(self.oracle_model[1], args)

                out = on_threads(forward, threads if device == "cpu" and self.device != "cpu" else 1)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                return out
            except Exception as exc:  # noqa: BLE001 - some operators have no float64 kernel on a device
                errors.append(f"{device}: {type(exc).__name__}: {exc}")
                self.oracle_model = None
        raise RuntimeError("; ".join(errors)[-4000:])

    def oracle(self, msg: Oracle) -> None:
        self.oracle_kept = None
        try:
            self.oracle_kept = (in_own_arena(self._oracle_outputs, msg.slot) if self.device == "cpu"
                                else self._oracle_outputs(msg.slot, threads=msg.threads))  # a thread's current GPU is device 0
        except RuntimeError as exc:
            self.send(Oracled(False, str(exc)))
            return
        self.send(Oracled(True, call=self.describer.full(self.oracle_kept)))

    def verify(self, msg: Verify) -> None:
        """Compare a round's checked calls with this side's own (the reference side on CUDA)."""
        from cuda_l1.evaluate.reference_checks import verify_request

        self.send(verify_request(self, msg))

    def release(self) -> None:
        self.settled = []  # views of the candidate's memory: gone before its handles close
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self.send(Mapped(True))

    def serve(self) -> None:
        while True:
            try:
                msg = decode(self.chan.recv().header, from_side=False)
            except ChannelClosed:
                return
            except ProtocolError as exc:
                print(f"harness: {exc}", file=sys.stderr)
                return
            if isinstance(msg, Run):
                self.run(msg)
            elif isinstance(msg, MapInputs):
                self.map_inputs(msg)
            elif isinstance(msg, Oracle):
                self.oracle(msg)
            elif isinstance(msg, Verify):
                self.verify(msg)
            elif isinstance(msg, Release):
                self.release()
            elif isinstance(msg, Setup):
                self.load(msg)
            else:  # Bye
                self.chan.send({"op": "bye"})
                return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cuda_l1.evaluate.child")
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    parser.add_argument("--inputs-fd", type=int, default=-1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--plan", required=True, help="the ConfinePlan as JSON")
    parser.add_argument("--probe", action="store_true", help="confine, initialise the device, exit 0")
    parser.add_argument("--probe-handle", default="", help="CUDA: also open this IPC handle and export one back")
    args = parser.parse_args(argv)

    plan = ConfinePlan(**json.loads(args.plan))
    keep = tuple(fd for fd in (args.read_fd, args.write_fd, args.inputs_fd) if fd >= 0)
    try:
        notes = confine_process(plan, keep_fds=keep)
    except ConfinementError as exc:  # before any module is loaded: the parent sees exit code 5 and this line
        print(f"cuda-l1 sandbox: {exc}", file=sys.stderr, flush=True)
        os._exit(CONFINEMENT_FAILED)
    try:
        prewarm(args.device)
    except BaseException as exc:  # noqa: BLE001 - reported once the channel is up
        notes["device"] = f"failed: {type(exc).__name__}: {exc}"
    if args.probe:
        if args.device.startswith("cuda") and "pid" in notes and not notes["pid"].startswith("harness is pid"):
            # Two sides with the same pid could not open each other's IPC handles: this plan would
            # reject every candidate, so the probe refuses it and a weaker namespace set is tried.
            print(json.dumps({"error": notes["pid"], "notes": notes}), file=sys.stderr, flush=True)
            os._exit(4)
        if "device" in notes:
            print(json.dumps({"error": notes["device"], "notes": notes}), file=sys.stderr, flush=True)
            os._exit(3)
        if args.probe_handle:
            os._exit(probe_ipc(args.device, args.probe_handle))
        os._exit(0)
    key = b""
    while len(key) < KEY_BYTES:
        chunk = os.read(args.read_fd, KEY_BYTES - len(key))
        if not chunk:
            os._exit(3)
        key += chunk
    chan = Channel(args.read_fd, args.write_fd, key, is_parent=False)
    del key
    side = Side(chan, args.device, notes, args.inputs_fd)
    try:
        side.serve()
    except ChannelClosed:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
