"""The harness that runs inside a sandboxed child: the only place candidate code ever executes.

Started by sandbox.py as `python -m cuda_l1.evaluate.child --read-fd R --write-fd W [--namespaces]`.
Order matters: confine first, bind every primitive the harness relies on, then import the candidate.
Everything this process says goes through the authenticated channel and is re-checked by the parent;
stdout/stderr are a log.
"""

from __future__ import annotations

import argparse
import builtins
import os
import sys
import threading
import time
import traceback

from cuda_l1.evaluate import confine
from cuda_l1.evaluate.channel import KEY_BYTES, Channel, ChannelClosed, encode_tensor

_MAIN_THREAD = threading.main_thread()


def _short_traceback(exc: BaseException, limit: int = 6000) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-limit:]


# -- global-state snapshot: what a candidate must not patch -----------------------------------------
def _namespaces():
    import torch
    import torch.nn.functional as F

    from cuda_l1.evaluate import inputs as harness_inputs
    from cuda_l1.evaluate import timer as harness_timer

    spaces = {
        "torch": vars(torch),
        "torch.Tensor": vars(torch.Tensor),
        "torch._C.TensorBase": vars(torch._C.TensorBase),
        "torch.nn.functional": vars(F),
        "torch.nn.Module": vars(torch.nn.Module),
        "torch.cuda": vars(torch.cuda),
        "torch.cuda.Event": vars(torch.cuda.Event),
        "torch.cuda.Stream": vars(torch.cuda.Stream),
        "torch.random": vars(torch.random),
        "time": vars(time),
        "builtins": vars(builtins),
        "os": vars(os),
        "threading": vars(threading),
        "harness.timer": vars(harness_timer),
        "harness.inputs": vars(harness_inputs),
        "harness.child": globals(),
    }
    return spaces


def _precision_flags() -> dict:
    import torch

    return {
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
        "autocast_cuda": torch.is_autocast_enabled("cuda"),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }


def snapshot_state(extra: dict | None = None) -> dict:
    """Every callable/class in the guarded namespaces (kept by reference, compared by identity), every
    value of the extra namespaces (the reference module), and the precision flags' values."""
    state = {}
    for space, mapping in _namespaces().items():
        for name, value in list(mapping.items()):
            if callable(value) or isinstance(value, type):
                state[f"{space}.{name}"] = value
    for space, mapping in (extra or {}).items():
        for name, value in list(mapping.items()):
            state[f"{space}.{name}"] = value
    for name, value in _precision_flags().items():
        state[f"flag.{name}"] = repr(value)
    return state


_TORCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__import__("torch").__file__))) + os.sep + "torch" + os.sep


def _library_wrapper(new, old) -> bool:
    """torch itself re-binds a few functions when optional parts load (torch.compile wraps
    torch.manual_seed and nn.Module.__init__, for two). Accept a replacement only if its code lives in
    torch's own installed files and it wraps the original (functools.wraps or a closure over it).
    Inputs are also checked by digest and outputs against the reference, so a forged wrapper gains nothing."""
    code = getattr(new, "__code__", None)
    if code is None or not os.path.abspath(code.co_filename).startswith(_TORCH_DIR):
        return False
    wrapped, seen = new, 0
    while hasattr(wrapped, "__wrapped__") and seen < 8:
        wrapped, seen = wrapped.__wrapped__, seen + 1
        if wrapped is old:
            return True
    cells = getattr(new, "__closure__", None) or ()
    return any(_cell(c) is old for c in cells)


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


_LIBRARY_DIRS = tuple(
    os.path.abspath(p) + os.sep for p in {__import__("sysconfig").get_path("purelib"), __import__("sysconfig").get_path("platlib")}
)


