"""Tools: ``BaseTool`` (OpenAI function schema + async per-episode lifecycle) and ``ToolResult``.

The lifecycle follows the one verl's older tool system used, so tool classes written for it port
with a changed import::

    instance_id = await tool.create(instance_id=None, **tools_kwargs)   # once per episode
    result = await tool.execute(instance_id, {"code": "print(1)"})     # per call -> ToolResult
    reward = await tool.calc_reward(instance_id)
    await tool.release(instance_id)                                     # always, at episode end

State may persist across the calls of one episode (keyed by ``instance_id``); different
episodes never share it. ``execute`` should return a ``ToolResult`` (a plain string, or verl's
``(text, reward, metrics)`` tuple, is accepted too); an exception becomes an error message to
the model, counted in the episode's metrics (see ``ToolRunner``).
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError

TOOL_STATUSES = ("ok", "error", "timeout")


@dataclass
class ToolResult:
    text: str  # the tool message content the model sees
    reward: float = 0.0  # step reward
    metrics: dict = field(default_factory=dict)
    status: str = "ok"  # ok | error (the tool ran and failed) | timeout

    @classmethod
    def coerce(cls, value: Any) -> "ToolResult":
        """A tool's return value -> ToolResult (str, (text, reward, metrics) tuples, ToolResult)."""
        if isinstance(value, ToolResult):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, tuple) and 1 <= len(value) <= 3:
            text = value[0] if isinstance(value[0], str) else getattr(value[0], "text", str(value[0]))
            return cls(text, float(value[1]) if len(value) > 1 and value[1] is not None else 0.0,
                       dict(value[2]) if len(value) > 2 and value[2] else {})
        return cls(str(value))


def validate_schema(schema: Any, where: str = "tool_schema") -> dict:
    """Check an OpenAI function-tool schema; return it. ConfigError naming the problem."""
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"), dict):
        raise ConfigError(f"{where}: expected {{'type': 'function', 'function': {{name, description, parameters}}}}, "
                          f"got {str(schema)[:200]}")
    fn = schema["function"]
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ConfigError(f"{where}: function.name must be a non-empty string")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict) or params.get("type") != "object":
        raise ConfigError(f"{where}: function.parameters must be a JSON schema of type 'object'")
    return schema


class BaseTool:
    """Subclass and implement ``execute``; set ``DEFAULT_SCHEMA`` for a schema-less config."""

    DEFAULT_SCHEMA: Optional[dict] = None

    def __init__(self, config: Optional[dict] = None, tool_schema: Optional[dict] = None):
        self.config = dict(config or {})
        schema = tool_schema if tool_schema is not None else copy.deepcopy(self.DEFAULT_SCHEMA)
        if schema is None:
            raise ConfigError(f"{type(self).__name__} needs a tool_schema (it has no DEFAULT_SCHEMA)")
        self.tool_schema = validate_schema(schema, f"{type(self).__name__}.tool_schema")
        self.name: str = self.tool_schema["function"]["name"]
        self._instances: dict[str, Any] = {}

    def get_openai_tool_schema(self) -> dict:
        return self.tool_schema

    def required_arguments(self) -> list[str]:
        return list(self.tool_schema["function"].get("parameters", {}).get("required", []))

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = kwargs
        return instance_id

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        raise NotImplementedError

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
