"""Tasks: KernelBench-format references and where they come from."""

from cuda_l1.tasks.loaders import (
    BUILTIN,
    SolutionRecord,
    find_task,
    load_builtin,
    load_directory,
    load_solutions_jsonl,
    load_task_file,
    load_tasks,
    no_task_matched,
    parse_levels,
    select_tasks,
)
from cuda_l1.tasks.sizes import for_device
from cuda_l1.tasks.task import Task, code_id, make_task, source_id

__all__ = [
    "BUILTIN",
    "SolutionRecord",
    "Task",
    "code_id",
    "find_task",
    "for_device",
    "load_builtin",
    "load_directory",
    "load_solutions_jsonl",
    "load_task_file",
    "load_tasks",
    "make_task",
    "no_task_matched",
    "parse_levels",
    "select_tasks",
    "source_id",
]
