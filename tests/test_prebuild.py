"""Builds ahead of the evaluation queue: reading `load_inline` calls statically, and a pool that
dispatches only candidates whose extensions are built (so a GPU worker never waits on a compiler
while other work is ready)."""

from __future__ import annotations

import textwrap
from concurrent.futures import Future

import pytest

from cuda_l1.evaluate.build import static_specs
from cuda_l1.evaluate.build.toolchain import detect_toolchain
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.jobs import EvalJob
from cuda_l1.evaluate.local_pool import LocalPool
from cuda_l1.evaluate.verdict import OK
from cuda_l1.tasks import make_task

REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def get_inputs():
    return [torch.randn(256)]


def get_init_inputs():
    return []
'''

PLAIN = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    # {marker}
    def forward(self, x):
        return torch.relu(x) * 2
'''

EXTENSION = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

HEADER = "#include <torch/extension.h>\\n"
BODY = """
torch::Tensor relu2(torch::Tensor x) {{ return torch::relu(x) * 2; }}
"""
NAME = "relu2_{tag}"

ext = load_inline(name=NAME, cpp_sources=[HEADER + BODY], functions=["relu2"], verbose=False,
                  extra_cflags=["-O2"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu2(x)
'''


# -- reading the calls without running anything -------------------------------------------------------
def test_constants_concatenation_fstrings_and_aliases_are_resolved():
    src = textwrap.dedent('''
        from torch.utils.cpp_extension import load_inline as build_it
        import torch.utils.cpp_extension as cx
        KERNEL = "torch::Tensor f(torch::Tensor a) { return a + 1; }"
        FLAGS = ["-O3"] + ["-DNDEBUG"]
        N = 4
        a = build_it("ext_a", KERNEL, functions=["f"], extra_cflags=FLAGS)
        b = cx.load_inline(name=f"ext_b{N}", cpp_sources=KERNEL + "\\n// b", functions={"f": "doc"})
    ''')
    specs = static_specs(src)
    assert [s.name for s in specs] == ["ext_a", "ext_b4"]
    assert specs[0].extra_cflags == ("-O3", "-DNDEBUG") and specs[0].functions == (("f", "f"),)
    assert specs[1].cpp_sources[0].endswith("// b") and specs[1].functions == (("f", "doc"),)


@pytest.mark.parametrize("call", [
    'load_inline(name="e", cpp_sources=make_source(), functions=["f"])',  # a call: would need running code
    'load_inline(name="e", cpp_sources=SRC, functions=FUNCS)',            # FUNCS is bound twice
    'load_inline(name="e", cpp_sources=SRC, **OPTIONS)',                   # ** unpacking
    'load_inline(name="e", cpp_sources=__import__("os").getcwd())',        # never evaluated
    'load_inline(name="e; rm -rf /", cpp_sources=SRC)',                    # refused by the build policy
    'load_inline(name="e", cpp_sources=SRC, extra_cflags=["-fplugin=x.so"])',  # refused flag
])
def test_unknowable_or_refused_calls_are_skipped(call):
    src = textwrap.dedent(f'''
        SRC = "torch::Tensor f(torch::Tensor a) {{ return a; }}"
        FUNCS = ["f"]
        OPTIONS = {{"functions": ["f"]}}
        if True:
            FUNCS = ["g"]
        x = {call}
    ''')
    assert static_specs(src) == []


def test_bad_sources_give_no_specs_and_no_error():
    assert static_specs("def broken(:\n") == []
    assert static_specs("x = load_inline(" + "(" * 500 + ")" * 500 + ")") == []
    assert static_specs("import torch\nclass ModelNew: pass\n") == []


def test_a_call_inside_init_and_a_repeated_call_give_one_spec():
    src = textwrap.dedent('''
        from torch.utils.cpp_extension import load_inline
        SRC = "torch::Tensor f(torch::Tensor a) { return a; }"

        class ModelNew:
            def __init__(self):
                self.ext = load_inline(name="same", cpp_sources=SRC, functions=["f"])

            def again(self):
                return load_inline(name="same", cpp_sources=SRC, functions=["f"])
    ''')
    assert [s.name for s in static_specs(src)] == ["same"]


# -- a pool that builds ahead -----------------------------------------------------------------------
class ControlledPrebuilder:
    """Stands in for the compilers: the test decides when each candidate's build finishes."""

    def __init__(self):
        self.futures: dict[str, Future] = {}
        self.closed = False

    def submit(self, source: str) -> list[Future]:
        for marker in ("build-slow", "build-fails"):
            if marker in source:
                self.futures[marker] = Future()
                return [self.futures[marker]]
        return []

    def close(self, cancel: bool = False) -> None:
        self.closed = True


def _config(tmp_path) -> EvalConfig:
    timing = TimingConfig.quick()
    timing.enabled = False  # correctness only: scheduling and builds are under test, not speed
    return EvalConfig(device="cpu", timing=timing, correctness_trials=2, build_cache_dir=str(tmp_path / "builds"))


@pytest.fixture
def task():
    return make_task(REFERENCE, name="relu2", level=1, origin="test:relu2")


def test_ready_work_goes_first_and_a_waiting_job_runs_once_its_build_is_done(tmp_path, task):
    prebuilder = ControlledPrebuilder()
    pool = LocalPool("cpu", _config(tmp_path), workers=1, prebuilder=prebuilder)
    try:
        waiting = pool.submit(EvalJob(task, PLAIN.format(marker="build-slow"), key="waiting"))
        failing = pool.submit(EvalJob(task, PLAIN.format(marker="build-fails"), key="failing"))
        ready = [pool.submit(EvalJob(task, PLAIN.format(marker=f"ready {i}"), key=f"ready{i}")) for i in range(2)]
        # One worker, submitted first: without building ahead it would judge "waiting" first.
        assert [f.result(timeout=180).verdict.status for f in ready] == [OK, OK]
        assert not waiting.done() and not failing.done()
        # A build that fails is no reason to hold a candidate back: its own request reports the error.
        prebuilder.futures["build-fails"].set_exception(RuntimeError("compiler crashed"))
        assert failing.result(timeout=180).verdict.status == OK
        assert not waiting.done()
        prebuilder.futures["build-slow"].set_result(None)
        assert waiting.result(timeout=180).verdict.status == OK
    finally:
        pool.close()
    assert prebuilder.closed


def _compiler_works() -> bool:
    try:
        return detect_toolchain().cxx is not None
    except Exception:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _compiler_works(), reason="needs a C++ compiler")
def test_the_child_finds_its_extension_already_built(tmp_path, task):
    config = _config(tmp_path)
    pool = LocalPool("cpu", config, workers=1, prebuild=True)
    try:
        results = list(pool.run([EvalJob(task, EXTENSION.format(tag="ahead"), key="ext"),
                                 EvalJob(task, PLAIN.format(marker="plain"), key="plain")]))
        stats = dict(pool.prebuilder.stats)
    finally:
        pool.close()
    verdicts = {r.job.key: r.verdict for r in results}
    assert verdicts["plain"].status == OK
    ext = verdicts["ext"]
    assert ext.status == OK, ext.reasons
    assert stats == {"candidates": 1, "extensions": 1, "skipped": 0}
    # The child asked for exactly the extension that was built ahead, and got it from the cache.
    assert [(b["ok"], b["cached"]) for b in ext.timing["builds"]] == [(True, True)]
