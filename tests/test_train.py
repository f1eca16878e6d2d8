"""Training stages on CPU: a tiny random model, the real evaluator (sandboxed children) on built-in
level-1 tasks, a real SQLite store, a real chat-completions server, TRL's real trainers.

Each stage runs end to end through the CLI. Evaluations dominate the time (seconds each on CPU), so
the workloads are a handful of completions on one or two launch-bound tasks.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from chat_server import ChatServer, Reply  # noqa: E402
from train_helpers import (  # noqa: E402
    BROKEN_ANSWER,
    EXAMPLES,
    GARBAGE_ANSWER,
    REPO,
    correct_answer,
    eager_code,
    example_config,
    hack_answer,
    write_config,
)

from cuda_l1.cli.app import run as cli  # noqa: E402
from cuda_l1.contrastive import parse_completion  # noqa: E402
from cuda_l1.evaluate.verdict import Verdict  # noqa: E402
from cuda_l1.store import Origin, Store  # noqa: E402
from cuda_l1.tasks import load_tasks  # noqa: E402
from cuda_l1.train.config_files import load_config  # noqa: E402
from cuda_l1.train.distributed import Collective  # noqa: E402
from cuda_l1.train.prompts import ContrastivePromptBuilder, PromptSection, share_prompts  # noqa: E402
from cuda_l1.train.reward import RewardConfig, shape_reward  # noqa: E402

LAYERNORM, SUMOVERDIM = load_tasks("builtin", levels={1}, ids=["09_LayerNorm", "07_SumOverDim"])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    assert cli(["train", "tiny-model", "--out", str(out)]) == 0
    return out


def tensorboard_tags(folder: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in folder.rglob("events.out.tfevents*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags().get("scalars", []))
    return tags


# -- reward shaping ---------------------------------------------------------------------------------
def test_shape_reward_follows_the_documented_table():
    cfg = RewardConfig()
    assert shape_reward("ok", 2.0, cfg) == pytest.approx(math.log(2.0))
    assert shape_reward("ok", 0.5, cfg) == pytest.approx(-math.log(2.0))
    assert shape_reward("ok", 1.0, cfg) == 0.0
    assert shape_reward("ok", 1000.0, cfg) == pytest.approx(math.log(10.0))  # clipped above
    assert shape_reward("ok", 0.001, cfg) == pytest.approx(-math.log(10.0))  # clipped below
    assert shape_reward("ok", None, cfg) == cfg.unmeasured_reward
    for status in ("incorrect", "compile_error", "runtime_error", "timeout", "parse_error"):
        assert shape_reward(status, None, cfg) == -3.0
    assert shape_reward("rejected", None, cfg) == -5.0
    # The ordering the shaping promises: hack < any failure < any correct candidate.
    assert shape_reward("rejected", None, cfg) < shape_reward("incorrect", None, cfg) < shape_reward("ok", 1e-9, cfg)
    with pytest.raises(ValueError):
        shape_reward("great", 2.0, cfg)


def test_reward_config_refuses_shapings_that_break_the_ordering(tmp_path):
    from cuda_l1.errors import UserError
    from cuda_l1.train.rl_config import RLStageConfig

    bad = write_config(tmp_path / "rl.json", {"reward": {"failure_reward": -1.0}})  # above -ln(10)
    with pytest.raises(UserError, match="failure_reward"):
        load_config(RLStageConfig, bad)
    bad = write_config(tmp_path / "rl2.json", {"reward": {"hack_reward": -2.0}})
    with pytest.raises(UserError, match="hack_reward"):
        load_config(RLStageConfig, bad)


def test_config_errors_name_the_file_and_exit_2(tmp_path, capsys):
    config = tmp_path / "sft.toml"
    config.write_text('output_dir = "x"\n[data]\nendpoints = "e.toml"\nattempts = 3\n')
    assert cli(["train", "sft", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "sft.toml" in err and "attempts" in err and "attempts_per_task" in err
    config.write_text('[eval]\nworkers = "two"\n')
    assert cli(["train", "rl", "--config", str(config)]) == 2
    assert "eval.workers must be an integer" in capsys.readouterr().err


def test_drivers_refuse_to_run_once_per_gpu(tmp_path, monkeypatch, capsys):
    """Sampling/evaluation own the store and the pool: under `accelerate launch` they would run N times."""
    config = write_config(tmp_path / "si.json", example_config("self-improve", output_dir=str(tmp_path / "si")))
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert cli(["train", "self-improve", "--config", str(config)]) == 2
    assert "WORLD_SIZE=8" in capsys.readouterr().err
    assert not (tmp_path / "si").exists()


def test_store_defaults_to_history_sqlite_in_the_output_folder(tmp_path):
    """The name `bench` and `optimize` give their store; a configured path wins over any default."""
    from cuda_l1.train.outputs import store_path

    assert store_path("", tmp_path) == tmp_path / "history.sqlite"
    (tmp_path / "history.sqlite").touch()
    (tmp_path / "history.db").touch()  # both: the current name wins
    assert store_path("", tmp_path) == tmp_path / "history.sqlite"
    assert store_path(str(tmp_path / "shared.db"), tmp_path) == tmp_path / "shared.db"


def test_store_of_an_older_output_folder_stays_history_db(tmp_path):
    """An output folder written before the rename keeps its history.db, so a resumed run keeps its history."""
    from cuda_l1.train.outputs import store_path

    (tmp_path / "history.db").touch()
    assert store_path("", tmp_path) == tmp_path / "history.db"
    assert store_path("", str(tmp_path)) == tmp_path / "history.db"
    # the example configs named .../history.db before; their new .../history.sqlite finds it too
    assert store_path(str(tmp_path / "history.sqlite"), "elsewhere") == tmp_path / "history.db"
    assert store_path(str(tmp_path / "other" / "history.sqlite"), "elsewhere") == tmp_path / "other" / "history.sqlite"


def test_trainer_table_is_checked_against_trl(tmp_path):
    from cuda_l1.errors import UserError
    from cuda_l1.train.rl_config import RLStageConfig
    from cuda_l1.train.rl_trainer import grpo_args
    from cuda_l1.train.sft_trainer import sft_args

    config = RLStageConfig(trainer={"use_cpu": True, "epsilon": 0.1, "epsilon_high": 0.28, "num_generations": 2,
                                    "per_device_train_batch_size": 2})
    args = grpo_args(config, tmp_path)
    assert (args.epsilon, args.epsilon_high, args.loss_type, args.report_to) == (0.1, 0.28, "grpo", ["tensorboard"])
    with pytest.raises(UserError, match="no_such_option"):
        grpo_args(RLStageConfig(trainer={"use_cpu": True, "no_such_option": 1}), tmp_path)
    with pytest.raises(UserError, match="GRPOConfig"):
        grpo_args(RLStageConfig(trainer={"use_cpu": True, "vllm": 1}), tmp_path)
    with pytest.raises(UserError, match="no_such_option"):
        sft_args({"use_cpu": True, "no_such_option": 1}, tmp_path, 0)
    if importlib.util.find_spec("vllm") is None:  # asking for vLLM without it is a clear error, not a crash later
        with pytest.raises(UserError, match="vllm"):
            grpo_args(RLStageConfig(vllm="colocate", trainer={"use_cpu": True}), tmp_path)


def test_example_configs_load_and_defaults_render(tmp_path, capsys):
    from cuda_l1.train.rl_config import RLStageConfig
    from cuda_l1.train.self_improve_config import SelfImproveConfig
    from cuda_l1.train.sft_config import SFTStageConfig

    classes = {"sft": SFTStageConfig, "self-improve": SelfImproveConfig, "rl": RLStageConfig}
    loaded = 0
    for folder in ("tiny", "gpu"):
        for stage, cls in classes.items():
            for path in sorted((EXAMPLES / folder).glob(f"{stage}*.toml")):
                assert load_config(cls, path).model.path, path
                loaded += 1
    assert loaded >= 6
    assert cli(["train", "defaults", "rl"]) == 0
    rendered = capsys.readouterr().out
    assert "hack_reward = -5.0  # rejected" in rendered
    template = tmp_path / "defaults.toml"  # the printed template is a valid config
    template.write_text(rendered)
    assert load_config(RLStageConfig, template).reward == RewardConfig()


def test_canonical_rows_keep_the_analysis_and_exactly_the_verified_code():
    from cuda_l1.train.dataset import make_row
    from cuda_l1.train.attempts import Attempt, Outcome

    messy = ("Plan: fuse it.\n\n```python\nclass ModelNew: pass  # a draft\n```\n\nFinal:\n\n"
             f"```python\n{eager_code(LAYERNORM)}```\n\nHope this helps!")
    parsed = parse_completion(messy)
    outcome = Outcome(Attempt(LAYERNORM, messy, model="m"), "ok", speedup=1.2, code=parsed.code,
                      analysis=parsed.analysis, candidate_id="c1")
    prompt = [{"role": "user", "content": "optimize"}]
    full = make_row(prompt, outcome, "full")
    canonical = make_row(prompt, outcome, "canonical")
    assert full["completion"][0]["content"] == messy
    answer = canonical["completion"][0]["content"]
    assert answer.startswith("Plan: fuse it.") and answer.rstrip().endswith("```")
    assert "a draft" not in answer and "Hope this helps" not in answer.split("```python")[-1]
    assert parse_completion(answer).code == parsed.code
    assert (canonical["task_id"], canonical["speedup"], canonical["format"]) == (LAYERNORM.id, 1.2, "canonical")


# -- prompts identical across ranks ---------------------------------------------------------------------
def _seeded_store(path: Path) -> Store:
    """A store with five correct variants of a task in distinct speedup buckets (verdicts made by hand)."""
    store = Store(path)
    store.add_task(LAYERNORM)
    for index, speedup in enumerate((0.7, 1.1, 1.4, 2.5, 4.0)):
        code = eager_code(LAYERNORM) + f"\n_VARIANT = {index}\n"  # distinct programs, not just comments
        cid, _ = store.add_candidate(LAYERNORM.id, code, Origin(kind="manual"))
        store.record_verdict(cid, Verdict(status="ok", speedup=speedup, device="cpu-test"), device="cpu-test",
                             task_id=LAYERNORM.id)
    return store


class ThreadCollective(Collective):
    """Two "ranks" as two threads of one process, meeting at a barrier (a stand-in for NCCL/gloo)."""

    def __init__(self, rank: int, shared: dict):
        self.rank, self.world_size, self.shared = rank, shared["world"], shared

    def all_gather(self, obj):
        self.shared["slots"][self.rank] = obj
        self.shared["barrier"].wait()
        out = list(self.shared["slots"])
        self.shared["barrier"].wait()
        return out

    def broadcast(self, obj):
        if self.rank == 0:
            self.shared["value"] = obj
        self.shared["barrier"].wait()
        out = self.shared["value"]
        self.shared["barrier"].wait()
        return out


def test_prompts_are_a_pure_function_of_seed_step_row_and_store(tmp_path):
    section = PromptSection(n_exemplars=2)
    tasks = {LAYERNORM.id: LAYERNORM}
    first, second = _seeded_store(tmp_path / "h.db"), Store(tmp_path / "h.db")
    try:
        a = ContrastivePromptBuilder(first, tasks, section, seed=7, device="cpu-test")
        b = ContrastivePromptBuilder(second, tasks, section, seed=7, device="cpu-test", record=False)
        draws = set()
        for step in range(12):
            built_a, built_b = a.build(LAYERNORM.id, 3, step), b.build(LAYERNORM.id, 3, step)
            assert built_a["messages"] == built_b["messages"]
            assert built_a["exemplar_ids"] == built_b["exemplar_ids"] and len(built_a["exemplar_ids"]) == 2
            assert built_a["exemplar_speedups"] == sorted(built_a["exemplar_speedups"])  # slowest first
            draws.add(tuple(built_a["exemplar_ids"]))
        assert len(draws) > 1  # the step changes the draw: exemplars are re-sampled as training goes on
        shown = a.build(LAYERNORM.id, 3, 0)
        text = "".join(m["content"] for m in shown["messages"])
        assert all(f"speedup {s:.2f}x" in text for s in shown["exemplar_speedups"])
        order = [tuple(b.build(LAYERNORM.id, 3, s)["exemplar_ids"]) for s in range(12)]
        other_seed = ContrastivePromptBuilder(second, tasks, section, seed=8, device="cpu-test", record=False)
        assert [tuple(other_seed.build(LAYERNORM.id, 3, s)["exemplar_ids"]) for s in range(12)] != order
        recorded = first.prompt(a.build(LAYERNORM.id, 0, 0)["prompt_id"])
        assert recorded["task_id"] == LAYERNORM.id and len(recorded["exemplar_ids"]) == 2
    finally:
        first.close()
        second.close()


def test_two_ranks_get_identical_prompts_for_a_shared_group(tmp_path):
    """GRPO spreads a group's copies over ranks; rank 0 builds, both ranks must see the same text."""
    store = _seeded_store(tmp_path / "h.db")
    builder = ContrastivePromptBuilder(store, {LAYERNORM.id: LAYERNORM}, PromptSection(), seed=3, device="cpu-test")
    # One global generation batch: rows 11, 12, 13 with num_generations = 2, split over two ranks.
    local = {0: [11, 11, 12], 1: [12, 13, 13]}
    shared = {"world": 2, "slots": [None, None], "barrier": threading.Barrier(2), "value": None}
    results: dict[int, list[dict]] = {}
    errors: list[BaseException] = []

    def rank_main(rank: int, step: int):
        try:
            rows = [{"row": r, "task_id": LAYERNORM.id, "prompt": []} for r in local[rank]]
            results[(rank, step)] = share_prompts(ThreadCollective(rank, shared), builder if rank == 0 else None,
                                                  rows, step)
        except BaseException as exc:  # surfaced below; a dead thread would otherwise hang the barrier
            errors.append(exc)
            shared["barrier"].abort()

    for step in (5, 6):
        threads = [threading.Thread(target=rank_main, args=(r, step)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
    for step in (5, 6):
        by_row: dict[int, list] = {}
        for rank in (0, 1):
            for item in results[(rank, step)]:
                by_row.setdefault(item["row"], []).append((item["prompt"], item["prompt_id"], item["exemplar_ids"]))
        assert set(by_row) == {11, 12, 13}
        for row, copies in by_row.items():
            assert len(copies) == 2 and copies[0] == copies[1], f"row {row} differs across ranks at step {step}"
        # ... and it is exactly what a builder on the same store makes for (step, row), on any process.
        replay = ContrastivePromptBuilder(store, {LAYERNORM.id: LAYERNORM}, PromptSection(), seed=3,
                                          device="cpu-test", record=False)
        assert by_row[12][0][0] == replay.build(LAYERNORM.id, 12, step)["messages"]
    store.close()


def test_exemplars_and_best_speedup_come_from_verdicts_under_the_same_settings(tmp_path):
    """Speedups judged under other evaluation settings (another tolerance, here) do not compare: the RL
    prompt shows none of them and the re-measure rule does not measure against them."""
    from cuda_l1.evaluate.config import EvalConfig
    from cuda_l1.evaluate.precision import ToleranceConfig
    from cuda_l1.train.attempts import Judge

    ours, other = EvalConfig(), EvalConfig(tolerance=ToleranceConfig(mode="kernelbench"))
    assert ours.config_key() != other.config_key()
    store = Store(tmp_path / "h.db")
    store.add_task(LAYERNORM)
    ids = {}
    for name, speedup, config in (("ours", 1.3, ours), ("other", 4.0, other)):
        code = eager_code(LAYERNORM) + f"\n_SETTINGS = {name!r}\n"
        ids[name], _ = store.add_candidate(LAYERNORM.id, code, Origin(kind="manual"))
        store.record_verdict(ids[name], Verdict(status="ok", speedup=speedup, device="cpu-test"), device="cpu-test",
                             config_key=config.config_key(), task_id=LAYERNORM.id)
    judge = Judge(store, pool=None, config=ours, run_id=None, device_label="cpu-test")
    assert judge.best_speedup(LAYERNORM.id) == pytest.approx(1.3)
    builder = ContrastivePromptBuilder(store, {LAYERNORM.id: LAYERNORM}, PromptSection(n_exemplars=2), seed=0,
                                       device="cpu-test", record=False, config_key=judge.config_key)
    for step in range(5):
        assert builder.build(LAYERNORM.id, 0, step)["exemplar_ids"] == [ids["ours"]]
    store.close()


def test_the_rl_stage_loads_nothing_ahead_unless_told(monkeypatch):
    """GRPO compares a group's rewards: a sibling loading beside a candidate's judgement could spoil
    that candidate's verdict through a guessed IPC handle (docs/isolation.md), so the RL stage's
    evaluator loads nothing ahead by default; the other stages keep the evaluator's default."""
    import dataclasses

    from cuda_l1.evaluate.config import EvalConfig
    from cuda_l1.evaluate.lookahead import lookahead_of
    from cuda_l1.train import eval_pool
    from cuda_l1.train.config_files import EvalSection

    monkeypatch.setattr(eval_pool, "_devices", lambda section: ["cuda:0"])  # as on a GPU host
    section = EvalSection(device="cuda")
    assert lookahead_of(eval_pool.eval_config(section)) == lookahead_of(EvalConfig(device="cuda")) == 2
    assert lookahead_of(eval_pool.eval_config(section, rewards_relative=True)) == 0
    told = dataclasses.replace(section, lookahead=1)
    assert eval_pool.eval_config(told, rewards_relative=True).lookahead == 1
    from cuda_l1.errors import UserError

    with pytest.raises(UserError, match="lookahead"):
        eval_pool.eval_config(dataclasses.replace(section, lookahead=-5))


# -- the reward function against the real evaluator --------------------------------------------------------
@pytest.mark.slow
def test_reward_function_judges_with_the_evaluator_and_writes_the_store(tmp_path):
    from cuda_l1.train.config_files import EvalSection
    from cuda_l1.train.attempts import Judge
    from cuda_l1.train.reward import EvaluatorReward
    from cuda_l1.train.eval_pool import open_pool

    store = Store(tmp_path / "h.db")
    store.add_task(LAYERNORM)
    run_id = store.start_run("test-reward")
    prompt_id = store.record_prompt(LAYERNORM.id, [{"role": "user", "content": "optimize"}], run_id=run_id)
    pool, eval_cfg = open_pool(EvalSection(device="cpu", workers=2, quick_timing=True))
    try:
        judge = Judge(store, pool, eval_cfg, run_id)
        reward = EvaluatorReward(judge, {LAYERNORM.id: LAYERNORM}, RewardConfig(), Collective(), model_name="tiny")
        repeated = correct_answer(LAYERNORM)  # the policy repeats itself word for word
        texts = [correct_answer(LAYERNORM), BROKEN_ANSWER, hack_answer(LAYERNORM), GARBAGE_ANSWER, repeated]
        logged: dict[str, float] = {}
        rewards = reward(prompts=[[]] * 5, completions=[[{"role": "assistant", "content": t}] for t in texts],
                         task_id=[LAYERNORM.id] * 5, prompt_id=[prompt_id] * 5, exemplar_ids=[[]] * 5,
                         log_metric=lambda k, v: logged.__setitem__(k, v))
    finally:
        pool.close()
    results = {r["candidate_id"]: r for r in store.run_results(run_id)}
    statuses = sorted(r["status"] for r in results.values())
    assert statuses == ["ok", "rejected", "runtime_error"]  # the repeated source was not re-evaluated
    ok_row = next(r for r in results.values() if r["status"] == "ok")
    assert rewards[0] == pytest.approx(shape_reward("ok", ok_row["speedup"]))
    assert rewards[1:4] == [-3.0, -5.0, -3.0]
    assert rewards[4] == rewards[0]
    assert judge.evaluations == 3
    completions = store.completions(prompt_id)
    assert [c["parse_status"] for c in completions] == ["ok", "ok", "ok", "parse_error", "ok"]
    assert logged["cuda_l1/correct_rate"] == pytest.approx(2 / 5)
    assert logged["cuda_l1/rejected_rate"] == pytest.approx(1 / 5)
    assert logged["cuda_l1/parse_rate"] == pytest.approx(4 / 5)
    store.close()


# -- stage 1: SFT data augmentation + SFT ----------------------------------------------------------------
@pytest.mark.slow
def test_sft_stage_keeps_only_verified_samples_trains_and_resumes(tmp_path, tiny_model):
    tasks = {LAYERNORM.id: LAYERNORM, SUMOVERDIM.id: SUMOVERDIM}

    def respond(body: dict) -> Reply:
        user = body["messages"][-1]["content"]
        task = next(t for t in tasks.values() if t.source.strip() in user)
        return Reply(texts=[BROKEN_ANSWER, hack_answer(task), correct_answer(task)])

    with ChatServer(responder=respond) as server:
        (tmp_path / "endpoints.toml").write_text(
            f'[[endpoints]]\nbase_url = "{server.base_url}"\nmodel = "scripted"\nmax_retries = 0\n')
        config = write_config(tmp_path / "sft.json", example_config(
            "sft", output_dir=str(tmp_path / "sft"), store=str(tmp_path / "history.db"),
            model__path=str(tiny_model), data__endpoints=str(tmp_path / "endpoints.toml"),
            trainer__max_steps=2, trainer__save_steps=2))
        assert cli(["train", "sft", "--config", str(config)]) == 0
        requests = len(server.chat_requests())
        assert requests == 2  # one request of n=3 per task; each had a verified answer, so sampling stopped

        rows = [json.loads(line) for line in (tmp_path / "sft/data/sft.jsonl").read_text().splitlines()]
        assert sorted(r["task_name"] for r in rows) == ["07_SumOverDim", "09_LayerNorm"]
        for row in rows:
            task = tasks[row["task_id"]]
            assert row["completion"] == [{"role": "assistant", "content": correct_answer(task)}]
            assert parse_completion(row["completion"][0]["content"]).code.strip() == eager_code(task).strip()
            assert row["prompt"][0]["role"] == "system" and task.source.strip() in row["prompt"][1]["content"]
            assert row["speedup"] > 0
        from datasets import load_from_disk

        assert len(load_from_disk(str(tmp_path / "sft/data/dataset"))) == 2

        with Store(tmp_path / "history.db") as store:
            [run] = store.runs("train-sft-data")
            statuses = sorted(r["status"] for r in store.run_results(run.id))
        assert statuses == ["ok", "ok", "rejected", "rejected", "runtime_error", "runtime_error"]

        summary = json.loads((tmp_path / "sft/train_summary.json").read_text())
        losses = [e["loss"] for e in summary["log_history"] if "loss" in e]
        assert summary["global_step"] == 2 and losses and all(math.isfinite(x) for x in losses)
        assert (tmp_path / "sft/trainer/checkpoint-2").is_dir()
        assert (tmp_path / "sft/final/config.json").exists()
        assert tensorboard_tags(tmp_path / "sft/trainer") >= {"train/loss"}

        # Resume: the store says every pair is done, so a second data run asks the server nothing.
        assert cli(["train", "sft", "--config", str(config), "--data-only"]) == 0
        assert len(server.chat_requests()) == requests
        assert len((tmp_path / "sft/data/sft.jsonl").read_text().splitlines()) == 2

    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "sft/final")).config.num_hidden_layers == 2


