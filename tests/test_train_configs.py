"""Every example under examples/train/ is built into the real objects it configures: stage configs into
TRL's SFTConfig / GRPOConfig (what the stage hands to TRL), endpoint lists into the LLM client's
configs, accelerate files into accelerate's own config class. Nothing trains here.

The GPU recipes ask for bf16 and vLLM. On a CPU machine transformers refuses bf16 and vLLM is not
installed, so those two host probes answer as on a GPU host; everything else is validated as is.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("trl")

from cuda_l1.cli.app import run as cli  # noqa: E402
from cuda_l1.errors import UserError  # noqa: E402
from cuda_l1.train.config_files import load_config  # noqa: E402
from cuda_l1.train.preflight import check_stage  # noqa: E402
from cuda_l1.train.rl_config import RLStageConfig  # noqa: E402
from cuda_l1.train.self_improve_config import SelfImproveConfig  # noqa: E402
from cuda_l1.train.sft_config import SFTStageConfig  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "train"
STAGES = {"sft": SFTStageConfig, "self-improve": SelfImproveConfig, "rl": RLStageConfig}


def stage_of(path: Path) -> str | None:
    return next((s for s in STAGES if path.stem == s or path.stem.startswith(s + "-")), None)


@pytest.fixture
def gpu_host(monkeypatch):
    """transformers' bf16 probe and our vLLM probe answer as on a GPU host with vLLM installed."""
    import transformers.training_args

    from cuda_l1.train import trainer_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(trainer_args, "vllm_installed", lambda: True)


def example_files() -> list[Path]:
    return sorted(p for p in EXAMPLES.rglob("*") if p.is_file() and p.suffix in (".toml", ".json", ".yaml", ".yml"))


@pytest.mark.parametrize("path", example_files(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_builds_into_the_objects_it_configures(path, gpu_host, monkeypatch):
    from trl import GRPOConfig, SFTConfig

    from cuda_l1.train.task_selection import select_tasks
    from cuda_l1.train.steering import read_answers

    monkeypatch.chdir(REPO)  # the examples' relative paths are relative to the repository root
    stage = stage_of(path)
    if stage is not None:
        config = load_config(STAGES[stage], path)
        built = check_stage(stage, config)
        steer = getattr(config, "steer", None)
        if steer is not None and steer.enabled:  # its answers name the example's tasks
            assert read_answers(steer, select_tasks(config.tasks))
        if stage == "sft" and config.phases == "data":
            assert built is None
            return
        expected = GRPOConfig if stage == "rl" else SFTConfig
        assert type(built) is expected
        for key, value in config.trainer.items():  # every option of the table reached TRL's object
            if hasattr(built, key):
                assert getattr(built, key) == value or key in ("report_to",), key
    elif path.stem == "endpoints" or path.stem.startswith("endpoints-"):
        from cuda_l1.llm import EndpointConfig, load_endpoints

        endpoints = load_endpoints(path)
        assert endpoints and all(isinstance(e, EndpointConfig) for e in endpoints)
    elif path.suffix in (".yaml", ".yml"):
        from accelerate.commands.config.config_args import ClusterConfig

        cluster = ClusterConfig.from_yaml_file(str(path))
        assert cluster.num_processes >= 1 and cluster.distributed_type
    else:
        pytest.fail(f"{path}: an example of a kind this test does not know how to check")


def test_gpu_sft_recipe_builds_with_its_warmup(gpu_host):
    """The GPU recipe's warmup_ratio (the name before transformers 5) reaches the scheduler."""
    config = load_config(SFTStageConfig, EXAMPLES / "gpu" / "sft.toml")
    args = check_stage("sft", config)
    assert config.trainer["warmup_ratio"] == 0.03
    assert args.get_warmup_steps(1000) == 30
    assert args.bf16 and args.lr_scheduler_type == "cosine" and args.max_length == 16384


def test_older_and_newer_option_names_both_work_but_not_together(tmp_path):
    from cuda_l1.train.sft_trainer import sft_args

    older = sft_args({"use_cpu": True, "warmup_ratio": 0.1, "max_seq_length": 512}, tmp_path, 0)
    newer = sft_args({"use_cpu": True, "warmup_steps": 0.1, "max_length": 512}, tmp_path, 0)
    assert older.get_warmup_steps(50) == newer.get_warmup_steps(50) == 5
    assert older.max_length == newer.max_length == 512
    with pytest.raises(UserError, match="both 'warmup_ratio' and 'warmup_steps'"):
        sft_args({"use_cpu": True, "warmup_ratio": 0.1, "warmup_steps": 3}, tmp_path, 0)
    with pytest.raises(UserError, match="no_such_option"):
        sft_args({"use_cpu": True, "no_such_option": 1}, tmp_path, 0)


def test_a_bad_trainer_table_fails_at_start_naming_the_file(tmp_path, capsys):
    """Before any sampling: the data phase would otherwise run for hours and then fail to train."""
    config = tmp_path / "my-sft.toml"
    config.write_text(f'output_dir = "{tmp_path / "out"}"\n[model]\npath = "{tmp_path}"\n'
                      f'[data]\nendpoints = "{EXAMPLES / "tiny" / "endpoints.toml"}"\n'
                      "[trainer]\nuse_cpu = true\nwarmup_ratioo = 0.1\n")
    assert cli(["train", "sft", "--config", str(config)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{config}: [trainer]" in err and "warmup_ratioo" in err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_train_extra_ranges_hold_the_tested_versions_and_have_upper_bounds():
    """pyproject's `train` extra says what is tested: the installed versions fall in its ranges, and
    every range is capped (the RL stage overrides a private GRPOTrainer method)."""
    from packaging.requirements import Requirement

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    for text in extra:
        requirement = Requirement(text)
        installed = importlib.metadata.version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (text, installed)
        assert any(spec.operator in ("<", "<=", "~=", "==") for spec in requirement.specifier), text
