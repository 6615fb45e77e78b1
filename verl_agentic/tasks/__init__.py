"""The tasks: one module or folder each (``gsm8k/`` holds everything gsm8k needs), registered into the
rollout's dispatch table ``TASKS`` (``verl_agentic.rollout.task_spec``, re-exported here).

The built-in tasks are entry points of the group ``verl_agentic.tasks`` (``pyproject.toml``), like a
third-party package's: the registries import them on their first lookup, so importing this package
does not. ``python -m verl_agentic.tasks`` lists what is registered.
"""

from verl_agentic.rollout.task_spec import TASKS, TaskSpec, get_task, register_task
from verl_agentic.tasks.data import PREPROCESS_DATASET, PROMPT_GENERATOR, DatasetError, load_rows

__all__ = ["PREPROCESS_DATASET", "PROMPT_GENERATOR", "TASKS", "DatasetError", "TaskSpec", "get_task", "load_rows",
           "register_task"]
