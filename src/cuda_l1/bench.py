"""Benchmark runs: offline strategies (or given candidates) over a task source, resumable, reported.

A run directory holds `history.sqlite` (every verdict), `summary.json`, `results.csv`, `report.html`
and the PNG plots. Rerunning the same command in the same directory skips finished work.
"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from cuda_l1.devices import Device, as_device, device_key
from cuda_l1.engine import Engine
from cuda_l1.errors import BrokenTask, TaskError, UserError
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.pool import make_pool
from cuda_l1.evaluate.verdict import REJUDGE_CHECK, Verdict
from cuda_l1.progress import EvalProgress
from cuda_l1.store.run_lock import RunLock
from cuda_l1.tasks import Task, for_device, load_solutions_jsonl, load_tasks, no_task_matched, select_tasks
from cuda_l1.tasks.loaders import first_tasks
from cuda_l1.tasks.task import task_name

STORE_NAME = "history.sqlite"
MISSING_RULE = "one"  # tasks without a correct candidate count as speedup 1.0 in means (as the paper)


@dataclass
class Candidate:
    """Something to evaluate for a task, and where it came from."""

    task: Task
    source: str
    origin: dict  # store origin: {"kind": "strategy", "strategy": "compile"} etc.
    label: str  # short name for tables ("compile", "audit", ...)
    meta: dict = field(default_factory=dict)


def strategy_candidates(tasks: list[Task], names: list[str], device: str) -> tuple[list[Candidate], list[str]]:
    """Tasks x strategies, task by task; strategies that do not apply on the device are skipped with a
    note. A task's strategies come one after another, so that a worker prepares its reference once for
    all of them (it holds only its last few tasks': strategy by strategy, KernelBench's 250 tasks were
    each prepared once per strategy), and a run stopped partway has every strategy of the tasks it reached."""
    from cuda_l1.strategies import get_strategy

    strategies, notes = [], []
    for name in names:
        strategy = get_strategy(name)
        applies, note = strategy.applies(device)
        if applies:
            strategies.append((name, strategy))
        else:
            notes.append(f"strategy {name} skipped on {device}: {note}")
    out = [Candidate(task, strategy.generate(task), {"kind": "strategy", "strategy": name}, name)
           for task in tasks for name, strategy in strategies]
    return out, notes


def candidates_from_jsonl(path: str) -> tuple[list[Candidate], list[dict]]:
    """Candidates of a published solution set; records without one are returned as `missing`."""
    candidates, missing = [], []
    for record in load_solutions_jsonl(path):
        if record.candidate is None:
            missing.append({"task": record.task, "line": record.line, "claims": record.claims})
            continue
        candidates.append(Candidate(record.task, record.candidate, {"kind": "audit"}, "audit",
                                    {"line": record.line, "claims": record.claims}))
    return candidates, missing


def check_tasks_option(source: str, tasks_source: str | None) -> None:
    """--tasks names the tasks of a folder of candidate files and nothing else: given with a task source
    or a solution set (which holds its own references) it was silently ignored."""
    if tasks_source is None:
        return
    if source.endswith(".jsonl") or not Path(source).is_dir():
        raise UserError(f"--tasks goes with a directory of candidate files; {source!r} is not one (a task "
                        "source or a .jsonl solution set brings its own tasks: leave --tasks out).")
    if tasks_source != "builtin" and not tasks_source.startswith("builtin:") and not Path(tasks_source).exists():
        raise UserError(f"--tasks {tasks_source}: no such file or directory (it takes 'builtin', a "
                        "KernelBench-layout directory or a task .py file).")


def candidates_from_directory(path: str, tasks: list[Task]) -> list[Candidate]:
    """A folder of candidate files named like the tasks they solve (`19_ReLU.py` for task 19_ReLU)."""
    by_name = {t.name: t for t in tasks}
    out = []
    for file in sorted(Path(path).rglob("*.py")):
        task = by_name.get(task_name(file.stem))  # (named as the task files are: control characters as '?')
        if task is None:
            raise UserError(f"no task named {file.stem!r} among the tasks given with --tasks.", path=str(file))
        try:
            source = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 text ({exc.reason} at byte {exc.start})"
            raise UserError(f"the candidate cannot be read: {reason}.", path=str(file)) from None
        out.append(Candidate(task, source, {"kind": "import"}, "import"))
    if not out:
        raise UserError("no candidate .py files found.", path=path)
    return out


class RunContext:
    """The store of a run directory and the run inside it (reused on resume)."""

    def __init__(self, out_dir: str | Path, run_name: str, config: dict):
        from cuda_l1.store import Store

        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock.acquire(self.out_dir)  # one command at a time in a run directory
        self.store = None
        try:
            self.store = Store(self.out_dir / STORE_NAME)
            _refuse_to_replace_verdicts(self.out_dir, self.store)
            previous = self.store.runs(run_name)
            self.run_id = previous[-1].id if previous else self.store.start_run(run_name, config)
        except BaseException:
            self.close()
            raise
        self.resumed = bool(previous)
        self.imported: dict = {}  # verdicts read from --verdicts-from: carried into this run's verdicts.jsonl

    def close(self) -> None:
        try:
            if self.store is not None:
                self.store.close()
        finally:
            self.lock.release()


def _refuse_to_replace_verdicts(out_dir: Path, store) -> None:
    """A store with no run beside a verdicts.jsonl that holds verdicts: the store was emptied or removed (a
    0-byte one opens as new), and the run about to start would write its own verdicts over that file."""
    from cuda_l1.store.verdict_file import VERDICTS_NAME

    kept = out_dir / VERDICTS_NAME
    if not store.runs() and kept.is_file() and kept.stat().st_size > 0:
        raise UserError(f"{kept} holds verdicts, but the run's store beside it ({STORE_NAME}) holds no run: it was "
                        f"emptied or removed, and a new run here would write over that file. Resume from it "
                        f"elsewhere (--verdicts-from {kept} --out ANOTHER_DIR), or move it away first.")


def evaluate_candidates(ctx: RunContext, candidates: list[Candidate], config: EvalConfig, *, device: Device,
                        cluster: str = "local", workers: int | None = None, progress: bool = True,
                        on_result: Callable[[Candidate, Verdict], None] | None = None,
                        decides_at: Callable[[Candidate], tuple[float, ...]] | None = None,
                        rejudge: frozenset[str] = frozenset(),
                        imported: Mapping[tuple[str, str, str, str], Verdict] | None = None) -> dict:
    """Judge every candidate through the engine: one not yet judged on this device under these
    settings is evaluated (its program once: a duplicate gets its verdict), each verdict stored as it
    arrives (a kill loses nothing already judged). `on_result` sees each evaluated one; `decides_at`
    gives the speedups the caller decides a candidate at (EvalJob.thresholds: its timing may stop once
    clear of them). `rejudge`: statuses whose stored verdicts are judged again (Store.reopen_verdict).
    `imported`: verdicts read from a verdicts file (store.verdict_file), filed for the candidates they
    match instead of judging them again (a settled one whose status is not in `rejudge`). Returns counts.

    Each task's reference is run once by the worker that prepares the task, before any of its
    candidates is judged (TaskEnv); a broken one (BrokenTask: bad input) leaves its candidates without a
    verdict, and the others are judged: counts["broken_tasks"] maps its id to its key and why, for the
    caller to report (one task that fails on this machine must not stop a run of 250). Running every reference
    here first cost a KernelBench run 70-95 s of each call on an H200 before its first verdict."""
    store, dkey, ckey = ctx.store, device_key(device), config.config_key()
    todo: list[tuple[Candidate, str]] = []
    reopened = taken = 0
    for cand in candidates:
        store.add_task(cand.task)
        cid, _ = store.add_candidate(cand.task.id, cand.source, cand.origin, ctx.run_id)
        known = store.verdict_for(cid, dkey, ckey, task_id=cand.task.id)
        given = (imported or {}).get((cand.task.id, cid, dkey, ckey))
        if (known is None or not known.settled and known.check(REJUDGE_CHECK) is None) and given is not None \
                and given.settled and given.status not in rejudge:  # (a verdict reopened by --rejudge is judged)
            # Not a new measurement: its reference time does not count again in the task's record.
            taken += store.record_verdict(cid, given, ctx.run_id, device=dkey, config_key=ckey, task_id=cand.task.id,
                                          reference_sample=False)
            continue
        if known is not None and known.settled and known.status in rejudge:
            store.reopen_verdict(cid, dkey, ckey, f"--rejudge {known.status}", task_id=cand.task.id)
            reopened += 1
        elif known is not None and known.settled:
            continue
        todo.append((cand, cid))  # new, reopened, or one the evaluation itself failed (judged again)
    # A resumed run (the same run id) judges its tasks again: what it noted of them before no longer stands.
    store.clear_tasks_not_run(ctx.run_id, [cand.task.id for cand in candidates])
    broken: dict[str, dict] = {}  # task id -> {"task": its key, "why": a BrokenTask's words}
    counts = {"total": len(candidates), "skipped": len(candidates) - len(todo) - taken, "evaluated": 0, "reused": 0,
              "rejudged": reopened, "imported": taken, "broken_tasks": broken}
    if not todo:  # a finished run resumed: no pool is started
        return counts
    with make_pool(cluster, config.device, config, workers) as pool:
        engine = Engine(store, pool, device_key=dkey, config_key=ckey, run_id=ctx.run_id)
        futures = {engine.submit(cand.task, cid, cand.source, thresholds=decides_at(cand) if decides_at else ()): cand
                   for cand, cid in todo}
        with EvalProgress(engine.evaluations, enabled=progress) as bar:
            for future in as_completed(futures):
                cand = futures[future]
                try:
                    judged = future.result()
                except BrokenTask as exc:  # its task's reference does not run: no verdict, the others go on
                    if cand.task.id not in broken:
                        broken[cand.task.id] = {"task": cand.task.key, "why": str(exc)}
                        store.note_task_not_run(ctx.run_id, cand.task.id, str(exc))
                    bar.advance(f"{cand.task.key} {cand.label} not judged: its task's reference does not run")
                    continue
                except TaskError:  # any other bad input: the run ends now
                    pool.abort()
                    raise
                if judged.reused:
                    counts["reused"] += 1
                    continue
                counts["evaluated"] += 1
                if on_result:
                    on_result(cand, judged.verdict)
                bar.advance(verdict_line(cand.task.key, cand.label, judged.verdict))
    return counts


def verdict_line(task_key: str, label: str, verdict: Verdict) -> str:
    """'L1/19_ReLU compile ok 1.42x (raw 1.45, 95% CI 1.43-1.47) [3.1 s]': one finished evaluation, in words."""
    text = f"{task_key} {label} {verdict.status}"
    if verdict.speedup is not None:
        text += f" {verdict.speedup:.2f}x"
        if verdict.raw_speedup is not None and verdict.ci:
            text += f" (raw {verdict.raw_speedup:.2f}, 95% CI {verdict.ci[0]:.2f}-{verdict.ci[1]:.2f})"
    elif verdict.reasons:
        text += ": " + " ".join(str(verdict.reasons[0]).split())[:100]
    if verdict.elapsed_s:
        text += f" [{verdict.elapsed_s:.1f} s]"  # the verdict's own time (loaded ahead: from its load)
    return text


def keep_verdicts(ctx: RunContext) -> None:
    """verdicts.jsonl of a run that did not finish (Ctrl-C, a time limit's SIGINT, a broken task): the store
    resumes it in place, the file on another machine (--verdicts-from). Never in the way of the error."""
    from cuda_l1.store.verdict_file import VERDICTS_NAME, write_verdicts

    try:
        write_verdicts(ctx.store, ctx.out_dir / VERDICTS_NAME, carried=ctx.imported)
    except Exception:  # noqa: BLE001 - the run's own error is the one to report
        pass


def write_report(ctx: RunContext, title: str, notes: Iterable[str] = (),
                 tasks_not_run: Mapping[str, dict] | None = None) -> dict:
    """The run's report, and every verdict of its store as verdicts.jsonl (ids and numbers, no code).
    tasks_not_run: evaluate_candidates' counts["broken_tasks"]."""
    from cuda_l1.store.verdict_file import VERDICTS_NAME, write_verdicts

    paths = write_run_report(ctx.out_dir, ctx.store.run_results(ctx.run_id), title, notes, tasks_not_run)
    write_verdicts(ctx.store, ctx.out_dir / VERDICTS_NAME, carried=ctx.imported)
    return {**paths, "verdicts": ctx.out_dir / VERDICTS_NAME}


def write_run_report(out_dir: str | Path, rows: list, title: str, notes: Iterable[str] = (),
                     tasks_not_run: Mapping[str, dict] | None = None) -> dict:
    """summary.json, results.csv, report.html and plots, with the scoring rules stated, what ran where
    and when, and the noise check (OUT/calibration.json and the run's own eager candidates)."""
    from cuda_l1.report import as_rows, write_all
    from cuda_l1.report.provenance import provenance

    # A task not judged is in no figure: a verdict of it from before (resumed, or reopened by --rejudge and
    # not judged again) is left out, as the report says.
    rows = [r for r in as_rows(rows) if r.task_id not in (tasks_not_run or {})]
    noise = noise_summary(out_dir, rows)
    notes = list(notes) + [
        "Speedup = reference time / candidate time, scored toward 1 (the end of the 95% interval nearest 1).",
        "Tasks without a correct candidate count as speedup 1.0 in means (the CUDA-L1 paper's rule).",
    ]
    if noise["too_noisy"]:
        title += " (HOST TOO NOISY: speedups not reliable)"
    return write_all(out_dir, rows, missing_as=MISSING_RULE, title=title, notes=notes,
                     provenance=provenance(), noise=noise, tasks_not_run=tasks_not_run)


def noise_summary(out_dir: str | Path, rows: list) -> dict:
    """The latest A/A calibration of the run directory and the spread of the run's eager candidates,
    and whether either says the host is too noisy."""
    from cuda_l1.calibrate import eager_spread, load_calibrations, verdict_text

    checks = load_calibrations(out_dir)
    latest = checks[-1] if checks else None
    device = latest["device"] if latest else ("cpu" if any(r.verdict.device.startswith("cpu") for r in rows)
                                              else "cuda")
    eager = eager_spread(rows, device)
    judged = [c for c in (latest, eager) if c is not None]
    return {
        "calibration": latest,
        "eager": eager,
        "checked": any(c.get("n_ok") for c in judged),  # a check with nothing ok measured nothing
        "too_noisy": any(c["too_noisy"] for c in judged),
        "verdicts": [f"{c['kind']}: {verdict_text(c)}" for c in judged],
    }


def run_bench(source: str, out_dir: str, *, strategies: list[str], levels: set[int] | None,
              device: Device | str | None,
              config: EvalConfig, cluster: str = "local", workers: int | None = None, tasks_source: str | None = None,
              progress: bool = True, limit: int | None = None, rejudge: frozenset[str] = frozenset(),
              imported: Mapping | None = None) -> dict:
    """`cuda-l1 bench`: strategies over a task source, or the candidates of a JSONL/directory.
    `limit` keeps the first N tasks (after --levels); `rejudge`: stored statuses judged again;
    `imported`: verdicts read from a verdicts file (read_imported), taken for the programs they match."""
    device = as_device(device, cluster)
    config = dataclasses.replace(config, device=str(device))
    check_tasks_option(source, tasks_source)
    source, tasks_source = for_device(source, device), tasks_source and for_device(tasks_source, device)
    notes: list[str] = []
    path = Path(source)
    if source.endswith(".jsonl"):
        candidates, missing = candidates_from_jsonl(source)
        notes.append(f"{len(missing)} record(s) had no candidate and count as missing")
    elif path.is_dir() and tasks_source:
        candidates = candidates_from_directory(source, load_tasks(tasks_source, levels=levels))
    else:
        tasks = select_tasks(source, levels, limit)
        candidates, notes = strategy_candidates(tasks, strategies, str(device))
        if not candidates:
            raise UserError(f"none of the strategies {', '.join(strategies)} applies on {device}; "
                            "try --strategies eager,compile.")
    if levels:
        candidates = [c for c in candidates if c.task.level in levels]
    if limit is not None:
        keep = {t.id for t in first_tasks([c.task for c in candidates], limit)}
        candidates = [c for c in candidates if c.task.id in keep]
    if not candidates:
        raise no_task_matched(source, levels)
    ctx = RunContext(out_dir, "bench", {"source": source, "strategies": strategies, "device": str(device)})
    ctx.imported = dict(imported or {})
    try:
        try:
            counts = evaluate_candidates(ctx, candidates, config, device=device, cluster=cluster, workers=workers,
                                         progress=progress, rejudge=rejudge, imported=imported)
        except BaseException:  # interrupted, or a broken task: what was judged outlives the run as a file too
            keep_verdicts(ctx)
            raise
        paths = write_report(ctx, f"cuda-l1 bench: {source} on {device_key(device)}", notes,
                             counts["broken_tasks"])
    finally:
        ctx.close()
    return {"counts": counts, "notes": notes, "paths": {k: str(v) for k, v in paths.items()}}


def tasks_not_run_error(broken: Mapping[str, dict], report: str | Path, before_search: bool = False) -> BrokenTask:
    """What a command that finished its other work says of the tasks whose reference did not run
    (evaluate_candidates' counts["broken_tasks"]): bad input (exit 2), after the report is written.
    `before_search`: optimize's baseline, after which nothing is searched and no report is written."""
    listed = "; ".join(f"{t['task']} ({task_id}): {' '.join(t['why'].split())[:300]}" for task_id, t in broken.items())
    where = (f"the search did not start; {report} keeps the baseline's verdicts, and the same command resumes "
             "once these run" if before_search else f"{report} covers the others; run again, the command judges only these")
    return BrokenTask(f"{len(broken)} task(s) not judged, their reference failing here ({where}): {listed}")


def read_imported(path: str | Path | None) -> dict | None:
    """The verdicts of `--verdicts-from`, read before any work starts (a malformed file is bad input)."""
    if path is None:
        return None
    from cuda_l1.store.verdict_file import read_verdicts

    return read_verdicts(path)


def load_summary(out_dir: str | Path) -> dict:
    return json.loads((Path(out_dir) / "summary.json").read_text())

