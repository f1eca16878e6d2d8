"""`cuda-l1 tasks list|show`: browse task sources."""

from __future__ import annotations

import typer
from rich.syntax import Syntax
from rich.table import Table

from cuda_l1.cli.app import app, console, print_json
from cuda_l1.tasks import find_task, load_tasks, parse_levels
from cuda_l1.tasks.runtime import describe_task

tasks_app = typer.Typer(help="List and inspect tasks.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")

SOURCE_HELP = "'builtin', a KernelBench-layout directory, a task .py file, or a .jsonl solution set."


@tasks_app.command("list")
def list_tasks(
    source: str = typer.Argument(..., help=SOURCE_HELP),
    levels: str = typer.Option(None, "--levels", help="Only these levels, e.g. 1,2."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array instead of a table."),
) -> None:
    """List the tasks of SOURCE (parsed only: nothing is executed)."""
    tasks = load_tasks(source, levels=parse_levels(levels))
    if as_json:
        print_json([t.summary() for t in tasks])
        return
    table = Table(title=f"{len(tasks)} tasks from {source}")
    for column in ("id", "level", "name", "description"):
        table.add_column(column, overflow="fold")
    for t in tasks:
        table.add_row(t.id, str(t.level), t.name, t.description)
    console.print(table)


@tasks_app.command("show")
def show_task(
    source: str = typer.Argument(..., help=SOURCE_HELP),
    task_id: str = typer.Argument(..., metavar="ID", help="Task id (or 4+ leading characters), name, or level/number."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object."),
) -> None:
    """Show one task: its inputs (built by get_inputs, forward is not run) and its source."""
    task = find_task(load_tasks(source), task_id)
    info = describe_task(task)
    if as_json:
        print_json({**info, "source": task.source})
        return
    console.print(f"[bold]{task.key}[/]  id {task.id}  level {task.level}")
    if task.description:
        console.print(task.description)
    console.print(f"origin: {task.origin}")
    console.print(f"init inputs: {info['init_inputs']}")
    console.print(f"inputs: {info['inputs']}")
    console.print(f"parameters: {info['parameters']:,}")
    console.print(Syntax(task.source, "python", line_numbers=True))
