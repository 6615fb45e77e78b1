"""Task plugins: ``task_type`` -> ``TaskSpec(loop, start, gen, obs, end)``.

Built-in tasks are registered on import; third-party ones through the entry-point group
``verl_agentic.tasks``. ``python -m verl_agentic.tasks`` lists what is registered.
"""

from verl_agentic.tasks.registry import TASKS, TaskSpec, get_task, register_task
from verl_agentic.tasks import gsm8k, swedev, tool_agent  # noqa: F401,E402 - registers "gsm8k", "swedev", "tool_agent"
from verl_agentic.tasks import dr, gen_chat  # noqa: F401,E402 - registers "dr", "gen_chat"

__all__ = ["TASKS", "TaskSpec", "get_task", "register_task"]
