"""The layers of the trust boundary one by one: the typed protocol, the seccomp filter, the whole
confinement sequence of a side, stopping a process tree, and the pure timing and verification rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cuda_l1.evaluate import output_memory, protocol, timing, validate, verify
from cuda_l1.evaluate.confine import ConfinePlan, landlock_abi
from cuda_l1.evaluate.protocol import CallOutputs, ProtocolError
from cuda_l1.evaluate.config import SandboxConfig
from cuda_l1.evaluate.sandbox import ChildFailure, SideProcess

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux confinement")


def _leaf(**kw) -> list:
    """An output leaf in its wire form."""
    base = {"kind": "tensor", "type": "torch.Tensor", "dtype": "float32", "shape": [4, 4], "stride": [4, 1],
            "storage_offset": 0, "nbytes": 64, "device": "cpu", "address": 4096, "handle": "", "handle_offset": 0,
            "value": None}
    base.update(kw)
    return protocol.LeafRef(**base).to_wire()


def _ran(**kw) -> dict:
    msg = {"op": "ran", "ok": True, "message": "", "calls": [{"structure": "tensor", "leaves": [_leaf()]}], "signals": []}
    msg.update(kw)
    return msg


# -- protocol --------------------------------------------------------------------------------------
def test_a_valid_reply_decodes_into_its_dataclass():
    msg = validate.decode(_ran(), from_side=True)
    assert isinstance(msg, protocol.Ran) and msg.calls[0].leaves[0].numel() == 16


def test_encoding_round_trips_with_positional_leaves():
    leaves = [protocol.LeafRef("tensor", "torch.Tensor", "float32", [4, 4], [4, 1], 0, 64, "cpu", address=4096),
              protocol.LeafRef("tensor", "torch.Tensor", "float32", [4, 4], [4, 1], 0, 64, "cuda:0",
                               handle="ab" * 64, handle_offset=128),
              protocol.LeafRef("value", "builtins.float", value=0.5)]
    message = protocol.Ran(True, calls=[protocol.CallOutputs({"seq": "tuple", "items": ["tensor", "tensor", "float"]},
                                                             leaves)], signals=["x"])
    encoded = protocol.encode(message)
    assert [leaf[0] for leaf in encoded["calls"][0]["leaves"]] == ["t", "t", "v"]
    assert validate.decode(json.loads(json.dumps(encoded)), from_side=True) == message


@pytest.mark.parametrize("bad", [
    {"ok": "yes"},
    {"calls": {"0": 1}},
    {"signals": 7},
    {"calls": [{"structure": "tensor", "leaves": [_leaf(shape=[4, 4], nbytes=60)]}]},  # view past its storage
    {"calls": [{"structure": "tensor", "leaves": [_leaf(dtype="object")]}]},
    {"calls": [{"structure": "tensor", "leaves": [_leaf(handle="zz" * 64)]}]},
    {"calls": [{"structure": "tensor", "leaves": [_leaf(shape=[-1], stride=[1])]}]},
    {"calls": [{"structure": "tensor", "leaves": [_leaf(stride=[4])]}]},
    {"calls": [{"structure": "tensor", "leaves": [_leaf()[:-1]]}]},  # a field short
    {"calls": [{"structure": "tensor", "leaves": [{"kind": "tensor"}]}]},  # not the wire form
    {"calls": [{"structure": "tensor", "leaves": [["v", "float"]]}]},
    {"extra_field": 1},
    {"harness_s": 10**400},  # valid JSON, beyond a float: OverflowError in the parent before
    {"harness_s": -(10**400)},
])
def test_malformed_replies_raise_protocol_errors(bad):
    with pytest.raises(ProtocolError):
        validate.decode(_ran(**bad), from_side=True)


def test_a_rounds_checked_calls_travel_in_one_verify_request_and_one_reply():
    leaf = protocol.LeafRef("tensor", "torch.Tensor", "float32", [4, 4], [4, 1], 0, 64, "cuda:0",
                            handle="ab" * 64, handle_offset=128)
    request = protocol.Verify([protocol.CallToVerify(i, i, mode, [-1.0], 7 + i, [leaf])
                               for i, mode in enumerate(("spots", "oracle", "full"))], 64, {"rtol": 1e-3})
    assert validate.decode(json.loads(json.dumps(protocol.encode(request))), from_side=False) == request
    reply = protocol.Verified(True, calls=[[protocol.LeafVerdict(True)], [protocol.LeafVerdict(False, "off by 2")]])
    assert validate.decode(json.loads(json.dumps(protocol.encode(reply))), from_side=True) == reply
    for bad in ({"calls": [{"ok": True}]}, {"calls": [[{"ok": "yes"}]]}, {"calls": [[{"ok": True, "extra": 1}]]}):
        with pytest.raises(ProtocolError):
            validate.decode({"op": "verified", "ok": True, **bad}, from_side=True)
    wrong_mode = protocol.encode(request)
    wrong_mode["calls"][0]["mode"] = "trust-me"
    with pytest.raises(ProtocolError):
        validate.decode(wrong_mode, from_side=False)


def test_a_side_cannot_send_what_only_the_parent_sends():
    with pytest.raises(ProtocolError):
        validate.decode({"op": "run", "slots": [0]}, from_side=True)
    with pytest.raises(ProtocolError):
        validate.decode(["not", "an", "object"], from_side=True)


# -- seccomp and the confinement sequence ----------------------------------------------------------------
_PROBE = r'''
import json, os, sys, threading, subprocess
from cuda_l1.evaluate.confine import ConfinePlan, confine_process, effective_capabilities
plan = ConfinePlan(**json.loads(sys.argv[1]))
notes = confine_process(plan)
out = {"notes": notes, "caps": effective_capabilities(), "uid": os.getuid(), "pid": os.getpid()}
def attempt(name, fn):
    try:
        fn(); out[name] = "allowed"
    except OSError as exc:
        out[name] = exc.errno
attempt("affinity", lambda: os.sched_setaffinity(0, set(range(os.cpu_count()))))
attempt("fifo", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)))
attempt("nice", lambda: os.setpriority(os.PRIO_PROCESS, 0, -5))
attempt("write_outside", lambda: open(sys.argv[2], "w").write("x"))
attempt("write_scratch", lambda: open(os.path.join(plan.scratch, "f"), "w").write("x"))
attempt("shm_hog", lambda: open("/dev/shm/hog", "wb").write(b"\0" * (plan.shm_bytes + (1 << 20))))
attempt("oom_lower", lambda: open("/proc/self/oom_score_adj", "w").write("0"))
out["oom_score_adj"] = open("/proc/self/oom_score_adj").read().strip()
from cuda_l1.evaluate.side_mounts import cgroup_mount_tops
out["cgroups_seen"] = {top: os.listdir(top) for top in cgroup_mount_tops() if os.path.isdir(top)}
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["subprocess"] = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout.strip()
print(json.dumps(out))
'''


@linux
def test_a_confined_process_keeps_working_but_cannot_change_its_scheduling_or_escape(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    outside = tmp_path / "outside.txt"
    plan = ConfinePlan(scratch=str(scratch), namespaces="pid+net+mnt", shm_bytes=8 << 20)
    import dataclasses

    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(dataclasses.asdict(plan)), str(outside)],
                          capture_output=True, text=True, timeout=120, cwd=str(scratch))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    notes = out["notes"]
    assert out["caps"] == 0, notes["identity"]
    assert not notes["seccomp"].startswith("not"), notes
    for name in ("affinity", "fifo", "nice"):
        assert out[name] != "allowed", (name, notes)
    assert out["write_scratch"] == "allowed" and out["subprocess"] == "1"
    # The host's OOM killer takes the side first; where the evaluator holds CAP_SYS_RESOURCE, the side
    # cannot take that back.
    assert notes["oom_score_adj"].startswith("1000"), notes
    if "not locked" not in notes["oom_score_adj"]:
        assert out["oom_score_adj"] == "1000" and out["oom_lower"] != "allowed", out
    if landlock_abi() >= 1:
        assert out["write_outside"] != "allowed" and not outside.exists()
    if not notes.get("namespaces", "").startswith("not"):
        # Not PID 1: two sides, each PID 1 of its namespace, could not open each other's CUDA IPC handles.
        assert out["pid"] != 1 and notes["pid"].startswith("harness is pid"), notes
    if not notes.get("namespaces", "").startswith("not") and "mounts" in notes:
        assert "/dev/shm private" in notes["mounts"]
        assert out["shm_hog"] != "allowed"  # the private /dev/shm is full before it holds more than its size
        # No other side's group state (when it is frozen, the CPU time it took): every hierarchy is empty.
        assert all(entries == [] for entries in out["cgroups_seen"].values()), out
        if out["cgroups_seen"]:
            assert "hidden" in notes["mounts"], notes


_SOCKETS = r'''
import json, socket, sys
from cuda_l1.evaluate import seccomp
ok, note = seccomp.apply_filter(sys.argv[1])
out = {"ok": ok, "note": note}
for family in ("AF_INET", "AF_UNIX", "AF_NETLINK", "AF_VSOCK"):
    try:
        socket.socket(getattr(socket, family), socket.SOCK_DGRAM).close()
        out[family] = "allowed"
    except OSError as exc:
        out[family] = exc.errno
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
out["sched_core"] = "allowed" if libc.prctl(62, 1, 0, 0, 0) == 0 else ctypes.get_errno()
try:
    socket.socketpair()[0].close()
    out["socketpair"] = "allowed"
except OSError as exc:
    out["socketpair"] = exc.errno
import mmap
region = mmap.mmap(-1, 8 << 20)
for advice in ("MADV_HUGEPAGE", "MADV_DONTNEED"):
    try:
        region.madvise(getattr(mmap, advice))
        out[advice] = "allowed"
    except OSError as exc:
        out[advice] = exc.errno
print(json.dumps(out))
'''


@linux
@pytest.mark.parametrize("level", ["ip", "ip+unix"])
def test_seccomp_lets_socket_create_only_the_families_of_its_level(level):
    # A GPU machine may need Unix sockets (the probe widens "ip" to "ip+unix" there); vsock and
    # netlink stay refused at both levels: vsock reaches a virtual machine's host from any namespace.
    import errno

    proc = subprocess.run([sys.executable, "-c", _SOCKETS, level], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if not out["ok"]:
        pytest.skip(out["note"])
    assert out["AF_INET"] == "allowed", out
    assert out["AF_UNIX"] == ("allowed" if level == "ip+unix" else errno.EPERM), out
    assert out["AF_NETLINK"] == errno.EPERM and out["AF_VSOCK"] == errno.EPERM, out
    assert out["sched_core"] == errno.EPERM, out  # core scheduling refused, whatever the kernel offers
    # Unix socket pairs only where Unix sockets are allowed: their queued bytes are uncounted kernel memory
    assert out["socketpair"] == ("allowed" if level == "ip+unix" else errno.EPERM), out
    # huge pages for one side only refused; other advice (a library dropping pages) still works
    assert out["MADV_HUGEPAGE"] == errno.EPERM and out["MADV_DONTNEED"] == "allowed", out
    assert ("Unix" in out["note"]) == (level == "ip+unix"), out["note"]


def test_seccomp_socket_levels_are_checked():
    from cuda_l1.evaluate import seccomp

    with pytest.raises(ValueError, match="sockets must be one of"):
        seccomp.build_filter("x86_64", "unix")
    # "any" adds no socket rule: its program is the shortest.
    lengths = {level: len(seccomp.build_filter("x86_64", level)) for level in seccomp.SOCKET_LEVELS}
    assert lengths["any"] < min(lengths["ip"], lengths["ip+unix"])


@linux
def test_dropping_identity_as_root_ends_unprivileged_with_no_capabilities():
    """In a forked copy of this process (no interpreter to read afterwards): the uid change needs
    CAP_SETUID/CAP_SETGID, so the capability sets may only be emptied after it."""
    import os

    from cuda_l1.evaluate.confine import NOBODY, drop_identity, effective_capabilities

    if os.geteuid() != 0:
        pytest.skip("only root changes its uid")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            note = drop_identity(NOBODY)
            msg = json.dumps({"note": note, "uid": os.geteuid(), "gid": os.getegid(), "groups": os.getgroups(),
                              "caps": effective_capabilities()})
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            msg = json.dumps({"error": repr(exc)})
        os.write(write, msg.encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert "error" not in out, out
    assert (out["uid"], out["gid"], out["groups"], out["caps"]) == (NOBODY, NOBODY, [], 0), out


@linux
def test_a_root_side_takes_the_unprivileged_uid_and_no_capabilities(tmp_path):
    """The uid change needs CAP_SETUID/CAP_SETGID, so capabilities may only be emptied after it."""
    import dataclasses
    import os
    import shutil
    import tempfile

    from cuda_l1.evaluate.confine import NOBODY
    from cuda_l1.evaluate.probe import identity_uid

    if os.geteuid() != 0:
        pytest.skip("only root changes its uid")
    if identity_uid([]) is None:
        pytest.skip("this installation cannot be read by an unprivileged uid")
    scratch = tempfile.mkdtemp(prefix="cuda-l1-test-")
    try:
        os.chown(scratch, NOBODY, NOBODY)
        plan = ConfinePlan(scratch=scratch, namespaces="pid+net+mnt", shm_bytes=8 << 20, uid=NOBODY)
        proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(dataclasses.asdict(plan)),
                               str(tmp_path / "outside.txt")], capture_output=True, text=True, timeout=120, cwd=scratch)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["uid"] == NOBODY and out["caps"] == 0, out["notes"]
        assert out["write_scratch"] == "allowed" and out["subprocess"] == "1"
        assert out["oom_score_adj"] == "1000" or "not locked" in out["notes"]["oom_score_adj"], out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- stopping a side's process tree ----------------------------------------------------------------------
def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@linux
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "sigstop"])
def test_freeze_stops_every_process_of_a_side_and_thaw_lets_it_run(cgroup):
    side = SideProcess.start(SandboxConfig(cgroup=cgroup), "cpu", [])
    try:
        time.sleep(0.5)
        pids = side.tree()
        assert pids
        side.freeze()
        if side.group is not None and side._grouped():
            assert side.group.frozen() and set(pids) <= set(side.group.pids())
        else:
            assert all(_state(pid) in "tT" for pid in pids)
        ticks = side.cpu_ticks()
        time.sleep(0.2)
        assert side.cpu_ticks() <= ticks + 1
        side.thaw()
        assert _state(pids[0]) not in "tT" and not (side.group is not None and side.group.frozen())
    finally:
        side.close(graceful=False)


@linux
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "sigstop"])
def test_thaw_refuses_a_tree_that_used_cpu_time_while_stopped(cgroup):
    side = SideProcess.start(SandboxConfig(cgroup=cgroup), "cpu", [])
    try:
        time.sleep(0.5)
        side.freeze()
        # The harness itself is idle, so the CPU time it "used while stopped" is simulated on the
        # parent's record of it.
        side._frozen_ticks -= 50_000
        from cuda_l1.evaluate.sandbox import ChildFailure

        with pytest.raises(ChildFailure):
            side.thaw()
    finally:
        side.close(graceful=False)


@linux
def test_pin_side_pins_every_thread_of_a_stopped_side_from_outside():
    from cuda_l1.evaluate.pinning import pin_side

    # How a GPU evaluation takes the CPU a side burns beside its calls from its own calls: every
    # thread of both sides on one core after the first window (the side cannot undo it: seccomp).
    target = max(os.sched_getaffinity(0))
    side = SideProcess.start(SandboxConfig(), "cpu", [])
    try:
        time.sleep(0.5)
        side.freeze()
        threads = [(pid, int(tid)) for pid in side.tree() for tid in os.listdir(f"/proc/{pid}/task")]
        assert pin_side(side, target) == len(threads) > 0
        assert all(os.sched_getaffinity(tid) == {target} for _, tid in threads)
        assert side.pinned_core == target and side.notes["cpu_core"].startswith(f"{target} while timed")
        side.thaw()
    finally:
        side.close(graceful=False)


def test_gpu_sides_are_pinned_after_the_first_window_unless_told_otherwise():
    from cuda_l1.evaluate.config import EvalConfig
    from cuda_l1.evaluate.task_env import gpu_timed_core

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to choose from")
    assert gpu_timed_core(EvalConfig(device="cuda")) in os.sched_getaffinity(0)
    assert gpu_timed_core(EvalConfig(device="cuda", pin_gpu_sides=False)) is None
    assert gpu_timed_core(EvalConfig(device="cuda", cpu_core=0)) is None  # pinned from the start instead
    assert gpu_timed_core(EvalConfig(device="cpu")) is None  # CPU sides are pinned from the start
    core = max(os.sched_getaffinity(0))
    assert gpu_timed_core(EvalConfig(device="cuda", timed_core=core)) == core  # a pool's per-worker core


@linux
def test_without_a_cgroup_thaw_refuses_a_tree_that_grew_while_stopped():
    side = SideProcess.start(SandboxConfig(cgroup=False), "cpu", [])
    try:
        time.sleep(0.5)
        side.freeze()
        side.frozen.discard(side.tree()[-1])  # one process the freeze did not account for: it "escaped"
        from cuda_l1.evaluate.sandbox import ChildFailure

        with pytest.raises(ChildFailure):
            side.thaw()
    finally:
        side.close(graceful=False)


@linux
def test_a_frozen_cgroup_stops_a_tree_that_forks_without_pause():
    """The race SIGSTOP has (a child forked while the tree is being listed runs on) does not exist for
    the cgroup freezer: a shell forking in a loop uses no CPU time once its group is frozen."""
    from cuda_l1.evaluate.cgroup import SideGroup

    group = SideGroup.create()
    if group is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    procs = group.procs_file
    shell = subprocess.Popen(["/bin/sh", "-c", f"echo $$ > {procs}; while true; do /bin/true & done"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(0.3)
        assert shell.pid in group.pids()
        assert group.freeze(timeout=5.0)
        used = group.cpu_usec()
        time.sleep(0.3)
        assert group.cpu_usec() - used < 1000
        group.thaw()
    finally:
        group.kill()
        shell.wait(timeout=10)
        group.remove()


# -- timing and verification rules ---------------------------------------------------------------------
def test_windows_are_charged_in_full_minus_the_fixed_overhead():
    w = timing.Window(calls=10, wall_s=0.0105, reply_s=0.002, idle_wait_s=0.008)
    assert timing.per_call_ms(w, overhead_s=0.0005) == pytest.approx(1.0)
    assert timing.calls_for(0.001, 0.02, 256) == 20 and timing.calls_for(1.0, 0.02, 256) == 1
    assert timing.calls_for(1e-9, 0.02, 64) == 64
    est = timing.estimate([2.0] * 12, [1.0] * 12, seed=1)
    assert est.point == pytest.approx(2.0) and est.score == 2.0
    assert timing.done(12, est, 1.0, min_rounds=12, max_rounds=100, max_time_s=10, target_width=0.02)
    assert not timing.done(5, None, 1.0, min_rounds=12, max_rounds=100, max_time_s=10, target_width=0.02)


def _call(*leaves: dict) -> CallOutputs:
    return CallOutputs("tensor" if len(leaves) == 1 else {"seq": "tuple", "items": ["tensor"] * len(leaves)},
                       [validate.leaf_ref(leaf) for leaf in leaves])


def test_outputs_of_one_window_may_not_share_memory():
    a, b = _call(_leaf(address=4096)), _call(_leaf(address=4096 + 32))
    assert output_memory.shared_storage([a, b]) is not None
    assert output_memory.shared_storage([a, _call(_leaf(address=8192))]) is None


def test_descriptions_are_compared_before_any_value():
    ref = _call(_leaf())
    assert verify.describe_mismatch(_call(_leaf(dtype="float16", nbytes=32)), ref)[0].check == "dtype"
    assert verify.describe_mismatch(_call(_leaf(shape=[16], stride=[1])), ref)[0].check == "shape"
    assert verify.describe_mismatch(_call(protocol.LeafRef("foreign", "Deferred").to_wire()), ref)[0].status == "rejected"
    assert verify.describe_mismatch(_call(_leaf(), _leaf(address=9000)), ref)[0].check == "output_structure"
    assert verify.describe_mismatch(_call(_leaf(address=1 << 20)), ref) == []
    assert output_memory.aliases(validate.leaf_ref(_leaf(address=5000)), "", [(4096, 8192)])


def test_a_side_that_keeps_capabilities_is_refused_not_run(tmp_path):
    """drop_identity fails closed: when the capabilities cannot be cleared, confinement raises (the
    harness then exits 5 before loading any module) instead of running the candidate with them."""
    import pickle

    from cuda_l1.evaluate import confine

    if confine.effective_capabilities() == 0:
        pytest.skip("this process has no capabilities to keep")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child breaks the capability drop, then confines itself
        os.close(read)
        confine._clear_capability_sets = lambda: None
        plan = confine.ConfinePlan(scratch=str(tmp_path), namespaces="", landlock=False, seccomp=False,
                                   drop_identity=True, uid=None)
        try:
            confine.confine_process(plan)
            outcome = "ran"
        except confine.ConfinementError as exc:
            outcome = f"refused: {exc}"
        except BaseException as exc:  # noqa: BLE001
            outcome = f"other: {type(exc).__name__}: {exc}"
        os.write(write, pickle.dumps(outcome))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        outcome = pickle.loads(handle.read())
    os.waitpid(pid, 0)
    assert outcome.startswith("refused: the side's identity could not be dropped"), outcome


def test_the_reference_side_judges_every_call_of_a_verify_request_in_order(monkeypatch):
    """The harness's Verify handler, with the candidate's memory read from a table instead of IPC
    handles (the CUDA path's logic, run on the CPU): one verdict list per call, each against its own
    output of the reference's last window."""
    import torch

    from cuda_l1.evaluate import child

    sent = []
    side = child.Side(chan=None, device="cpu", notes={}, inputs_fd=-1)
    side.send = sent.append
    side.kept = [torch.full((8,), float(i)) for i in range(5)]
    candidate = {100: torch.full((8,), 0.0), 101: torch.full((8,), 1.0), 102: torch.full((8,), 5.0),
                 103: torch.full((8,), 3.0), 104: torch.full((8,), 9.0)}

    class Table:
        def tensor(self, leaf, limit):
            return candidate[leaf.address]

    side.reader = Table()
    leaves = [protocol.LeafRef("tensor", "torch.Tensor", "float32", [8], [1], 0, 32, "cpu", address=100 + i)
              for i in range(5)]
    modes = ["full", "full", "full", "spots", "spots"]  # the spots of calls 4 and 5 are judged together
    request = protocol.Verify([protocol.CallToVerify(i, i, modes[i], [1e-3], i, [leaves[i]]) for i in range(5)], 4, {})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    side.verify(request)
    (reply,) = sent
    assert reply.ok and [[v.ok for v in call] for call in reply.calls] == [[True], [True], [False], [True], [False]]
    assert "at a checked position" in reply.calls[4][0].detail and set(reply.spent_s) >= {"read", "judge", "spots"}


def test_an_extension_given_to_a_side_never_follows_links_it_planted(tmp_path):
    """The side's code runs before its extension is built: links it made in its scratch directory
    (the old fixed `ext` folder, a link to the parent's files) must not carry the file anywhere else."""
    from cuda_l1.evaluate.sides import give_file

    scratch, victim = tmp_path / "scratch", tmp_path / "victim"
    scratch.mkdir()
    victim.mkdir(mode=0o700)
    (scratch / "ext").symlink_to(victim)  # what the candidate planted
    built = tmp_path / "lib.so"
    built.write_bytes(b"\x7fELF built")

    class Proc:  # what give_file needs of a side
        notes: dict = {}

        def harness_pid(self):
            return None

    proc = Proc()
    proc.scratch = str(scratch)
    given = give_file(proc, str(built))
    assert os.path.dirname(given) != str(scratch / "ext") and open(given, "rb").read() == b"\x7fELF built"
    assert list(victim.iterdir()) == [] and (victim.stat().st_mode & 0o777) == 0o700
    assert not os.path.samefile(given, built)  # a copy: the side cannot write to the build cache's file


def test_an_extension_the_sides_scratch_cannot_take_is_the_candidates_failure(tmp_path, monkeypatch):
    """The scratch directory is the candidate's: one it filled (ENOSPC) or raced into (the file made
    first) was an OSError in the parent, an "evaluator" failure, judged again and never a hack."""
    import errno

    from cuda_l1.evaluate import sides

    built = tmp_path / "lib.so"
    built.write_bytes(b"\x7fELF built")

    class Proc:
        notes: dict = {}
        scratch = str(tmp_path)

        def harness_pid(self):
            return None

    real_fdopen = os.fdopen

    class Full:  # the side's scratch tmpfs, full
        def __init__(self, fd):
            self.file = real_fdopen(fd, "wb", buffering=0)

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    monkeypatch.setattr(os, "fdopen", lambda fd, *args, **kwargs: Full(fd))
    with pytest.raises(ChildFailure, match="No space left") as caught:
        sides.give_file(Proc(), str(built))
    assert caught.value.kind == "runtime_error"
    monkeypatch.undo()
    real_open = os.open

    def raced(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise FileExistsError(errno.EEXIST, "File exists")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", raced)
    with pytest.raises(ChildFailure, match="before the parent did") as caught:
        sides.give_file(Proc(), str(built))
    assert caught.value.kind == "rejected"


def test_an_extension_the_parent_lost_is_the_evaluations_failure(tmp_path):
    """The parent's own copy (the build cache's file, trimmed by another run between the build and the
    copy) is not the candidate's doing: an ordinary error, judged again, and no directory left behind."""
    from cuda_l1.evaluate import sides

    class Proc:
        notes: dict = {}
        scratch = str(tmp_path / "scratch")

        def harness_pid(self):
            return None

    os.mkdir(Proc.scratch)
    with pytest.raises(FileNotFoundError):
        sides.give_file(Proc(), str(tmp_path / "trimmed.so"))
    assert os.listdir(Proc.scratch) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_a_side_stopped_before_it_joined_its_cgroup_is_resumed_by_its_thaw():
    """A side still starting joins its cgroup a few milliseconds in. Stopped by signal just before,
    then thawed once in the group: the thaw must resume it by signal too (a cgroup thaw does not
    resume a task stopped with SIGSTOP; such a side stayed stopped for good, and a spare or a
    candidate loaded ahead then never answered)."""
    side = SideProcess.start(SandboxConfig(), "cpu", [], None)
    try:
        side._in_group = False
        side.group, group = None, side.group  # as if the join had not landed yet
        side.freeze()
        side.group = group
        if group is not None:  # the join lands while the side is stopped
            with open(group.procs_file, "w") as fh:
                fh.write(str(side.proc.pid))
        side.thaw()
        time.sleep(0.2)
        assert _state(side.proc.pid) != "T"
        side.freeze()
        side.thaw()
        time.sleep(0.2)
        assert _state(side.proc.pid) != "T" and not side.frozen
    finally:
        side.close(graceful=False)


def test_one_probe_per_plan_whoever_asks_first(monkeypatch):
    """A worker probes ahead for its spares (probe_ahead, CUDA only) while it imports; a side's start
    asking meanwhile for the same plan waits for that probe instead of starting its own trials, and
    gets its answer. On a CPU nothing is probed ahead."""
    import threading
    import time as time_mod

    from cuda_l1.evaluate import probe
    from cuda_l1.evaluate.config import SandboxConfig

    calls, release = [], threading.Event()

    def trials(device, plans, scratch, server=None):
        calls.append((device, [p.namespaces for p in plans]))
        assert server is not None  # forked from the fork server's first stage
        release.wait(10)
        return [True] + [False] * (len(plans) - 1)

    monkeypatch.setattr(probe, "_trials", trials)
    monkeypatch.setattr(probe, "_PLANS", {})
    config = SandboxConfig()
    assert probe.probe_ahead(config, "cpu") is None
    ahead = probe.probe_ahead(config, "cuda:7", server=object())
    assert ahead is not None
    deadline = time_mod.monotonic() + 10
    while not calls and time_mod.monotonic() < deadline:  # the probe ahead under way first (on a loaded
        time_mod.sleep(0.01)  # host its thread once reached the lock after the asker's, which then probed)
    # what SideProcess.start makes for a spare: another scratch, a pinned core, the same layers
    side_plan = config.confine_plan("/elsewhere", probe.identity_uid([]) if config.drop_identity else None, cpu_core=3)
    answers = []
    asker = threading.Thread(target=lambda: answers.append(probe.usable_plan(config.namespaces, "cuda:7", side_plan)))
    asker.start()
    time_mod.sleep(0.3)
    assert answers == [] and len(calls) == 1  # waiting for the probe under way, not probing again
    release.set()
    ahead.join(10)
    asker.join(10)
    assert len(calls) == 1 and answers and answers[0][1] == "ip"
    assert probe.usable_plan(config.namespaces, "cuda:7", side_plan) == answers[0]  # remembered
    assert len(calls) == 1


def test_a_probe_for_cuda_is_the_probe_for_cuda_0(monkeypatch):
    """`cuda-l1 eval` and a Ray actor probe ahead for "cuda", the sides then ask for "cuda:0": one
    probe, filed under the device the sides name (filed under "cuda", its trials could not even set
    the device, and the sides probed again, one step after another, when they started)."""
    from cuda_l1.evaluate import probe
    from cuda_l1.evaluate.config import SandboxConfig

    calls = []

    def trials(device, plans, scratch, server=None):
        calls.append(device)
        return [True] + [False] * (len(plans) - 1)

    monkeypatch.setattr(probe, "_trials", trials)
    monkeypatch.setattr(probe, "_PLANS", {})
    config = SandboxConfig()
    ahead = probe.probe_ahead(config, "cuda", server=object())
    ahead.join(10)
    side_plan = config.confine_plan("/elsewhere", probe.identity_uid([]) if config.drop_identity else None, cpu_core=3)
    probe.usable_plan(config.namespaces, "cuda:0", side_plan)
    assert calls == ["cuda:0"]


def test_a_windows_calls_run_with_garbage_collection_off_on_either_side():
    """The harness turns the collector off for a window's calls and back on after (warmup.no_collection):
    a candidate that turns it off for itself gains nothing over the reference's side."""
    import gc

    import torch

    from cuda_l1.evaluate import child

    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(gc.isenabled())
            return x + 1

    sent = []
    side = child.Side(chan=None, device="cpu", notes={}, inputs_fd=-1)
    side.send = sent.append
    side.model, side.slots = Probe(), [[torch.zeros(4)], [torch.ones(4)]]
    assert gc.isenabled()
    side.run(protocol.Run([0, 1]))
    (reply,) = sent
    assert reply.ok, reply
    assert seen == [False, False] and gc.isenabled()
    gc.disable()  # a side whose code turned it off keeps it off
    try:
        side.run(protocol.Run([0]))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_cgroup_hierarchies_hidden_are_the_outermost_mounts():
    from cuda_l1.evaluate.side_mounts import cgroup_mount_tops

    v1 = "\n".join(f"cgroup /sys/fs/cgroup/{c} cgroup rw 0 0" for c in ("cpu", "memory", "freezer"))
    assert cgroup_mount_tops("tmpfs /sys/fs/cgroup tmpfs rw 0 0\n" + v1) == ["/sys/fs/cgroup"]
    assert cgroup_mount_tops("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n") == ["/sys/fs/cgroup"]
    elsewhere = "cgroup2 /run/cg cgroup2 rw 0 0\ncgroup /run/cg/sub cgroup rw 0 0\nproc /proc proc rw 0 0"
    assert cgroup_mount_tops(elsewhere) == ["/run/cg"]
    assert cgroup_mount_tops("proc /proc proc rw 0 0\n") == []
