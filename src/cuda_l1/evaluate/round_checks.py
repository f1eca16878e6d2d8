"""What the parent checks of a round once both sides' windows are done, with both sides stopped: the
candidate's outputs (where they live, their structure, sampled or full comparisons at positions drawn
only now) and, in the pause after that, each side's inputs as written. A mixin of referee.Referee:
the checks record what fails through its `_fail`, and `phase` times them.
"""

from __future__ import annotations

import contextlib

from cuda_l1.evaluate import gating, output_checks, output_memory, settled_outputs, verify
from cuda_l1.evaluate.allocations import IN_INPUT_BUFFER
from cuda_l1.evaluate.precision import Comparison
from cuda_l1.evaluate.remote import Unreadable
from cuda_l1.evaluate.sides import ReferenceFailure, changed_inputs, placed_outputs
from cuda_l1.evaluate.slots import RoundInputs
from cuda_l1.evaluate.verdict import INCORRECT, REJECTED


class RoundChecks:
    """A round's checks, for referee.Referee (which holds the state they read and record)."""

    def _oracle_rate(self) -> float:
        """The chance of a float64 comparison in the next round (output_checks.oracle_rate), against the
        recorded windows only: the first window (a build served in it, a compiler's first run) and
        the warm-up are not what the oracle's share is of."""
        recorded_s = sum(ref.wall_s + cand.wall_s for ref, cand in self.windows)
        return output_checks.oracle_rate(self.config.timing.oracle_rate, self.phases.get("oracle_rounds", 0.0), recorded_s)

    def _compare(self, checked: list[tuple[int, str]], round_no: int) -> None:
        """Read and compare the outputs of the checked calls (index, mode: 'spots', 'full' against the
        reference's output, or 'oracle': in full against float64)."""
        cand_calls, ref_calls = self.cand.ran.calls, self.env.ref.ran.calls
        # One bound per output position, from that output's own full comparisons before this round: a
        # small output does not inherit the tolerance of a large one.
        bounds = [verify.spot_bound(self.comparisons[pos]) if self.comparisons.get(pos) else None
                  for pos in range(len(ref_calls[0].leaves))]
        if self.config.device.startswith("cuda"):
            with self.phase("verify_on_reference"):  # part of "verification": one request per round
                per_call, unsettled = output_checks.on_reference(
                    self.env, [(i, cand_calls[i], mode) for i, mode in checked], bounds, self.rng, self.config,
                    self.remaining, self.verify_spent, self.cand.buffer.handle)
            if unsettled:
                return self._fail("outputs_settled", REJECTED, f"round {round_no + 1}: {unsettled}")
        else:
            per_call = (output_checks.here(self.env, self.cand, cand_calls[i], ref_calls[i], i, mode, bounds, self.rng,
                                           self.config, self.remaining) for i, mode in checked)
        for (index, _), results in zip(checked, per_call):
            for pos, (res, ref_leaf) in enumerate(zip(results, ref_calls[index].leaves)):
                if ref_leaf.kind != "tensor":
                    continue
                if res.unreadable:
                    self._unreadable(index, pos, res.unreadable)
                    continue
                if res.compared:
                    self.comparisons.setdefault(pos, []).append(Comparison(res.ok, res.detail, res.candidate_error,
                                                                           res.allowed_error, res.reference_error))
                if not res.ok:
                    where = f"call {index + 1} of round {round_no + 1}, output {pos} ({ref_leaf.dtype}{ref_leaf.shape})"
                    self._fail("correctness", INCORRECT, f"{where}: {res.detail}")
            if self.status is not None:
                return

    def _unreadable(self, index: int, pos: int, reason: str) -> None:
        """An output the reference's side could not read as described: refused (an output in an input
        buffer, under another handle than the buffer's, is that check's failure)."""
        check = "no_input_aliasing" if reason.startswith(IN_INPUT_BUFFER) else "outputs_readable"
        self._fail(check, REJECTED, f"call {index + 1}, output {pos}: {reason}")

    def settles(self) -> bool:
        """Whether the candidate's outputs are read right after each of its windows (settle_window)."""
        tc = self.config.timing
        return self.config.device.startswith("cuda") and tc.enabled and tc.settled_calls > 0

    def settle_window(self, round_no: int) -> None:
        """CUDA, right after the candidate's window, before anything else runs: the round's checked calls
        are drawn now (still after the window, where no side sees them), and the reference's side reads
        a few positions of them and of `settled_calls` more, to be compared with the same positions at
        the end of the round's verification (settled_outputs.py). Checked calls among them, because
        their verification opens their memory and writes into it (allocations.py): work waiting on that
        write would be finished by verification, and is seen changing what was read here."""
        calls = self.cand.ran.calls
        if not calls:
            return
        self.drawn = (round_no, self._draw_checked(round_no, len(calls)))
        extra = settled_outputs.draw_calls(len(calls), self.config.timing.settled_calls, self.rng)
        chosen = sorted({i for i, _ in self.drawn[1]} | set(extra))
        with self.phase("settle_read"):
            per_call = output_checks.settle_on_reference(self.env, [(i, calls[i]) for i in chosen], self.rng,
                                                         self.config, self.remaining, self.verify_spent,
                                                         self.cand.buffer.handle)
        for index, results in zip(chosen, per_call):
            for pos, res in enumerate(results):
                if res.unreadable:
                    return self._unreadable(index, pos, res.unreadable)

    def _draw_checked(self, round_no: int, calls: int) -> list[tuple[int, str]]:
        """Which calls of the round are looked at, and how (output_checks.draw_checked)."""
        rate = self._oracle_rate()
        self.oracle_limited |= self.config.timing.enabled and round_no > 0 and rate < self.config.timing.oracle_rate
        return output_checks.draw_checked(self.rng, calls, round_no, self.config, rate)

    def _inputs_unchanged(self, slots: list[int], pristine: RoundInputs) -> bool:
        """After both windows and the outputs' verification (a side's buffer is written again only by its next
        window): whether each side left its inputs as written (the reference changing them fails the evaluation)."""
        with self.phase("input_checks"):
            for side in (self.env.ref, self.cand):
                who = "the reference" if side is self.env.ref else "the candidate"
                try:
                    changed = [f"{who} modified its input tensors (call {k + 1})" for k in changed_inputs(side, slots, pristine)]
                except Unreadable as exc:
                    changed = [f"{who}'s inputs could not be read back ({exc})"]
                if changed and side is self.env.ref:
                    raise ReferenceFailure(f"{changed[0]}; such a task cannot be judged")
                if changed:
                    self._fail("inputs_unchanged", REJECTED, changed[0])
                    return False
        return True

    def verify_round(self, round_no: int) -> None:
        cand, ref = self.cand, self.env.ref
        placed, problem = placed_outputs(cand)  # CPU: outputs in a mapping of a file placed by it, not by address
        if problem:
            return self._fail(problem[0], REJECTED, problem[1])
        calls = cand.ran.calls
        expected = len(ref.ran.calls[0].leaves) if ref.ran.calls else 0
        if any(len(call.leaves) != expected for call in calls):  # before anything costs per leaf
            self._fail("output_structure", INCORRECT,
                       f"a call returned a different number of outputs than the reference's {expected}")
            return
        # The harness keeps the previous window's outputs alive, so nothing of this window may share
        # their memory either: a static buffer is seen even in windows of one call.
        shared = output_memory.shared_storage(placed) or output_memory.shared_storage(self.previous_calls + placed)
        self.previous_calls = list(placed)
        if shared:
            self._fail("output_ownership", REJECTED, shared if output_memory.shared_storage(placed) else
                       "a call returned an output in the memory of an output of the previous window "
                       "(outputs reuse a static buffer)")
            return
        # CPU: a call's outputs must be as they were when it rang (gating.py), and where it said.
        if cand.rungs is not None and (moved := gating.unstable(cand.rungs, calls, cand.proc.harness_pid())):
            return self._fail(moved[0], REJECTED, f"round {round_no + 1}: {moved[1]}")
        if len(ref.ran.calls) != len(calls):
            raise ReferenceFailure("the reference's side reported a different number of calls than it made")
        # Which calls are looked at, and how, is drawn now: after the window, where no side can see it.
        self.rounds_verified = round_no + 1
        drawn, self.drawn = self.drawn, None  # drawn right after the window (settle_window)
        checked = drawn[1] if drawn and drawn[0] == round_no else self._draw_checked(round_no, len(calls))
        self.oracle_rounds += any(mode == "oracle" for _, mode in checked)
        for i, _ in checked:  # what the descriptions show, before anything is read
            for finding in verify.call_findings(placed[i], ref.ran.calls[i], self.cand.buffer.handle, self.cand.input_ranges):
                self._fail(finding.check, finding.status, f"call {i + 1} of round {round_no + 1}: {finding.reason}")
            if self.status is not None:
                return
        with self.phase("oracle_rounds") if any(m == "oracle" for _, m in checked) else contextlib.nullcontext():
            self._compare(checked, round_no)

