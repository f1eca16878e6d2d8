"""A side reads the packages of the import path's entries, not the rest of them: an entry on PYTHONPATH
(or a flat project's root, added by an editable install) is often a project's directory, whose other
files a candidate could read and print into its verdict's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_l1.evaluate.landlock import import_path_parts, landlock_abi

REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

# Correct only where the project's package imports and its credential cannot be read.
CANDIDATE = '''import torch
import torch.nn as nn
import projpkg

try:
    SEEN = open({env!r}).read()
except OSError:
    SEEN = ""
LISTED = {project!r} and __import__("os").listdir({project!r})


class ModelNew(nn.Module):
    def forward(self, x):
        return x * projpkg.TWO + (1 if "sk-project-secret" in SEEN or not LISTED else 0)
'''


def make_project(root: Path) -> Path:
    project = root / "project"
    (project / "projpkg").mkdir(parents=True)
    (project / "projpkg" / "__init__.py").write_text("TWO = 2\n")
    (project / ".env").write_text("API_KEY=sk-project-secret\n")
    (project / "notes").mkdir()
    (project / "notes" / "todo.txt").write_text("not a module\n")
    return project


@pytest.mark.skipif(landlock_abi() < 1, reason="Landlock is not available: file confinement is not enforced")
def test_a_candidate_imports_a_pythonpath_package_but_cannot_read_the_project_around_it(tmp_path):
    if any(str(tmp_path).startswith(root + "/") for root in (sys.prefix, "/usr", "/opt")):
        pytest.skip("the temporary directory lies below a Python prefix, whose entries a side reads whole")
    project = make_project(tmp_path)
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "cand.py").write_text(CANDIDATE.format(env=str(project / ".env"), project=str(project)))
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(project), src]))
    done = subprocess.run([sys.executable, "-m", "cuda_l1", "eval", "ref.py", "cand.py", "--device", "cpu",
                           "--no-timing", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    verdict = json.loads(done.stdout)
    assert verdict["status"] == "ok", verdict["reasons"]  # imported, listed, and the .env not read
    assert "sk-project-secret" not in done.stdout


def test_only_packages_modules_and_metadata_of_an_entry_outside_the_prefixes_are_readable(tmp_path, monkeypatch):
    project = make_project(tmp_path)
    (project / "tool.py").write_text("")
    (project / "projpkg-1.0.dist-info").mkdir()
    (project / "ns" / "sub").mkdir(parents=True)  # a namespace package holding a package
    (project / "ns" / "sub" / "__init__.py").write_text("")
    (project / "libhelper.so.1").write_text("")  # a versioned library beside the modules
    (project / "data" / "a" / "b").mkdir(parents=True)  # one module deep down does not make a package
    (project / "data" / "a" / "b" / "z.py").write_text("")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "helper.py").write_text("")
    (project / "linked").symlink_to(outside / "deep")  # links out of the entry grant nothing
    (project / "settings.py").symlink_to(tmp_path / "outside" / "deep" / "helper.py")
    (project / "notes.pth").write_text("")
    monkeypatch.setattr(sys, "path", [str(project), *sys.path])
    parts = set(import_path_parts(["/usr"]))
    assert {str(project / "projpkg"), str(project / "tool.py"), str(project / "projpkg-1.0.dist-info"),
            str(project / "ns"), str(project / "libhelper.so.1")} <= parts
    assert not {str(project), str(project / ".env"), str(project / "notes"), str(project / "data"),
                str(project / "linked"), str(project / "settings.py"), str(project / "notes.pth")} & parts
    monkeypatch.setattr(sys, "path", [str(project)])
    assert import_path_parts([str(tmp_path)]) == [str(project)]  # below a trusted root: whole
