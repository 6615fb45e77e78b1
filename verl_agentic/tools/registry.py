"""Tool registry: tool classes by name, tools from YAML, and tools from plain Python functions.

YAML (the format of verl's ``tool_config_path``; ``class_name`` is a registered name such as
``python`` / ``calculator`` or the dotted import path of a ``BaseTool`` subclass, ours or verl's:
``tools/verl_tools.py`` wraps verl's)::

    tools:
      - class_name: python
        config: {wall_timeout_s: 10}
      - class_name: my_pkg.tools.SearchTool
        config: {index: data/index.db}
        tool_schema: {type: function, function: {name: search, description: ..., parameters: {...}}}
      - mcp: {command: [python, -m, my_server]}    # an MCP server's tools (tools/mcp_tools.py)

Plain functions become tools with a schema built from the signature and docstring::

    @tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first number
            b: the second number
        \"\"\"
        return a + b
"""

from __future__ import annotations

import asyncio
import inspect
import re
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Union

from verl_agentic.interfaces import ConfigError
from verl_agentic.registry import Registry
from verl_agentic.tools.base import BaseTool, ToolResult
from verl_agentic.tools.verl_tools import build_verl_tool, is_verl_tool_class, load_function_tools

TOOL_CLASSES: Registry[type] = Registry("tool class", "verl_agentic.tools")
FUNCTION_TOOLS: Registry["FunctionTool"] = Registry("function tool")

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


def register_tool_class(name: str):
    """Class decorator: ``@register_tool_class("search") class SearchTool(BaseTool): ...``."""
    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
            raise ConfigError(f"@register_tool_class({name!r}) needs a BaseTool subclass, got {cls!r}")
        TOOL_CLASSES.register(name, cls)
        return cls
    return decorator


def _json_type(annotation: Any) -> dict:
    origin = typing.get_origin(annotation)
    if origin is Union:  # Optional[X]
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin in (list, tuple):
        item = typing.get_args(annotation)
        return {"type": "array", **({"items": _json_type(item[0])} if item else {})}
    if origin is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    return {"type": _JSON_TYPES[annotation]} if annotation in _JSON_TYPES else {}


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\nArgs:")
    params: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        m = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if m and (current is None or len(line) - len(line.lstrip()) <= 8):
            current = m.group(1)
            params[current] = m.group(2).strip()
        elif current and line.strip():
            params[current] += " " + line.strip()
        elif not line.strip() and params:
            current = None
    return " ".join(head.split("\n\n")[0].split()), params


def function_schema(fn: Callable, name: Optional[str] = None, description: Optional[str] = None) -> dict:
    """An OpenAI function schema from ``fn``'s signature (type hints) and docstring."""
    desc, param_docs = _docstring_parts(fn.__doc__ or "")
    hints = typing.get_type_hints(fn)
    props, required = {}, []
    for pname, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(pname, Any))
        if pname in param_docs:
            prop["description"] = param_docs[pname]
        props[pname] = prop
        if p.default is p.empty:
            required.append(pname)
    return {"type": "function", "function": {
        "name": name or fn.__name__, "description": description or desc or fn.__name__,
        "parameters": {"type": "object", "properties": props, "required": required}}}


class FunctionTool(BaseTool):
    """A plain (sync or async) Python function as a tool; sync ones run in a thread."""

    def __init__(self, fn: Callable, name: Optional[str] = None, description: Optional[str] = None,
                 config: Optional[dict] = None):
        self.fn = fn
        super().__init__(config, function_schema(fn, name, description))

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        props = self.tool_schema["function"]["parameters"]["properties"]
        unknown = set(parameters) - set(props)
        missing = [p for p in self.required_arguments() if p not in parameters]
        if unknown or missing:
            return ToolResult(f"Error: {self.name}() " + "; ".join(
                ([f"unknown arguments {sorted(unknown)}"] if unknown else [])
                + ([f"missing arguments {missing}"] if missing else [])) + f". Expected: {sorted(props)}",
                status="error")
        if inspect.iscoroutinefunction(self.fn):
            out = await self.fn(**parameters)
        else:
            out = await asyncio.to_thread(self.fn, **parameters)
        return ToolResult.coerce(out if isinstance(out, (ToolResult, tuple)) else str(out))


def tool(fn: Optional[Callable] = None, *, name: Optional[str] = None, description: Optional[str] = None):
    """Decorator: register a plain function as a tool (``@tool`` or ``@tool(name="...")``)."""
    def decorator(f: Callable) -> Callable:
        ft = FunctionTool(f, name, description)
        FUNCTION_TOOLS.register(ft.name, ft, source=f"{f.__module__}.{f.__qualname__}")
        f.tool = ft
        return f
    return decorator(fn) if fn is not None else decorator


