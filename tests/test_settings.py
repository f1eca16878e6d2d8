"""Settings carry their help in field metadata; the configuration reference is printed from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cuda_l1.cli.settings_cmd import SETTINGS, markdown, settings_class
from cuda_l1.settings import describe, helps_of, setting, undocumented

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_field_of_every_settings_class_has_help(name):
    assert undocumented(settings_class(name)) == []


def test_nested_settings_are_expanded_under_their_key():
    keys = {doc.key: doc for doc in describe(settings_class("eval"))}
    assert "timing.window_s" in keys and "sandbox.memory_bytes" in keys and "tolerance.mode" in keys
    assert keys["timing.window_s"].default == "0.02"
    assert "window" in keys["timing.window_s"].help


def test_a_setting_without_help_is_refused_and_help_reads_back():
    with pytest.raises(ValueError):
        setting(1)

    @dataclasses.dataclass
    class Example:
        size: int = setting(3, "how many")
        names: list = setting(factory=list, help="which ones")

    assert helps_of(Example) == {"size": "how many", "names": "which ones"}
    assert Example().names == [] and Example().names is not Example().names


def test_configuration_reference_matches_the_code():
    written = (ROOT / "docs" / "configuration.md").read_text()
    assert written == markdown(), "docs/configuration.md is stale: cuda-l1 settings --markdown > docs/configuration.md"


def test_settings_command_prints_one_class_as_json(capsys):
    from cuda_l1.cli import run

    assert run(["settings", "search", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert rows and all(row["help"] for row in rows)
    assert run(["settings", "nonsense"]) == 2


def test_evaluation_settings_out_of_range_are_refused_also_when_changed_later():
    from cuda_l1.errors import UserError
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig

    EvalConfig(device="cuda:3", timing=TimingConfig.quick())  # spelling only: visibility is checked at the edge
    with pytest.raises(UserError, match="device is cpu, cuda or cuda:N"):
        EvalConfig(device="gpu")
    config = EvalConfig()
    config.timing.full_check_rate = 1.5
    with pytest.raises(UserError, match="full_check_rate"):
        dataclasses.replace(config)  # what an Evaluator does with the config it is given
    config.timing.full_check_rate, config.timing.settled_calls = 0.2, -1
    with pytest.raises(UserError, match="settled_calls must be 0"):
        dataclasses.replace(config)
    config.timing.settled_calls, config.timing.settle_rate = 4, 1.5
    with pytest.raises(UserError, match="settle_rate is between 0 and 1"):
        dataclasses.replace(config)
    for name in ("timeout_s", "call_timeout_s"):  # a side that never answers would hold its worker for good
        with pytest.raises(UserError, match="every timeout must be a positive, finite number"):
            EvalConfig(**{name: float("inf")})
