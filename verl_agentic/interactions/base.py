"""Interactions: the environment's (or a simulated user's) side of a conversation.

The semantics of verl's former interaction system (verl <= 0.7), so classes written for it port
with a changed import (``from verl_agentic.interactions import BaseInteraction``)::

    instance_id = await it.start_interaction(instance_id=None, **interaction_kwargs)
    should_terminate, response, score, metadata = await it.generate_response(instance_id, messages)
    score = await it.calculate_score(instance_id)
    await it.finalize_interaction(instance_id)      # always runs (errors, cancellation)

``generate_response`` sees the whole conversation (OpenAI-style messages, the last one the
assistant's) and returns the next user message; ``should_terminate`` ends the episode (the
response is then not sent). ``score`` is that turn's reward.

What a verl <= 0.7 class can count on, attribute for attribute (docs/migrating.md): ``self.config``
(the YAML entry's ``config`` with ``name`` added), ``self.name`` (the entry's name; default
``"interaction_agent"``, verl's), ``start_interaction`` returning the given id or a new uuid string,
``generate_response(instance_id, messages, **interaction_kwargs)`` with the row's
``extra_info.interaction_kwargs``, and ``calculate_score`` / ``finalize_interaction`` in either of verl's
shapes: with the instance id (verl's subclasses) or without it (verl's base class); ``call_with_instance``
calls both. Ours adds: ``calculate_score`` is the episode's reward (verl ignored it), and
``finalize_interaction`` always runs, also after errors and cancellation.
"""

from __future__ import annotations

import inspect
import uuid
from typing import Any, Callable, Optional

from verl_agentic.interfaces import check_keys


class BaseInteraction:
    # The config keys a subclass reads (``name`` is always allowed): when declared, any other key is a
    # ``ConfigError`` naming it, like every other config section. ``None`` (classes ported from verl
    # that do not declare theirs) skips the check.
    CONFIG_KEYS: Optional[tuple[str, ...]] = None

    def __init__(self, config: Optional[dict] = None):
        self.config = dict(config or {})
        self.name: str = self.config.get("name") or "interaction_agent"  # verl's default
        if self.CONFIG_KEYS is not None:
            check_keys(self.config, ("name", *self.CONFIG_KEYS), f"interaction {self.name!r} ({type(self).__name__}) config")
        self._instance_dict: dict[str, dict] = {}

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        if instance_id in self._instance_dict:
            raise ValueError(f"interaction instance {instance_id!r} already exists")
        self._instance_dict[instance_id] = dict(kwargs)
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict],
                                **kwargs: Any) -> tuple[bool, str, float, dict]:
        return True, "", 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instance_dict.pop(instance_id, None)

    async def close(self) -> None:
        """Release what the interaction holds across its episodes (a model, a connection); its owner calls
        it when done with the interaction (``Interactions.close``). Nothing to release here."""

    @staticmethod
    def last_assistant_content(messages: list[dict]) -> str:
        for m in reversed(messages):
            if m.get("role") == "assistant":
                return m.get("content") or ""
        return ""


async def call_with_instance(method: Callable, instance_id: str) -> Any:
    """``await method(instance_id)``, or ``await method()`` for a method declared without it: verl's
    base class declared ``calculate_score(self)`` and ``finalize_interaction(self)``, its subclasses
    ``(self, instance_id, **kwargs)``; classes written for verl come in both shapes."""
    params = inspect.signature(method).parameters.values()
    takes_id = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
    result = method(instance_id) if takes_id else method()
    return await result if inspect.isawaitable(result) else result