# -- stage 2: self-supervised iterative learning --------------------------------------------------------
def steered(name: str, tmp_path: Path, tiny_model: Path, **changes) -> Path:
    """The shipped tiny example NAME, as is but for where it reads the model and writes its results."""
    data = example_config(name, output_dir=str(tmp_path / name), store=str(tmp_path / "history.db"),
                          model__path=str(tiny_model), **changes)
    data["steer"]["answers_file"] = str(REPO / data["steer"]["answers_file"])  # relative to the repository root
    return write_config(tmp_path / f"{name}.json", data)


@pytest.mark.slow
def test_self_improve_example_keeps_successes_retrains_and_logs(tmp_path, tiny_model):
    """The shipped example (steered sampling) trains in every round, on the round's own successes."""
    extra = tmp_path / "extra.jsonl"  # an answer from elsewhere, judged with every round's samples
    extra.write_text(json.dumps({"task": "09_LayerNorm", "text": GARBAGE_ANSWER}) + "\n")
    config = steered("self-improve", tmp_path, tiny_model, generation__extra_completions_file=str(extra),
                     # Each round's fine-tuning runs as `PYTHON -m cuda_l1 train sft --train-only ...`, the way
                     # `accelerate launch` runs it on a GPU node.
                     launcher=sys.executable)
    assert cli(["train", "self-improve", "--config", str(config)]) == 0

    out = tmp_path / "self-improve"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["count"] == 5  # four samples from the model + the extra answer
        assert m["successes"] >= 1 and m["tasks_solved"] == 1 and m["correct_rate"] == m["successes"] / 5
        assert 1 > m["parse_rate"] >= m["compile_rate"] >= m["exec_rate"] >= m["correct_rate"]
        assert m["trained"] and m["train_steps"] >= 1 and math.isfinite(m["train_loss"])
        assert m["on_policy"] and m["model"] == m["policy"]  # the round sampled the checkpoint it trains
    rows = [json.loads(line) for line in (out / "round-1/successes.jsonl").read_text().splitlines()]
    assert len(rows) == metrics[0]["successes"] and all(r["model"] == str(tiny_model) for r in rows)
    assert metrics[0]["model"] == str(tiny_model)
    assert metrics[1]["model"] == str(out / "round-1/final")  # round 2 sampled the round-1 model
    assert metrics[0]["evaluations"] >= 1
    assert (out / "round-2/final/config.json").exists()
    assert (out / "round-2/adapter/adapter_config.json").exists()  # LoRA, merged into final/
    assert json.loads((out / "round-2/train-config.json").read_text())["model"]["path"] == metrics[1]["model"]
    assert {"self_improve/correct_rate", "self_improve/compile_rate"} <= tensorboard_tags(out / "tensorboard")
    # A rerun finds both rounds done and trains nothing more.
    assert cli(["train", "self-improve", "--config", str(config)]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_self_improve_refuses_a_fixed_server_unless_off_policy_is_allowed(tmp_path, tiny_model, capsys):
    endpoints = tmp_path / "endpoints.toml"
    endpoints.write_text('[[endpoints]]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "fixed-model"\n')
    config = write_config(tmp_path / "si.json", example_config(
        "self-improve", output_dir=str(tmp_path / "si"), model__path=str(tiny_model), steer={},
        generation__backend="server", generation__endpoints=str(endpoints)))
    assert cli(["train", "self-improve", "--config", str(config)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "not on-policy" in err and "allow_off_policy" in err and "server_command" in err
    assert not (tmp_path / "si").exists()


@pytest.mark.slow
def test_off_policy_rounds_say_which_model_was_sampled(tmp_path, tiny_model):
    """allow_off_policy: the rounds sample the fixed server, and the metrics name it, not the checkpoint."""
    with ChatServer(responder=lambda body: Reply(text=correct_answer(LAYERNORM))) as server:
        endpoints = tmp_path / "endpoints.toml"
        endpoints.write_text(f'[[endpoints]]\nbase_url = "{server.base_url}"\nmodel = "fixed-model"\n'
                             "max_retries = 0\n")
        config = write_config(tmp_path / "si.json", example_config(
            "self-improve", output_dir=str(tmp_path / "si"), store=str(tmp_path / "history.db"),
            model__path=str(tiny_model), steer={}, rounds=1, allow_off_policy=True,
            generation__backend="server", generation__endpoints=str(endpoints), generation__samples_per_task=1))
        assert cli(["train", "self-improve", "--config", str(config)]) == 0
        assert len(server.chat_requests()) == 1
    [m] = [json.loads(line) for line in (tmp_path / "si/metrics.jsonl").read_text().splitlines()]
    assert m["model"] == "fixed-model" and m["policy"] == str(tiny_model) and m["on_policy"] is False
    assert m["successes"] == 1 and m["trained"]


# -- stage 3: contrastive RL (GRPO) ---------------------------------------------------------------------
def log_history(trainer_dir: Path) -> list[dict]:
    """TRL's per-step logs (reward, reward_std, grad_norm, kl, ...) from the newest checkpoint."""
    newest = max(trainer_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return [e for e in json.loads((newest / "trainer_state.json").read_text())["log_history"] if "reward" in e]


def tensorboard_steps(folder: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps: list[int] = []
    for events in folder.rglob("events.out.tfevents*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if tag in accumulator.Tags().get("scalars", []):
            steps += [e.step for e in accumulator.Scalars(tag)]
    return sorted(steps)


@pytest.mark.slow
def test_rl_example_learns_from_varied_rewards_logs_and_resumes(tmp_path, tiny_model):
    """The shipped example: each group of four steered samples gets different verdicts from the
    evaluator, so the rewards vary, GRPO has advantages and takes real gradient steps."""
    config = steered("rl", tmp_path, tiny_model)
    assert cli(["train", "rl", "--config", str(config)]) == 0

    with Store(tmp_path / "history.db") as store:
        [run] = store.runs("train-rl")
        results = store.run_results(run.id)
        seeded = [r for r in results if r["origin_detail"]["kind"] == "strategy"]
        judged = [r for r in results if r["origin_detail"]["kind"] == "llm"]
        assert [r["status"] for r in seeded] == ["ok"]  # the eager exemplar, judged before step 1
        assert judged, "the policy's candidates were not judged"
        verified = {r["candidate_id"] for r in results if r["status"] == "ok"}
        for r in judged:  # every prompt showed verified kernels of the task (the store's exemplars)
            assert r["origin_detail"]["parent_ids"] and set(r["origin_detail"]["parent_ids"]) <= verified
        first_prompt = store.prompt(min(r["origin_detail"]["prompt_id"] for r in judged))
        assert first_prompt["exemplar_ids"] == [seeded[0]["candidate_id"]]  # step 1: only the seed exists
        assert "Earlier correct versions" in first_prompt["messages"][1]["content"]
        assert f"speedup {seeded[0]['speedup']:.2f}x" in first_prompt["messages"][1]["content"]

    out = tmp_path / "rl"
    steps = [json.loads(line) for line in (out / "rl_metrics.jsonl").read_text().splitlines()]
    # rl_metrics.jsonl numbers steps as TensorBoard (and TRL's logs) do: from 1.
    assert [s["step"] for s in steps] == [1, 2] == tensorboard_steps(out / "trainer", "train/cuda_l1/correct_rate")
    verdicts = {r["candidate_id"]: r for r in results}
    for step in steps:
        assert sum(step["statuses"].values()) == 4 == step["count"] == len(step["samples"])
        for sample in step["samples"]:
            assert sample["reward"] == pytest.approx(shape_reward(sample["status"], sample["speedup"]))
            stored = verdicts[sample["candidate_id"]] if not sample["reused"] else None
            if stored is not None:  # judged in this run: the store has the verdict the reward came from
                assert stored["status"] == sample["status"] and stored["speedup"] == sample["speedup"]
        assert step["reward_mean"] == pytest.approx(sum(x["reward"] for x in step["samples"]) / 4)
    logs = log_history(out / "trainer")
    assert [e["step"] for e in logs] == [1, 2]
    for entry, step in zip(logs, steps):  # the mechanism at work: rewards differ within the group, so the
        assert entry["reward_std"] > 0 and entry["grad_norm"] > 0  # advantages are not all zero
        assert entry["reward"] == pytest.approx(step["reward_mean"])
    assert {"ok", "rejected", "runtime_error"} <= {s["status"] for step in steps for s in step["samples"]}
    rejected = [r for r in judged if r["status"] == "rejected"]
    assert rejected and all("modified its input" in " ".join(r["reasons"]) for r in rejected)
    tags = tensorboard_tags(out / "trainer")
    assert {"train/reward", "train/reward_std", "train/kl", "train/grad_norm", "train/clip_ratio/region_mean",
            "train/cuda_l1/correct_rate", "train/cuda_l1/parse_rate"} <= tags
    assert (out / "trainer/checkpoint-2").is_dir() and (out / "final/config.json").exists()

    # Resume from the newest checkpoint and train one more step.
    assert cli(["train", "rl", "--config", str(config), "--resume", "--set", "trainer.max_steps=3"]) == 0
    summary = json.loads((out / "rl_summary.json").read_text())
    assert summary["global_step"] == 3
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert summary["reward_calls"] == 1
    assert (out / "trainer/checkpoint-3").is_dir()
    assert [json.loads(line)["step"] for line in (out / "rl_metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


@pytest.mark.gpu
def test_rl_gpu_evaluator_metrics(tmp_path, tiny_model):
    """A few GRPO steps with the evaluator on the GPU; metrics JSON goes to $CUDA_L1_RESULTS_DIR if set."""
    import time
    import tomllib

    import torch

    data = tomllib.loads((EXAMPLES / "gpu" / "rl-smoke.toml").read_text())
    data.update(output_dir=str(tmp_path / "rl"), store=str(tmp_path / "history.db"))
    data["model"]["path"] = str(tiny_model)
    data["steer"]["answers_file"] = str(REPO / data["steer"]["answers_file"])
    config = write_config(tmp_path / "rl.json", data)
    started = time.time()
    assert cli(["train", "rl", "--config", str(config)]) == 0
    wall = time.time() - started
    steps = [json.loads(line) for line in (tmp_path / "rl/rl_metrics.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "rl/rl_summary.json").read_text())
    with Store(tmp_path / "history.db") as store:
        [run] = store.runs("train-rl")
        results = store.run_results(run.id)
    assert steps and results
    assert any(r["status"] == "ok" for r in results)  # at least the seeded eager candidate
    assert all(r["device"] == torch.cuda.get_device_name(0) for r in results)
    out_dir = os.environ.get("CUDA_L1_RESULTS_DIR")
    if out_dir:
        import trl
        import transformers

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        logs = log_history(tmp_path / "rl" / "trainer")
        train_s = summary.get("train_runtime_s")
        judge_s = sum(s["judge_s"] for s in steps)
        record = {
            "test": "test_rl_gpu_evaluator_metrics",
            "command": "pytest -m gpu tests/test_train.py -k test_rl_gpu_evaluator_metrics",
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "gpu": torch.cuda.get_device_name(0),
            "versions": {"torch": torch.__version__, "trl": trl.__version__, "transformers": transformers.__version__},
            "wall_s": wall,
            "train_s": train_s,
            "judge_s": judge_s,  # time the trainer waited for the evaluator (rank 0's reward calls)
            "judge_share": judge_s / train_s if train_s else None,
            "per_step": [{k: e.get(k) for k in ("step", "reward", "reward_std", "kl", "grad_norm", "step_time")}
                         for e in logs],
            "global_step": summary["global_step"],
            "steps": steps,
            "verdicts": [{k: r[k] for k in ("status", "speedup", "device", "origin")} for r in results],
        }
        (Path(out_dir) / "train_rl_gpu.json").write_text(json.dumps(record, indent=2, default=str))
