"""verl 0.9.1's tools, unchanged, as our tools.

verl declares tools two ways (``actor_rollout_ref.rollout.multi_turn.*``), and both load here:

- ``tool_config_path``: a YAML of ``verl.tools.base_tool.BaseTool`` subclasses
  (``tools: [{class_name, config, tool_schema}]``, what verl's ``initialize_tools_from_config``
  reads). ``load_tools`` (``tools/registry.py``) reads the file; an entry whose class is verl's is
  built the way verl builds it (``config`` as a dict, ``tool_schema`` as verl's
  ``OpenAIFunctionToolSchema``) and wrapped in a ``VerlTool``.
- ``function_tool_path``: a Python file of ``@verl.tools.function_tool.function_tool`` functions,
  loaded by verl's own ``load_function_tools_from_path`` and wrapped in ``VerlFunctionTool``.

The wrappers give them our ``BaseTool`` life cycle, which ``ToolRunner`` runs once per episode::

    create(instance_id, create_kwargs=ck, **ck)  # ck: the row's extra_info.tools_kwargs.<tool>.create_kwargs,
                                           # in both forms verl has passed it (0.9.1's tool_agent: the keyword)
    execute(instance_id, parameters)       # -> verl's (ToolResponse, reward, metrics) -> ToolResult
    calc_reward(instance_id)               # at the end of the episode
    release(instance_id)                   # always, also when the episode fails

(verl's own ``tool_agent`` loop creates and releases a ``BaseTool`` around every call, and never calls
``calc_reward``; here one instance lives for the episode, so state may persist across its calls.)
Function tools are stateless in verl and here: no ``create_kwargs``. The ``ToolResponse`` of ``create``
is dropped, as verl's loop drops it. A ``ToolResponse`` with an image or video is an error of that call
(status ``error``, counted in ``tool_error``): every model here is text-only.

verl is imported only by the functions that need it (``import verl`` takes seconds, and most runs have
no verl tools); a class is recognised as verl's from ``sys.modules``, where importing it put verl.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.tools.base import BaseTool, ToolResult

VERL_BASE_TOOL = ("verl.tools.base_tool", "BaseTool")


def is_verl_tool_class(cls: Any) -> bool:
    """``cls`` subclasses verl's ``BaseTool`` (a class that does has imported verl already)."""
    module = sys.modules.get(VERL_BASE_TOOL[0])
    verl_base = getattr(module, VERL_BASE_TOOL[1], None)
    return verl_base is not None and isinstance(cls, type) and issubclass(cls, verl_base)


def verl_response_result(name: str, response: Any, reward: Any = 0.0, metrics: Any = None) -> ToolResult:
    """verl's ``(ToolResponse, reward, metrics)`` as a ``ToolResult``; an image or video is an error."""
    media = [kind for kind in ("image", "video") if getattr(response, kind, None)]
    if media:
        return ToolResult(f"Error: tool {name!r} returned {' and '.join(media)} content, but the model is text-only; "
                          "return text from this tool", status="error")
    text = response.text if hasattr(response, "text") else str(response)
    return ToolResult(text or "", float(reward or 0.0), dict(metrics or {}))


class VerlTool(BaseTool):
    """A verl ``BaseTool`` instance with our per-episode life cycle (see the module docstring)."""

    def __init__(self, tool: Any):
        self.tool = tool
        super().__init__(tool.config, tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True))

    async def create(self, instance_id: Optional[str] = None, **create_kwargs: Any) -> str:
        # both forms verl has used: create(create_kwargs={...}) (0.9.1's tool_agent) and the keys spread
        # (create(instance_id, **create_kwargs), its older rollouts and BaseTool's docstring)
        both = {} if {"create_kwargs", "instance_id"} & set(create_kwargs) else dict(create_kwargs)
        instance_id, _response = await self.tool.create(instance_id, create_kwargs=dict(create_kwargs), **both)
        return instance_id

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        response, reward, metrics = await self.tool.execute(instance_id, parameters)
        return verl_response_result(self.name, response, reward, metrics)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return float(await self.tool.calc_reward(instance_id) or 0.0)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        await self.tool.release(instance_id)


class VerlFunctionTool(BaseTool):
    """A verl ``FunctionTool`` (an ``@function_tool`` function): stateless, no ``create_kwargs``."""

    def __init__(self, function_tool: Any, source: str):
        self.function_tool = function_tool
        self.source = source
        super().__init__({}, function_tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True))

    async def create(self, instance_id: Optional[str] = None, **create_kwargs: Any) -> str:
        return await super().create(instance_id)  # verl passes function tools no create_kwargs either

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        from verl.tools.function_tool import normalize_function_tool_return  # verl: seconds to import

        response, reward, metrics = normalize_function_tool_return(await self.function_tool.call(parameters))
        return verl_response_result(self.name, response, reward, metrics)


def build_verl_tool(cls: type, config: Any, tool_schema: Any, where: str) -> VerlTool:
    """A verl ``BaseTool`` built as verl's ``initialize_tools_from_config`` builds it, wrapped."""
    from verl.tools.schemas import OpenAIFunctionToolSchema  # verl: seconds to import

    try:
        schema = None if tool_schema is None else OpenAIFunctionToolSchema.model_validate(tool_schema)
    except ValueError as e:
        raise ConfigError(f"{where}: its tool_schema is not an OpenAI function schema ({e}); fix: "
                          "{type: function, function: {name, description, parameters}}") from None
    try:
        return VerlTool(cls(config=dict(config or {}), tool_schema=schema))
    except Exception as e:  # a tool's constructor may raise anything; name the entry
        raise ConfigError(f"{where}: {cls.__module__}.{cls.__qualname__}(config, tool_schema) raised "
                          f"{type(e).__name__}: {e}") from e


def load_function_tools(path: str | Path) -> list[VerlFunctionTool]:
    """The ``@function_tool`` functions of the file ``path``, loaded by verl's loader."""
    from verl.tools.function_tool import load_function_tools_from_path  # verl: seconds to import

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"function_tool_path '{path}' does not exist; fix: the path of a Python file of "
                          "@verl.tools.function_tool.function_tool functions")
    try:
        tools = load_function_tools_from_path(str(path))
    except Exception as e:  # the user's file: a syntax error, a failed import, a schema verl cannot build
        raise ConfigError(f"function_tool_path '{path}': loading it raised {type(e).__name__}: {e}") from e
    return [VerlFunctionTool(t, f"@function_tool {t.name} in {path}") for t in tools]