def _library_thread(thread: threading.Thread) -> bool:
    """A long-lived helper thread of an installed library (e.g. tqdm's monitor, which torch.compile's
    progress bars start): a Thread subclass defined in site-packages. Plain threads with a target, and
    executor workers, are never library helpers: that is how candidate code would finish work late."""
    cls = type(thread)
    if cls is threading.Thread or cls.__module__ in ("threading", "concurrent.futures.thread"):
        return False
    module = sys.modules.get(cls.__module__)
    path = os.path.abspath(getattr(module, "__file__", "") or "")
    return path.startswith(_LIBRARY_DIRS)


def state_changes(before: dict, extra: dict | None = None) -> list[str]:
    after = snapshot_state(extra)
    changed = []
    for key, old in before.items():
        new = after.get(key, old)
        if key not in after:
            changed.append(key)
        elif key.startswith("flag."):
            if new != old:
                changed.append(key)
        elif new is not old and not _library_wrapper(new, old):
            changed.append(key)
    return sorted(changed)[:20]


# -- the harness -------------------------------------------------------------------------------------
class Harness:
    def __init__(self, chan: Channel, setup: dict, sandbox_notes: dict):
        self.chan = chan
        self.setup = setup
        self.sandbox = sandbox_notes
        self.device = setup["device"]
        self.prev_inputs: list | None = None
        self.prev_outputs: list | None = None  # leaves of the last call, kept alive on purpose
        self.kept_outputs: list = []  # the check phase keeps earlier outputs to detect buffer reuse

    # The only way results leave this process.
    def send(self, header: dict, blobs: list[bytes] | None = None) -> None:
        self.chan.send(header, blobs)

    def prepare(self) -> bool:
        import torch

        setup = self.setup
        torch.set_num_threads(int(setup.get("threads", 1)))
        core = setup.get("cpu_core")
        if isinstance(core, int) and hasattr(os, "sched_setaffinity"):
            try:  # the core the parent times the reference on (CPU device, one thread)
                os.sched_setaffinity(0, {core})
                self.sandbox["cpu_core"] = str(core)
            except OSError:
                pass
        # Same precision as the reference: no TF32 anywhere.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
            a = torch.randn(256, 256, device=self.device)
            (a @ a).sum().item()  # creates the context and cuBLAS handles before the thread baseline
            torch.nn.functional.conv2d(a[None, None], a[None, None, :3, :3]).sum().item()
        a = torch.randn(512, 512)
        (a @ a).sum().item()  # spins up the intra-op thread pool before the thread baseline

        # Import everything the harness needs before confinement narrows what can be read.
        from cuda_l1.evaluate import inputs as harness_inputs
        from cuda_l1.evaluate import timer as harness_timer
        from cuda_l1.tasks.runtime import load_module

        self.load_module = load_module

        self.timer = harness_timer
        self.inputs_mod = harness_inputs
        if self.device == "cpu":  # where host memory is what gets timed (see timer.steady_host_allocator)
            self.sandbox["host_allocator"] = "steady" if harness_timer.steady_host_allocator() else "default"
        self.flusher = harness_timer.Flusher(self.device, int(setup.get("flush_bytes", 0)))

        limits = setup.get("limits", {})
        self.sandbox["rlimits"] = confine.apply_rlimits(
            cpu_s=int(limits.get("cpu_s", 3600)),
            file_bytes=int(limits.get("file_bytes", 256 * 2**20)),
            open_files=int(limits.get("open_files", 1024)),
            address_space_bytes=limits.get("address_space_bytes"),
            processes=limits.get("processes"),
        )
        if setup.get("landlock", True):
            read = confine.default_read_paths(list(setup.get("read_paths", [])))
            write = [os.getcwd(), "/dev"] + list(setup.get("write_paths", []))
            ok, note = confine.apply_landlock(read, write)
            self.sandbox["landlock"] = note if ok else f"not enforced: {note}"
        else:
            self.sandbox["landlock"] = "disabled by configuration"

        self._install_build_hook()
        return True

    # load_inline is answered by the trusted parent, which checks the arguments, compiles in its own
    # build layer (cached by content) and replies with a library path; this process only imports it.
    def _install_build_hook(self) -> None:
        try:
            import torch.utils.cpp_extension as cpp_extension

            from cuda_l1.evaluate.build.loader import load_built
        except Exception:  # pragma: no cover - torch without cpp_extension
            return
        chan = self.chan

        def plain(value):
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {str(k): plain(v) for k, v in value.items()}
            return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)

        def load_inline(*args, **kwargs):
            chan.send({"op": "build", "args": plain(list(args)), "kwargs": plain(kwargs)})
            reply = chan.recv()
            if not reply.header.get("ok"):
                raise RuntimeError("extension build failed:\n" + str(reply.header.get("log", ""))[-8000:])
            return load_built(reply.header)

        cpp_extension.load_inline = load_inline

    def load(self) -> None:
        import torch

        load_module = self.load_module
        setup = self.setup
        self.reference = load_module(setup["reference_source"], "cuda_l1_reference", "<reference>")
        reference_dict = dict(vars(self.reference))
        self.guard_extra = {"reference": vars(self.reference)}
        self.state0 = snapshot_state(self.guard_extra)
        self.ref_names = {k: id(v) for k, v in reference_dict.items()}
        self.threads0 = {t.ident for t in threading.enumerate()}
        try:
            candidate = load_module(setup["candidate_source"], "cuda_l1_candidate", "<candidate>")
        except BaseException as exc:  # noqa: BLE001 - any failure to import is the candidate's
            self.send({"op": "loaded", "ok": False, "kind": "compile_error", "message": _short_traceback(exc)})
            return
        model_cls = getattr(candidate, "ModelNew", None)
        if model_cls is None:
            self.send({"op": "loaded", "ok": False, "kind": "compile_error",
                       "message": "the candidate module defines no ModelNew"})
            return
        try:
            init_inputs = self.inputs_mod.make_init_inputs(self.reference, int(setup["init_seed"]))
            self.model = self.inputs_mod.build_model(model_cls, init_inputs, int(setup["init_seed"]), self.device)
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001
            self.send({"op": "loaded", "ok": False, "kind": "runtime_error",
                       "message": "ModelNew(*get_init_inputs()) failed:\n" + _short_traceback(exc)})
            return
        self.send({"op": "loaded", "ok": True, "pid": os.getpid(),
                   "state_changes": state_changes(self.state0, self.guard_extra)})

    # -- calls -------------------------------------------------------------------------------------
    def _inputs(self, seed: int, same_buffers: bool) -> list:
        fresh = self.inputs_mod.make_inputs(self.reference, seed, self.device)
        if same_buffers and self.prev_inputs is not None:
            fresh = self.inputs_mod.refill_inputs(self.prev_inputs, fresh)
        self.prev_inputs = fresh
        return fresh

    def _poison(self, nbytes_list: list[int]) -> None:
        """Fill memory the allocator will hand out next with NaN bytes, so outputs that are never
        written show up as NaN instead of passing by luck."""
        import torch

        blocks = [torch.full((max(n, 1),), 0xFF, dtype=torch.uint8, device=self.device) for n in nbytes_list]
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        del blocks

    def _python_threads(self) -> list[str]:
        """Threads started since the candidate was imported that are alive now (library helpers aside)."""
        return [t.name for t in threading.enumerate() if t.ident not in self.threads0 and not _library_thread(t)]

    def _library_threads(self) -> int:
        return sum(1 for t in threading.enumerate() if t.ident not in self.threads0 and _library_thread(t))

    def _leaf_facts(self, leaf, inputs: list) -> dict:
        import torch

        facts = {"type": type(leaf).__module__ + "." + type(leaf).__qualname__}
        if not isinstance(leaf, torch.Tensor):
            facts["value"] = leaf if isinstance(leaf, (int, float, bool)) or leaf is None else repr(leaf)[:200]
            return facts
        facts.update(
            exact_tensor=type(leaf) is torch.Tensor,
            device=str(leaf.device),
            dtype=str(leaf.dtype).replace("torch.", ""),
            shape=list(leaf.shape),
            stride=list(leaf.stride()),
            requires_grad=bool(leaf.requires_grad),
        )
        if leaf.device.type == "meta" or not type(leaf) is torch.Tensor:
            return facts

        def span(t):
            storage = t.untyped_storage()
            return storage.data_ptr(), storage.data_ptr() + storage.nbytes()

        lo, hi = span(leaf)
        facts["aliases_input"] = any(
            isinstance(x, torch.Tensor) and x.device == leaf.device and hi > span(x)[0] and span(x)[1] > lo and hi > lo
            for x in inputs
        )
        facts["reuses_earlier_output"] = any(
            hi > span(x)[0] and span(x)[1] > lo and hi > lo for x in self.kept_outputs if x.device == leaf.device
        )
        return facts

    def check(self, req: dict) -> None:
        import torch

        inputs = self._inputs(int(req["seed"]), bool(req.get("same_buffers")))
        pre = self.inputs_mod.tensor_digest(inputs)
        self._poison([int(n) for n in req.get("poison_bytes", [])])
        try:
            with torch.no_grad():
                out = self.model(*inputs)
            structure, leaves = self.inputs_mod.flatten_outputs(out)
            facts = [self._leaf_facts(leaf, inputs) for leaf in leaves]
            blobs, metas = [], []
            for leaf, fact in zip(leaves, facts):
                if isinstance(leaf, torch.Tensor) and fact.get("exact_tensor") and leaf.device.type != "meta":
                    meta, blob = encode_tensor(leaf)  # copies on the harness stream, right after return
                    metas.append(meta)
                    blobs.append(blob)
                else:
                    metas.append(None)
                    blobs.append(b"")
            self.timer.sync(self.device)
            post = self.inputs_mod.tensor_digest(inputs)
        except BaseException as exc:  # noqa: BLE001
            self.send({"op": "checked", "ok": False, "message": _short_traceback(exc)})
            return
        # Earlier outputs must still hold what they held: a candidate returning one static buffer
        # overwrites what its caller already received.
        earlier_changed = False
        for kept, digest in getattr(self, "kept_digests", []):
            if self.inputs_mod.tensor_digest([kept]) != digest:
                earlier_changed = True
        # Keep the outputs of the last two calls only: enough to see a buffer being reused, without
        # hashing every earlier output again on every call.
        fresh = [x for x in leaves if isinstance(x, torch.Tensor) and type(x) is torch.Tensor]
        self.kept_outputs = (self.kept_outputs + fresh)[-2 * max(len(fresh), 1):]
        self.kept_digests = (getattr(self, "kept_digests", []) + [
            (x, self.inputs_mod.tensor_digest([x])) for x in fresh])[-2 * max(len(fresh), 1):]
        self.send(
            {"op": "checked", "ok": True, "structure": structure, "facts": facts, "metas": metas,
             "input_digest_before": pre, "input_digest_after": post, "earlier_output_changed": earlier_changed,
             "python_threads": self._python_threads(), "library_threads": self._library_threads(),
             "state_changes": state_changes(self.state0, self.guard_extra)},
            blobs,
        )

    def _previous(self, req: dict) -> tuple[dict, list[bytes]]:
        """Spot values (and optionally full copies) of the previous timed call's outputs. The parent
        picks the positions only after that call returned, so they cannot be anticipated."""
        import torch

        header: dict = {}
        blobs: list[bytes] = []
        if self.prev_outputs is None:
            return header, blobs
        spots = req.get("spots") or []
        values = []
        for leaf, positions in zip(self.prev_outputs, spots):
            if isinstance(leaf, torch.Tensor) and leaf.numel() and positions:
                flat = leaf.detach().reshape(-1)
                idx = torch.tensor([p % flat.numel() for p in positions], device=flat.device)
                values.append(flat[idx].double().cpu().tolist())
            else:
                values.append([])
        header["spots"] = values
        if req.get("fetch_previous"):
            metas = []
            for leaf in self.prev_outputs:
                if isinstance(leaf, torch.Tensor) and type(leaf) is torch.Tensor:
                    meta, blob = encode_tensor(leaf)
                    metas.append(meta)
                    blobs.append(blob)
                else:
                    metas.append(None)
                    blobs.append(b"")
            header["metas"] = metas
        return header, blobs

    def timed(self, req: dict) -> None:
        import torch

        try:
            previous, blobs = self._previous(req)
            if req.get("final"):
                self.prev_outputs = None
                self.send({"op": "timed", "ok": True, "previous": previous,
                           "python_threads": self._python_threads(), "library_threads": self._library_threads(),
                           "state_changes": state_changes(self.state0, self.guard_extra)}, blobs)
                return
            inputs = self._inputs(int(req["seed"]), bool(req.get("same_buffers")))
            self.timer.sync(self.device)
            with torch.no_grad():
                out, call_time = self.timer.time_call(self.model, inputs, self.device, self.flusher)
            _, leaves = self.inputs_mod.flatten_outputs(out)
            self.prev_outputs = leaves
        except BaseException as exc:  # noqa: BLE001
            self.send({"op": "timed", "ok": False, "message": _short_traceback(exc)})
            return
        self.send(
            {"op": "timed", "ok": True, "event_ms": call_time.event_ms, "wall_ms": call_time.wall_ms,
             "previous": previous, "python_threads": self._python_threads(), "library_threads": self._library_threads(),
             "state_changes": state_changes(self.state0, self.guard_extra) if req.get("check_state") else []},
            blobs,
        )

    def serve(self) -> None:
        while True:
            try:
                msg = self.chan.recv()
            except ChannelClosed:
                return
            op = msg.header.get("op")
            if op == "check":
                self.check(msg.header)
            elif op == "time":
                self.timed(msg.header)
            elif op == "ping":
                self.send({"op": "pong"})
            elif op == "bye":
                self.send({"op": "bye"})
                return


