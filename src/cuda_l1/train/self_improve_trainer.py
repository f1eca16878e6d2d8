"""Stage 2: self-supervised iterative learning.

Each round: sample `samples_per_task` answers per task from the current checkpoint (zero-exemplar
prompt), judge them with the evaluator, keep the verified ones (reward 1; everything else 0 and
dropped), fine-tune on them, and make the result the next round's checkpoint. A round without any
success leaves the model unchanged.

Per round, metrics.jsonl (and TensorBoard, under tensorboard/) get: parse_rate, compile_rate
(executability: the module imported), exec_rate (it ran to completion), correct_rate, rejected_rate,
mean/best speedup of the successes, tasks_solved and the training loss. state.json records the
completed rounds, so a rerun continues with the next round.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cuda_l1.contrastive import build_prompt
from cuda_l1.errors import UserError
from cuda_l1.store import Store
from cuda_l1.tasks import Task, find_task
from cuda_l1.train.attempts import Attempt, Judge, rates
from cuda_l1.train.config_files import to_dict
from cuda_l1.train.dataset import append_jsonl, make_row, read_jsonl
from cuda_l1.train.eval_pool import local_device_label, open_pool
from cuda_l1.train.generation import make_generator
from cuda_l1.train.launch import SELF_IMPROVE_DRIVER, require_single_process
from cuda_l1.train.metrics import MetricsLog
from cuda_l1.train.modeling import check_model_path, model_kwargs
from cuda_l1.train.outputs import prepare_output, store_path
from cuda_l1.train.self_improve_config import SelfImproveConfig, off_policy
from cuda_l1.train.steering import read_answers
from cuda_l1.train.sft_config import SFTStageConfig
from cuda_l1.train.sft_trainer import finetune
from cuda_l1.train.task_selection import register_tasks, select_tasks
from cuda_l1.text import has_surrogate

RUN_NAME = "train-self-improve"


def read_extra_completions(path: str, tasks: list[Task]) -> list[tuple[Task, str]]:
    """(task, answer) pairs from a JSONL file of {"task": selector, "text": answer} lines."""
    pairs = []
    for number, row in enumerate(read_jsonl(path), start=1):
        if not isinstance(row, dict) or not isinstance(row.get("task"), str) or not isinstance(row.get("text"), str):
            raise UserError('each line needs "task" (a task id, name or key) and "text" (an answer).',
                            path=path, line=number)
        if has_surrogate(row["text"]):  # (not UTF-8: the store could not hold it, and the round's samples were lost)
            raise UserError('"text" holds a lone surrogate (\\ud800-\\udfff escape): not UTF-8 text.',
                            path=path, line=number)
        try:
            task = find_task(tasks, row["task"])
        except UserError as exc:
            raise UserError(f"{exc} (only the selected tasks can be named).", path=path, line=number) from None
        pairs.append((task, row["text"]))
    return pairs


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console)


def _train_round(config: SelfImproveConfig, model_path: str, data_path: Path, round_dir: Path, seed: int) -> dict:
    """Fine-tune one round: in this process, or through `launcher` (multi-GPU) as a stage-1 train phase."""
    model = dataclasses.replace(config.model, path=model_path)
    if not config.launcher:
        return finetune(model, config.lora, read_jsonl(data_path), round_dir, config.trainer, seed)
    sft = SFTStageConfig(model=model, output_dir=str(round_dir), store=config.store, phases="train",
                         datasets=[str(data_path)], seed=seed, lora=config.lora, trainer=config.trainer)
    config_path = round_dir / "train-config.json"
    config_path.write_text(json.dumps(to_dict(sft), indent=2))
    command = shlex.split(config.launcher) + ["-m", "cuda_l1", "train", "sft", "--config", str(config_path)]
    done = subprocess.run(command)
    if done.returncode != 0:
        raise UserError(f"round training failed (exit {done.returncode}): {' '.join(command)}")
    return json.loads((round_dir / "train_summary.json").read_text())


def run_self_improve(config: SelfImproveConfig, console: Console | None = None) -> dict:
    console = console or Console(stderr=True)
    require_single_process(SELF_IMPROVE_DRIVER)
    out = prepare_output(config.output_dir, to_dict(config), "self-improve")
    state_path = out / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    model_path = state.get("model") or check_model_path(config.model)
    done_rounds = int(state.get("completed_rounds", 0))
    device_label = None  # verdict device name, named once sampling is done (local GPUs: CUDA starts then)
    tasks = select_tasks(config.tasks, config.eval)
    extra = read_extra_completions(config.generation.extra_completions_file, tasks) \
        if config.generation.extra_completions_file else []
    steer = (config.steer, read_answers(config.steer, tasks)) if config.steer.enabled else None
    metrics = MetricsLog(out / "metrics.jsonl", out / "tensorboard")
    gen = config.generation
    history = []
    with Store(store_path(config.store, out)) as store:
        register_tasks(store, tasks)
        pool, eval_cfg = open_pool(config.eval)
        try:
            for round_index in range(done_rounds, config.rounds):
                number = round_index + 1
                round_dir = out / f"round-{number}"
                round_dir.mkdir(parents=True, exist_ok=True)
                seed = config.seed + round_index
                run_id = store.start_run(RUN_NAME, {"round": number, "model": model_path, "off_policy": off_policy(gen),
                                                    "output_dir": str(out.resolve())})
                if off_policy(gen):
                    console.print(f"round {number}: sampling {gen.endpoints} as is, not {model_path} "
                                  "(off-policy: allow_off_policy = true)", highlight=False, markup=False)
                prompts = [build_prompt(t.source, [], [], gen.gpu_name, task_name=t.name) for t in tasks]
                prompt_ids = [store.record_prompt(t.id, m, run_id=run_id) for t, m in zip(tasks, prompts)]
                sampled = ""  # the model the round's samples come from
                with _progress(console) as progress:
                    samples: list[list] = [[] for _ in tasks]
                    if gen.samples_per_task > 0:
                        bar = progress.add_task(f"round {number}: sampling", total=len(tasks))
                        generator = make_generator(gen, model_path, model_kwargs(config.model), seed, str(round_dir),
                                                   config.model.trust_remote_code, steer)
                        sampled = generator.sampled_model
                        try:
                            samples = generator.generate(prompts, gen.samples_per_task,
                                                         on_done=lambda k: progress.advance(bar, k))
                        finally:
                            generator.close()
                    attempts = [Attempt(t, s.text, pid, model=s.model, endpoint=s.endpoint,
                                        finish_reason=s.finish_reason, prompt_tokens=s.prompt_tokens,
                                        completion_tokens=s.completion_tokens)
                                for t, pid, group in zip(tasks, prompt_ids, samples) for s in group]
                    by_task = {t.id: (m, pid) for t, m, pid in zip(tasks, prompts, prompt_ids)}
                    attempts += [Attempt(t, text, by_task[t.id][1], model="extra-completions", origin_kind="import")
                                 for t, text in extra]
                    bar = progress.add_task(f"round {number}: evaluating", total=len(attempts))
                    device_label = device_label or local_device_label(config.eval)
                    judge = Judge(store, pool, eval_cfg, run_id, device_label)
                    outcomes = judge.judge(attempts, lambda k: progress.advance(bar, k))
                rows = [make_row(by_task[o.attempt.task.id][0], o, "full", round=number) for o in outcomes if o.ok]
                data_path = round_dir / "successes.jsonl"
                data_path.unlink(missing_ok=True)
                append_jsonl(data_path, rows)
                if config.accumulate:
                    data_path = out / "all-successes.jsonl"
                    append_jsonl(data_path, rows)
                # "model" names what was sampled; "policy" the checkpoint this round trains.
                record = {"round": number, "model": sampled or None, "policy": model_path,
                          "on_policy": not off_policy(gen), **rates(outcomes),
                          "successes": len(rows), "tasks_solved": len({r["task_id"] for r in rows}),
                          "evaluations": judge.evaluations, "trained": False}
                if read_jsonl(data_path):
                    trained = _train_round(config, model_path, data_path, round_dir, seed)
                    model_path = trained["final_model"]
                    record.update(trained=True, train_loss=trained["train_loss"], train_steps=trained["global_step"],
                                  train_rows=trained["rows"])
                record["next_model"] = model_path
                metrics.log(number, record, prefix="self_improve/")
                history.append(record)
                device_label = judge.device_label
                state = {"completed_rounds": number, "model": model_path, "device_label": device_label}
                state_path.write_text(json.dumps(state, indent=2))
                console.print(f"round {number}: {record['successes']} verified of {record['count']} "
                              f"(correct rate {record.get('correct_rate', 0):.2f}); model -> {model_path}")
        finally:
            pool.close()
            metrics.close()
    return {"output_dir": str(out), "rounds": history, "final_model": model_path}


__all__ = ["read_extra_completions", "run_self_improve"]
