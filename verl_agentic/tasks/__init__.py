"""The tasks: one module or folder each (``gsm8k/`` holds everything gsm8k needs), registered into the
rollout's dispatch table ``TASKS`` (``verl_agentic.rollout.task_spec``, re-exported here).

The built-in tasks are entry points of the group ``verl_agentic.tasks`` (``pyproject.toml``), like a
third-party package's: the registries import them on their first lookup, so importing this package
does not. ``python -m verl_agentic.tasks`` lists what is registered.
"""

from typing import Any

from verl_agentic.rollout.task_spec import TASKS, TaskSpec, get_task, register_task

_DATA_NAMES = ("PREPROCESS_DATASET", "PROMPT_GENERATOR", "DatasetError", "load_rows")


def __getattr__(name: str) -> Any:
    """The data helpers of ``tasks.data``, imported on first use: importing this package does not import
    that module, so ``python -m verl_agentic.tasks.data`` runs without runpy's "found in sys.modules" warning."""
    if name in _DATA_NAMES:
        from verl_agentic.tasks import data  # on first use: see above

        return getattr(data, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PREPROCESS_DATASET", "PROMPT_GENERATOR", "TASKS", "DatasetError", "TaskSpec", "get_task", "load_rows",
           "register_task"]
