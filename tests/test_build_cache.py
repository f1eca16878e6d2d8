"""The build cache under concurrent processes: one compile, every process loads the published entry.

Real processes (not threads), a real compiler and a builder umask of 077, as on a locked-down host.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from cuda_l1.evaluate.build import BuildCache, BuildConfig, ExtensionSpec, build_extension

# Each process: build (or find) the spec, load it, call it, report what happened as one JSON line.
BUILD_AND_LOAD = textwrap.dedent("""
    import json, os, sys, time
    os.umask(0o077)
    import torch
    from cuda_l1.evaluate.build import BuildConfig, ExtensionSpec, build_extension, load_built
    cache, start_at = sys.argv[1], float(sys.argv[2])
    spec = ExtensionSpec.from_load_inline_args(
        name="shared_ext", cpp_sources="torch::Tensor triple(torch::Tensor a) { return a * 3; }",
        functions=["triple"])
    while time.time() < start_at:   # start both builds together
        time.sleep(0.01)
    result = build_extension(spec, BuildConfig(cache_dir=cache, pch="off"))
    value = load_built(result).triple(torch.ones(2)).tolist()
    print(json.dumps({"ok": result.ok, "cached": result.cached, "so": result.so_path, "value": value,
                      "error": result.error}))
""")


@pytest.mark.slow
def test_two_processes_build_one_spec_once_and_both_load_it(tmp_path):
    cache = tmp_path / "cache"
    start_at = str(time.time() + 8)  # both interpreters have imported torch by then
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_AND_LOAD, str(cache), start_at],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert all(r["ok"] and r["value"] == [3.0, 3.0] for r in results), results
    assert sorted(r["cached"] for r in results) == [False, True]  # compiled once, found once
    assert results[0]["so"] == results[1]["so"]

    # Published under umask 077, yet readable by anyone: a child in a user namespace is "anyone".
    entry = os.path.dirname(results[0]["so"])
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o755
    for name in os.listdir(entry):
        assert os.stat(os.path.join(entry, name)).st_mode & 0o044 == 0o044, name
    assert not list((cache / "tmp").iterdir())  # nothing half-built left behind


def test_a_stale_build_directory_is_swept_and_a_fresh_one_kept(tmp_path):
    cache = BuildCache(tmp_path)
    stale = cache.new_workdir("a" * 20)
    fresh = cache.new_workdir("b" * 20)
    old = time.time() - 2 * 24 * 3600
    os.utime(stale, (old, old))
    cache.new_workdir("c" * 20)
    assert not stale.exists() and fresh.exists()


def test_a_compile_error_is_published_readable_too(tmp_path):
    old = os.umask(0o077)
    try:
        spec = ExtensionSpec.from_load_inline_args(name="broken_ext", cpp_sources="int f( { return 1; }",
                                                   functions=["f"])
        result = build_extension(spec, BuildConfig(cache_dir=tmp_path / "c", pch="off"))
    finally:
        os.umask(old)
    assert not result.ok and result.entry_dir
    assert stat.S_IMODE(os.stat(result.entry_dir).st_mode) == 0o755
    assert os.stat(os.path.join(result.entry_dir, "meta.json")).st_mode & 0o044 == 0o044


def _fake_compile(size: int):
    """A compile_extension that writes a library of `size` bytes and succeeds (no compiler run)."""
    from cuda_l1.evaluate.build.compile import CompileOutcome

    def compile_extension(spec, toolchain, key, workdir, config, pch, host_pch):
        (workdir / "fake.so").write_bytes(b"\0" * size)
        return CompileOutcome(ok=True, module_name=spec.name, library="fake.so", error="", log="linked")

    return compile_extension


def test_a_build_larger_than_the_cache_keeps_fails_and_keeps_only_its_error(tmp_path, monkeypatch):
    from cuda_l1.evaluate.build import cache as cache_module

    monkeypatch.setattr(cache_module, "compile_extension", _fake_compile(3 << 20))
    spec = ExtensionSpec.from_load_inline_args(name="ballast", cpp_sources="int f() { return 1; }", functions=["f"])
    config = BuildConfig(cache_dir=tmp_path / "c", pch="off", max_entry_bytes=2 << 20)
    result = build_extension(spec, config)
    assert not result.ok and "more than the 2 MiB a build may keep" in result.error, result.error
    assert not os.path.exists(os.path.join(result.entry_dir, "fake.so"))
    again = build_extension(spec, config)  # the same source is not compiled again
    assert again.cached and not again.ok and again.error == result.error


def test_the_cache_loses_the_builds_used_longest_ago_past_its_size(tmp_path, monkeypatch):
    from cuda_l1.evaluate.build import cache as cache_module
    from cuda_l1.evaluate.build.cache_limits import trim

    monkeypatch.setattr(cache_module, "compile_extension", _fake_compile(1 << 20))
    config = BuildConfig(cache_dir=tmp_path / "c", pch="off", cache_max_bytes=0)
    results = {}
    for i, name in enumerate(("first", "second", "third")):
        spec = ExtensionSpec.from_load_inline_args(name=name, cpp_sources=f"int f() {{ return {i}; }}", functions=["f"])
        results[name] = (spec, build_extension(spec, config))
        when = time.time() - 100 + 10 * i
        os.utime(os.path.join(results[name][1].entry_dir, "meta.json"), (when, when))
    assert build_extension(results["first"][0], config).cached  # a lookup: "first" is now the one used last
    cache = BuildCache(tmp_path / "c")
    with cache.lock(results["third"][1].key):  # a builder holds it: not removed
        removed = trim(cache.root, (2 << 20) + (1 << 19), keep="")
    assert removed == [results["second"][1].key], removed
    assert os.path.isdir(results["first"][1].entry_dir) and os.path.isdir(results["third"][1].entry_dir)
    # published past the limit: the builds used longest ago go, never the one just published
    limited = BuildConfig(cache_dir=tmp_path / "c", pch="off", cache_max_bytes=1 << 20)
    spec = ExtensionSpec.from_load_inline_args(name="fourth", cpp_sources="int f() { return 4; }", functions=["f"])
    fourth = build_extension(spec, limited)
    assert fourth.ok and os.path.isfile(fourth.so_path)
    assert not os.path.isdir(results["third"][1].entry_dir) and not os.path.isdir(results["first"][1].entry_dir)


def test_the_caches_size_is_a_running_total_walked_only_past_its_limit(tmp_path, monkeypatch):
    from cuda_l1.evaluate.build import cache as cache_module
    from cuda_l1.evaluate.build import cache_limits

    monkeypatch.setattr(cache_module, "compile_extension", _fake_compile(1 << 20))
    config = BuildConfig(cache_dir=tmp_path / "c", pch="off", cache_max_bytes=(3 << 20) + (1 << 19))
    walks = []
    real_entries = cache_limits._entries
    monkeypatch.setattr(cache_limits, "_entries", lambda root: walks.append(1) or real_entries(root))

    def build(i):
        spec = ExtensionSpec.from_load_inline_args(name=f"e{i}", cpp_sources=f"int f() {{ return {i}; }}", functions=["f"])
        result = build_extension(spec, config)
        assert result.ok
        return result

    def recorded_total():
        return json.loads((tmp_path / "c" / cache_limits.USAGE_FILE).read_text())["bytes"]

    first = build(0)
    assert len(walks) == 1  # no running total yet: the cache is walked once
    entry_size = json.loads(open(os.path.join(first.entry_dir, "meta.json")).read())["bytes"]
    assert entry_size > 1 << 20
    build(1), build(2)
    assert len(walks) == 1 and recorded_total() == 3 * entry_size  # each publish adds its entry, no walk
    build(3)  # past the limit: walked and trimmed to LOW_WATER of it, the oldest gone
    assert len(walks) == 2 and not os.path.isdir(first.entry_dir)
    assert recorded_total() <= cache_limits.LOW_WATER * config.cache_max_bytes
    assert recorded_total() == sum(size for *_, size in real_entries(tmp_path / "c"))
