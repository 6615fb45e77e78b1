"""Tool registry: BaseTool schema checks, @tool functions (schema from signature + docstring), YAML."""

import asyncio
from typing import Literal, Optional

import pytest

from verl_agentic.interfaces import ConfigError
from verl_agentic.tools import BaseTool, ToolResult, load_tools, register_tool_class, tool
from verl_agentic.tools.registry import FUNCTION_TOOLS, TOOL_CLASSES, function_schema


def test_function_schema_from_signature_and_docstring():
    def search(query: str, k: int = 3, mode: Literal["bm25", "exact"] = "bm25", tags: Optional[list[str]] = None):
        """Search the corpus.

        Args:
            query: what to look for
            k: how many results
                (at most 10)
        """

    s = function_schema(search)["function"]
    assert s["name"] == "search" and s["description"] == "Search the corpus."
    p = s["parameters"]
    assert p["required"] == ["query"]
    assert p["properties"]["query"] == {"type": "string", "description": "what to look for"}
    assert p["properties"]["k"] == {"type": "integer", "description": "how many results (at most 10)"}
    assert p["properties"]["mode"] == {"enum": ["bm25", "exact"]}
    assert p["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}


def test_tool_decorator_executes_sync_and_async_and_checks_arguments():
    @tool
    def test_add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool(name="test_async_upper")
    async def upper(text: str) -> str:
        return text.upper()

    try:
        t = FUNCTION_TOOLS["test_add"]
        assert asyncio.run(t.execute("i", {"a": 2, "b": 3})) == ToolResult("5")
        bad = asyncio.run(t.execute("i", {"a": 2, "c": 3}))
        assert bad.status == "error" and "unknown arguments ['c']" in bad.text and "missing arguments ['b']" in bad.text
        assert asyncio.run(FUNCTION_TOOLS["test_async_upper"].execute("i", {"text": "ab"})).text == "AB"
        assert [x.name for x in load_tools([{"function": "test_add"}])] == ["test_add"]
    finally:
        FUNCTION_TOOLS.unregister("test_add")
        FUNCTION_TOOLS.unregister("test_async_upper")


def test_yaml_tools_and_errors(tmp_path):
    @register_tool_class("test_echo_tool")
    class EchoTool(BaseTool):
        DEFAULT_SCHEMA = {"type": "function", "function": {
            "name": "echo", "description": "Echo.", "parameters": {"type": "object", "properties": {
                "text": {"type": "string"}}, "required": ["text"]}}}

        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResult(self.config.get("prefix", "") + parameters["text"])

    try:
        path = tmp_path / "tools.yaml"
        path.write_text("tools:\n  - class_name: test_echo_tool\n    config: {prefix: '> '}\n")
        (t,) = load_tools(str(path))
        assert t.name == "echo" and asyncio.run(t.execute("i", {"text": "hi"})).text == "> hi"
        with pytest.raises(ConfigError, match="tool name 'echo' is declared twice: by tools\\[0\\] .* and by tools\\[1\\]"):
            load_tools(["test_echo_tool", "test_echo_tool"])
        with pytest.raises(ConfigError, match="unknown tool class 'nope'; registered: .*test_echo_tool"):
            load_tools(["nope"])
        with pytest.raises(ConfigError, match="cannot be imported"):
            load_tools([{"class_name": "no.such.Tool"}])
        with pytest.raises(ConfigError, match="tools\\[0\\] \\(class_name test_echo_tool\\): .*function.name"):
            load_tools([{"class_name": "test_echo_tool", "tool_schema": {"type": "function", "function": {}}}])
        with pytest.raises(ConfigError, match="does not exist"):
            load_tools(str(tmp_path / "none.yaml"))
    finally:
        TOOL_CLASSES.unregister("test_echo_tool")


def test_tool_result_coerces_verl_style_returns():
    assert ToolResult.coerce(("out", 0.5, {"m": 1})) == ToolResult("out", 0.5, {"m": 1})
    assert ToolResult.coerce("x") == ToolResult("x")


def test_example_configs_load():
    from verl_agentic.interactions import load_interactions

    from va_testing import REPO

    tools = load_tools(str(REPO / "examples/gsm8k_multiturn/tools.yaml"))
    assert [t.name for t in tools] == ["python", "calculator"]
    inter = load_interactions(str(REPO / "examples/gsm8k_multiturn/interaction.yaml"))
    assert inter.names() == ["gsm8k", "verify"] and inter.select({})[0] == "gsm8k"
