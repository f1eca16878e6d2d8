"""The reference side's float64 oracle gives its device memory back after each verification, and
leaves alone the cache its timed windows reuse (reference_checks.OracleMemory)."""

from __future__ import annotations

import pytest
import torch

from cuda_l1.evaluate import child, protocol
from cuda_l1.evaluate.reference_checks import OracleMemory


class _Table:
    """The candidate's memory, read from a table instead of IPC handles."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def tensor(self, leaf, limit):
        return self.tensors[leaf.address]


def _oracle_request(device: str, candidate: dict) -> protocol.Verify:
    leaves = [protocol.LeafRef("tensor", "torch.Tensor", "float32", [64], [1], 0, 256, device, address=100 + i)
              for i in range(len(candidate))]
    return protocol.Verify([protocol.CallToVerify(i, i, "oracle", [-1.0], i, [leaves[i]])
                            for i in range(len(candidate))], 4, {})


def _side(device: str, inputs: list) -> child.Side:
    side = child.Side(chan=None, device=device, notes={}, inputs_fd=-1)
    side.model = torch.nn.Tanh()
    side.slots = [[x] for x in inputs]
    side.kept = [torch.tanh(x) for x in inputs]
    return side


def test_a_verify_requests_oracle_calls_are_judged_against_the_float64_reference(monkeypatch):
    """The oracle path of the reference side's Verify handler (the CUDA path's logic, on the CPU):
    a call right to float32 passes, one off in a single value fails, each against its own slot."""
    inputs = [torch.linspace(-3, 3, 64) + i for i in range(2)]
    side = _side("cpu", inputs)
    wrong = torch.tanh(inputs[1]).clone()
    wrong[17] += 0.01
    side.reader = _Table({100: torch.tanh(inputs[0]), 101: wrong})
    sent = []
    side.send = sent.append
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    side.verify(_oracle_request("cpu", {0: None, 1: None}))
    (reply,) = sent
    assert reply.ok, reply
    assert [[v.ok for v in call] for call in reply.calls] == [[True], [False]]
    assert reply.spent_s["oracle"] > 0
    assert not OracleMemory("cpu").usable  # nothing to give back on a CPU: the allocator is malloc's


@pytest.mark.gpu
def test_the_oracles_device_memory_goes_back_and_the_windows_cache_stays():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del block  # cached by the default pool, as a timed window's outputs are
    cached = torch.cuda.memory_reserved()
    assert cached >= 256 << 20
    memory = OracleMemory("cuda")
    assert memory.usable, "this torch has no torch.cuda.MemPool: the oracle's memory stays cached"
    with memory.using():
        wide = torch.ones(1 << 28, dtype=torch.float64, device="cuda")  # 2 GiB
        out = torch.tanh(wide)
    during = torch.cuda.memory_reserved()
    assert during >= cached + (4 << 30)
    del wide, out
    memory.release()
    assert torch.cuda.memory_reserved() == cached, (cached, during, torch.cuda.memory_reserved())


@pytest.mark.gpu
def test_a_reference_sides_verification_ends_holding_no_oracle_memory():
    """The Verify handler end to end on the GPU, with a 1 GiB input: the side's reserved memory after
    the request holds what it held before (its windows' cache), not that plus the oracle's 4 GiB."""
    x = torch.randn(1 << 28, device="cuda")  # 1 GiB of float32
    side = _side("cuda", [x])
    side.reader = _Table({100: torch.tanh(x)})
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    sent = []
    side.send = sent.append
    side.verify(_oracle_request("cuda", {0: None}))
    (reply,) = sent
    assert reply.ok and [[leaf.ok for leaf in call] for call in reply.calls] == [[True]], reply
    assert reply.calls[0][0].compared, reply  # judged against the oracle, not waved through
    assert reply.spent_s["oracle"] > 0
    # the judge's own work may stay cached (chunks); the oracle's float64 input and output, 4 GiB, may not
    assert torch.cuda.memory_reserved() - before < (1 << 30), (before, torch.cuda.memory_reserved())
