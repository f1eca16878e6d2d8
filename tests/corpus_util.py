"""Reading the adversarial corpus: candidate files whose header says what the evaluator must decide.

Header lines (comments at the top of a candidate):
    # reference: <name of a file in corpus/refs without .py>
    # expect: <status>                                   (a|b: either, where the host's speed decides)
    # check: <name of the check that must fail>          (optional; a|b: either may)
    # speedup_at_least: <x> / speedup_at_most: <x>        (optional, for ok verdicts: the raw speedup)
    # score_at_most: <x>                                  (optional, for ok verdicts: the score)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cuda_l1.tasks import Task, load_task_file

CORPUS = Path(__file__).parent / "corpus"


@dataclass
class Case:
    path: Path
    reference: str
    expect: str
    check: str | None = None
    bounds: dict = field(default_factory=dict)
    open_gap: str | None = None  # header `open:`: why the expectation does not hold yet (the test is xfail)

    def expects(self, status: str) -> bool:
        return status in self.expect.split("|")

    def caught(self, verdict) -> bool:
        """Whether the check this case names (or one of `a|b`) failed in the verdict."""
        checks = [verdict.check(name) for name in (self.check or "").split("|") if name]
        return not checks or any(c is not None and c.passed is False for c in checks)

    @property
    def name(self) -> str:
        return self.path.stem

    def source(self, **substitutions: str) -> str:
        text = self.path.read_text()
        for key, value in substitutions.items():
            text = text.replace(f"__{key}__", value)
        return text

    def task(self) -> Task:
        return load_task_file(CORPUS / "refs" / f"{self.reference}.py")


def cases(kind: str) -> list[Case]:
    out = []
    for path in sorted((CORPUS / kind).glob("*.py")):
        header = {}
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            key, _, value = line[1:].strip().partition(":")
            header[key.strip()] = value.strip()
        bounds = {k: float(header[k]) for k in ("speedup_at_least", "speedup_at_most", "score_at_most") if k in header}
        out.append(Case(path, header["reference"], header["expect"], header.get("check"), bounds, header.get("open")))
    return out


def params(named: dict[str, Case], by_name: bool = True) -> list:
    """pytest parameters for the cases in `named`, by name (or in `named`'s order): a case whose header
    says `open:` is an expected failure (not strict) with that reason, so a known gap stays visible in
    every run."""
    import pytest

    return [pytest.param(name, marks=pytest.mark.xfail(reason=named[name].open_gap, strict=False))
            if named[name].open_gap else name for name in (sorted(named) if by_name else named)]


def substitutions(case: Case, tmp_path: Path, listener_port: int | None = None,
                  unix_path: str | None = None) -> dict[str, str]:
    """Values a few candidates need: where the secret file is, the evaluator's pid, a port to probe."""
    subs = {}
    if case.name == "build_reads_file":
        secret = tmp_path / "build-secret.h"
        secret.write_text("sk-test-build-0123456789\n")
        secret.chmod(0o600)
        subs["SECRET_FILE"] = str(secret)
    if case.name == "read_credentials":
        secret = tmp_path / "credentials"
        secret.write_text("aws_secret_access_key = sk-test-0123456789\n")
        subs["SECRET_FILE"] = str(secret)
        subs["EVALUATOR_PID"] = str(os.getpid())
    if case.name == "write_outside":
        subs["TARGET_FILE"] = str(tmp_path / "escaped.txt")
    if case.name == "network_access":
        subs["PORT"] = str(listener_port)
    if case.name == "unix_socket":
        subs["SOCKET_PATH"] = unix_path
    return subs


def rounds_alive_at_once(monkeypatch, case: Case, config) -> tuple:
    """Judge `case`'s candidate under `config`, counting the rounds' inputs (TaskEnv.fresh_inputs) still
    alive each time another round's are made. Returns (verdict, the most earlier rounds alive)."""
    import gc
    import weakref

    from cuda_l1.evaluate.evaluator import Evaluator
    from cuda_l1.evaluate.task_env import TaskEnv

    alive, most = [], [0]
    real = TaskEnv.fresh_inputs

    def tracked(self, count):
        gc.collect()  # what nothing refers to is gone; what is still referred to counts
        alive[:] = [ref for ref in alive if ref() is not None]
        most[0] = max(most[0], len(alive))
        inputs = real(self, count)
        alive.append(weakref.ref(inputs))
        return inputs

    monkeypatch.setattr(TaskEnv, "fresh_inputs", tracked)
    evaluator = Evaluator(case.task(), config)
    try:
        return evaluator.evaluate(case.source()), most[0]
    finally:
        evaluator.close()