def _wait_and_mirror(pid: int) -> None:
    """The process outside the namespaces: wait for the harness and exit the way it exited."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _prewarm(device: str | None) -> None:
    import torch

    from cuda_l1.evaluate import inputs, timer  # noqa: F401
    from cuda_l1.tasks import runtime  # noqa: F401

    if device and device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        torch.zeros(1, device=device).add_(1).item()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cuda_l1.evaluate.child")
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    parser.add_argument("--namespaces", default="", help="namespaces to enter: pid+net, net or pid")
    parser.add_argument("--device", default=None, help="warm this device up before waiting for work")
    args = parser.parse_args(argv)

    confine.die_with_parent()
    notes: dict = {"namespaces": "disabled by configuration"}
    if args.namespaces:
        ok, note = confine.enter_namespaces(args.namespaces)
        notes["namespaces"] = note if ok else f"not enforced: {note}"
        if ok and "pid" in args.namespaces:
            pid = os.fork()
            if pid:
                os.close(args.read_fd)
                os.close(args.write_fd)
                _wait_and_mirror(pid)
            confine.die_with_parent()

    # Pre-warm: import torch (and create the CUDA context) before waiting for work, so that a spare
    # child started ahead of time is ready in milliseconds when a candidate arrives.
    _prewarm(args.device)
    key = b""
    while len(key) < KEY_BYTES:
        chunk = os.read(args.read_fd, KEY_BYTES - len(key))
        if not chunk:
            os._exit(3)
        key += chunk
    chan = Channel(args.read_fd, args.write_fd, key, is_parent=False)
    del key
    setup = chan.recv().header
    harness = Harness(chan, setup, notes)
    try:
        harness.prepare()
    except BaseException as exc:  # noqa: BLE001 - the harness itself could not start here
        chan.send({"op": "loaded", "ok": False, "kind": "harness_error", "message": _short_traceback(exc)})
        os._exit(4)
    # What confinement is in force is reported before any candidate code runs, so it cannot be forged.
    chan.send({"op": "confined", "sandbox": harness.sandbox})
    harness.load()
    harness.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
