"""Tools: ``BaseTool``, the registry (YAML, ``@tool`` functions), parsers, and the episode ``ToolRunner``."""

from verl_agentic.tools.base import BaseTool, ToolResult
from verl_agentic.tools.registry import FUNCTION_TOOLS, TOOL_CLASSES, load_tools, register_tool_class, tool

__all__ = ["BaseTool", "ToolResult", "FUNCTION_TOOLS", "TOOL_CLASSES", "load_tools", "register_tool_class", "tool"]
