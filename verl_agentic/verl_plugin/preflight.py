"""Check a run's ``agentic`` settings in verl's trainer before any worker starts or any model loads.

The ``task_agent`` loop checks its settings in each agent-loop worker, which verl starts after the actor,
the reference and the rollout servers have loaded the model: minutes into a run. So in the trainer's
process (verl's ``TaskRunner``), ``PPOTrainer.init`` first runs the same checks on the resolved config::

    settings = TaskAgentSettings.from_sources(config.agentic)   # keys, values; agentic.imports imported
    for each task named (agentic.task_type, and each registered task with an agentic.task.<name> section):
        check_task_config(name, spec, task_section(...))        # the task's check_config: its tools loaded
                                                                # (ours, verl's tool files, MCP servers)

A bad key, an unknown task (the error lists the registered ones), a tool file that does not load or an MCP
server that does not start is then a ``ConfigError`` naming it, in seconds. Rows that name other tasks
(a ``task_type`` column) are checked where they run, as before.

Only for runs that use ``task_agent`` (``rollout.agent.default_agent_loop=task_agent``) or have an
``agentic`` section. ``VERL_AGENTIC_PREFLIGHT=0`` switches it off. It has run on this CPU only: it reads
the config and touches no device, and is the same code the workers run.
A side effect to know: an MCP stdio server named in a task's tools is started in the trainer's process
too (its tools are listed to check them) and stays, idle, until the run ends.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from verl_agentic.interfaces import ConfigError
from verl_agentic.verl_plugin.on_import import after_import

logger = logging.getLogger(__name__)

TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"


def uses_task_agent(config: Any) -> bool:
    rollout = config.get("actor_rollout_ref", {}).get("rollout", {})
    return (rollout.get("agent") or {}).get("default_agent_loop") == "task_agent" or config.get("agentic") is not None


def check(config: Any) -> None:
    """The checks above on a verl trainer config; a ``ConfigError`` naming what is wrong."""
    if not uses_task_agent(config):
        return
    from verl_agentic.rollout.task_spec import TASKS  # the agent-loop layer: loaded only in the trainer's process
    from verl_agentic.verl_plugin.agent_loop import TaskAgentSettings, check_task_config, task_section

    settings = TaskAgentSettings.from_sources(config.get("agentic"))
    names = [settings.task_type] if settings.task_type else []
    names += [name for name in settings.task if name not in names and name in TASKS.names()]
    rollout = config.actor_rollout_ref.rollout
    for name in names:
        try:
            spec = TASKS.get(name)
        except ConfigError as e:  # only agentic.task_type may name an unregistered task here
            raise ConfigError(f"agentic.task_type: {e}") from None
        check_task_config(name, spec, task_section(settings, rollout, name))


def install(trainer_base: Any = None) -> None:
    """Wrap verl's ``PPOTrainer.init``: :func:`check` first (once per process; the registry reads
    ``VERL_AGENTIC_PREFLIGHT``, ``upstream.py``)."""
    if trainer_base is None:  # tests, and a process that imported the trainer before the plugin
        from verl.trainer.ppo.v1 import trainer_base

    original = getattr(trainer_base.PPOTrainer, "init", None)
    if original is None:  # a verl that renamed it: tests/test_verl_tools.py's guard names it (upstream.VERL)
        logger.warning("verl's PPOTrainer has no init: the agentic settings are checked in the workers only")
        return
    if getattr(original, "__verl_agentic_preflight__", False):
        return

    @functools.wraps(original)
    def init(self, *args: Any, **kwargs: Any) -> Any:
        check(self.config)
        return original(self, *args, **kwargs)

    init.__verl_agentic_preflight__ = True
    trainer_base.PPOTrainer.init = init


def install_on_import() -> None:
    """:func:`install` now if verl's trainer module is loaded, else as soon as it is (``on_import``)."""
    after_import(TRAINER_MODULE, install)
