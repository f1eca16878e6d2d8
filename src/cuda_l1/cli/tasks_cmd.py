"""`cuda-l1 tasks list|show`: browse task sources."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from cuda_l1.cli import options
from cuda_l1.cli.app import app, console, print_json
from cuda_l1.tasks import find_task, load_tasks, parse_levels, select_tasks
from cuda_l1.tasks.deadline import DEFAULT_TASK_TIMEOUT_S
from cuda_l1.tasks.runtime import describe_task
from cuda_l1.tasks.loaders import builtin_gpu_sizes
from cuda_l1.tasks.sizes import GPU, GPU_TARGET_MS

tasks_app = typer.Typer(help="List and inspect tasks.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")

def plural(count: int, noun: str) -> str:
    """'1 task', '3 tasks'."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


SOURCE_HELP = ("'builtin' (builtin:cpu / builtin:gpu for its CPU or GPU sizes), a KernelBench-layout directory, "
               "a task .py file, or a .jsonl solution set.")


def builtin_sizes(task) -> dict | None:
    """For a built-in task: which sizes this copy has, and the GPU sizes (None for other tasks)."""
    if not (task.origin or "").startswith("builtin:"):
        return None
    return {"applied": GPU if task.origin.endswith(f"({GPU} sizes)") else "cpu", "gpu": builtin_gpu_sizes(task)}


def sizes_line(sizes: dict) -> str:
    gpu = ", ".join(f"{k}={v}" for k, v in sizes["gpu"].items())
    if sizes["applied"] == GPU:
        return (f"sizes: gpu ({gpu}; aimed at >= {GPU_TARGET_MS} ms per reference call on an H100-class GPU); "
                "builtin:cpu has the small ones")
    return f"sizes: cpu (as written); on a GPU `builtin` runs builtin:gpu with {gpu}"


@tasks_app.command("list")
def list_tasks(
    source: str = typer.Argument(..., metavar="SOURCE", help=SOURCE_HELP),
    levels: str = options.levels(),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array instead of a table."),
) -> None:
    """List the tasks of SOURCE (parsed only: nothing is executed)."""
    tasks = select_tasks(source, parse_levels(levels))
    if as_json:
        print_json([t.summary() for t in tasks])
        return
    table = Table(title=escape(f"{plural(len(tasks), 'task')} from {source}"))
    for column in ("id", "level", "name", "description"):
        table.add_column(column, overflow="fold")
    for t in tasks:  # descriptions are text: "[h', c']" must not be read as markup
        table.add_row(t.id, str(t.level), escape(t.name), escape(t.description))
    console.print(table)


@tasks_app.command("show")
def show_task(
    source: str = typer.Argument(..., metavar="SOURCE", help=SOURCE_HELP),
    task_id: str = typer.Argument(..., metavar="ID", help="Task id (or 4+ leading characters), name, or level/number."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object."),
    timeout: float = typer.Option(DEFAULT_TASK_TIMEOUT_S, "--timeout", metavar="SECONDS", min=1.0,
                                  help="Deadline of the task's own code, each of: its import, building its "
                                  "model and inputs (a task that sleeps or loops is reported broken past it)."),
) -> None:
    """Show one task: its inputs (built by get_inputs, forward is not run) and its source."""
    options.finite_timeout(timeout)
    task = find_task(load_tasks(source), task_id)
    sizes = builtin_sizes(task)
    info = describe_task(task, on_meta=bool(sizes) and sizes["applied"] == GPU, timeout_s=timeout)
    if as_json:
        print_json({**info, **({"sizes": sizes} if sizes else {}), "source": task.source})
        return
    console.print(f"[bold]{escape(task.key)}[/]  id {task.id}  level {task.level}")
    if task.description:
        console.print(task.description, markup=False)
    console.print(f"origin: {task.origin}", markup=False)
    if sizes:
        console.print(sizes_line(sizes), markup=False)
    console.print(f"init inputs: {info['init_inputs']}", markup=False)
    console.print(f"inputs: {info['inputs']}", markup=False)
    console.print(f"parameters: {info['parameters']:,}")
    console.print(Syntax(task.source, "python", line_numbers=True))
