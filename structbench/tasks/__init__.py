"""Tasks a suite can train: name -> definition (defaults and builder)."""

from __future__ import annotations

from structbench.errors import Registry
from structbench.tasks.base import EvalResult, Task, TaskContext, TaskDef
from structbench.tasks.language.task import LANGUAGE_MODEL
from structbench.tasks.quadratic import QUADRATIC
from structbench.tasks.synthetic_classification import SYNTHETIC_CLASSIFICATION
from structbench.tasks.vision.task import IMAGE_CLASSIFICATION

TASKS: Registry[TaskDef] = Registry(
    "task", ((t.name, t) for t in (QUADRATIC, SYNTHETIC_CLASSIFICATION, IMAGE_CLASSIFICATION, LANGUAGE_MODEL))
)


def get_task(name: str) -> TaskDef:
    """The task registered as `name`; an unknown name is a usage error."""
    return TASKS.lookup(name)


__all__ = ["TASKS", "EvalResult", "Task", "TaskContext", "TaskDef", "get_task"]