def load_tools(config: Union[str, Path, dict, list, None], *, tool_config_path: Union[str, Path, None] = None,
               function_tool_path: Union[str, Path, None] = None) -> list[BaseTool]:
    """Tools from ``config`` (a YAML file path, a ``{"tools": [...]}`` dict or the list itself), verl's
    ``tool_config_path`` (a YAML file of the same format) and verl's ``function_tool_path`` (a Python file
    of ``@function_tool`` functions; ``tools/verl_tools.py``).

    Each entry: ``{class_name, config?, tool_schema?}`` (the class ours or verl's),
    ``{function: name}`` for a function registered with ``@tool``, or ``{mcp: {command | url, ...}}`` for
    the tools of an MCP server (``tools/mcp_tools.py``). Tool names must be unique across all of them: a
    clash is a ``ConfigError`` naming both declarations.
    """
    declared = _tools_from_entries(config) + _tools_from_entries(tool_config_path)
    if function_tool_path is not None:
        declared += [(t, t.source) for t in load_function_tools(function_tool_path)]
    first: dict[str, str] = {}
    for t, where in declared:
        if t.name in first:
            raise ConfigError(f"tool name {t.name!r} is declared twice: by {first[t.name]} and by {where}; fix: "
                              "rename one (tool_schema.function.name in a YAML, @function_tool(\"new_name\") or "
                              "@tool(name=...) for a function)")
        first[t.name] = where
    return [t for t, _ in declared]


def _tools_from_entries(config: Union[str, Path, dict, list, None]) -> list[tuple[BaseTool, str]]:
    """(tool, where it is declared) for each entry of a tools YAML file, dict or list."""
    if config is None:
        return []
    prefix = ""
    if isinstance(config, (str, Path)):
        import yaml

        path = Path(config)
        if not path.exists():
            raise ConfigError(f"tools config '{path}' does not exist")
        config, prefix = yaml.safe_load(path.read_text()) or {}, f"{path}: "
    entries = config.get("tools", []) if isinstance(config, dict) else config
    if not isinstance(entries, list):
        raise ConfigError(f"{prefix or 'tools config: '}'tools' must be a list, got {type(entries).__name__}")
    return [declared for i, entry in enumerate(entries) for declared in _tools_from_entry(entry, f"{prefix}tools[{i}]")]


def _tools_from_entry(entry: Any, where: str) -> list[tuple[BaseTool, str]]:
    """The tools one entry declares: one, or an MCP server's (``tools/mcp_tools.py``)."""
    if isinstance(entry, dict) and "mcp" in entry:
        if set(entry) != {"mcp"}:
            raise ConfigError(f"{where}: an 'mcp' entry has no other keys (its options go under mcp:), "
                              f"got {sorted(set(entry) - {'mcp'})}")
        from verl_agentic.tools.mcp_tools import load_mcp_tools  # imports the mcp SDK only when named

        return [(t, t.source) for t in load_mcp_tools(entry["mcp"], where)]
    return [_tool_from_entry(entry, where)]


def _tool_from_entry(entry: Any, where: str) -> tuple[BaseTool, str]:
    if isinstance(entry, str):
        entry = {"class_name": entry}
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    if "function" in entry:
        return FUNCTION_TOOLS[entry["function"]], f"{where} (function {entry['function']})"
    unknown = set(entry) - {"class_name", "config", "tool_schema"}
    if unknown or "class_name" not in entry:
        raise ConfigError(f"{where}: needs 'class_name' (and optional 'config', 'tool_schema'); "
                          f"unknown keys {sorted(unknown)}" if unknown else f"{where}: needs 'class_name'")
    name = entry["class_name"]
    where = f"{where} (class_name {name})"
    try:
        cls = TOOL_CLASSES.get_or_import(name)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}; fix: a registered tool name or the dotted import path of a "
                          "BaseTool subclass (ours or verl's), importable in this environment") from None
    if is_verl_tool_class(cls):
        return build_verl_tool(cls, entry.get("config"), entry.get("tool_schema"), where), where
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ConfigError(f"{where}: {name!r} is neither a verl_agentic.tools.BaseTool nor a "
                          "verl.tools.base_tool.BaseTool subclass; fix: subclass one of them")
    try:
        return cls(config=entry.get("config") or {}, tool_schema=entry.get("tool_schema")), where
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e
