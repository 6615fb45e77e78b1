"""verl <= 0.7 launch-script keys that verl 0.9.1 no longer has, each with what replaces it here.

Without this, ``python -m verl.trainer.main_ppo actor_rollout_ref.rollout.multi_turn.interaction_config_path=...``
stops with hydra's "Key 'interaction_config_path' is not in struct". The plugin is imported by ``import
verl``, before verl's ``main_ppo`` composes its config, so it checks the command line of verl's trainer
first and stops with one line naming the replacement (exit code 2). The whole mapping, kept keys
included: docs/migrating.md.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from verl_agentic.verl_plugin.command_line import is_verl_trainer, overrides

# key (as on verl 0.7's command line) -> what to write instead with verl 0.9.1 and verl_agentic
REMOVED = {
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": (
        "+agentic.task.tool_agent.interaction=<the same YAML> with +agentic.task_type=tool_agent and "
        "actor_rollout_ref.rollout.agent.default_agent_loop=task_agent (verl removed interactions in 0.8; "
        "verl_agentic's tool_agent task runs verl's interaction YAML, classes and extra_info.interaction_kwargs)"),
}


def removed_key_messages(argv: Sequence[str]) -> list[str]:
    """One message per key of ``REMOVED`` that an override in ``argv`` sets."""
    return [f"{key} no longer exists in verl 0.9.1; use {REMOVED[key]}. See docs/migrating.md"
            for key in overrides(argv) if key in REMOVED]


def check_command_line(argv: Optional[Sequence[str]] = None) -> None:
    """In verl's trainer (``python -m verl.trainer.main_ppo ...``): stop with the replacements of the
    removed keys on its command line. Any other program (a Ray worker, a user's script) is left alone."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not is_verl_trainer(argv[0]):
        return
    messages = removed_key_messages(argv[1:])
    if messages:
        for m in messages:
            print(f"error: {m}", file=sys.stderr)
        raise SystemExit(2)  # verl swallows a plugin's Exceptions (verl/__init__.py), not a SystemExit
