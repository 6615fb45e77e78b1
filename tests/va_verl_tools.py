"""verl 0.9.1's tools for the tests (tests/test_verl_tools.py, tests/test_verl_agent_loop.py): a verl
``BaseTool`` subclass in a ``tool_config_path`` YAML and an ``@function_tool`` function in a
``function_tool_path`` file, the verl-format rows that use them, the scripted calls, and the checks of an
episode that made them."""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from verl.tools.function_tool import get_function_tool

TOOL_MODULE = "va_verl_lookup_tool"
TOOL_MODULE_SOURCE = '''
import json

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

EVENTS = []  # (method, instance_id, what it got), in call order


def _event(tool, *event):
    """Record a call: in EVENTS, and as a JSON line in config's events_file (set: another process runs it)."""
    EVENTS.append(event)
    if tool.config.get("events_file"):
        with open(tool.config["events_file"], "a") as f:
            f.write(json.dumps(event) + "\\n")


class LookupTool(BaseTool):
    """Answers from the secret its episode was created with; an image and a crash on request."""

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.secrets = {}

    async def create(self, instance_id=None, **kwargs):
        # as verl 0.9.1's tool_agent calls it: create(create_kwargs={...}); older verl rollouts spread the keys
        # (create(instance_id, **create_kwargs)), and task_agent passes both forms
        create_kwargs = kwargs.pop("create_kwargs")
        if kwargs != create_kwargs:
            raise TypeError(f"the spread keys {kwargs} differ from create_kwargs {create_kwargs}")
        instance_id, response = await super().create(instance_id)
        _event(self, "create", instance_id, create_kwargs)
        self.secrets[instance_id] = create_kwargs["secret"]
        return instance_id, response

    async def execute(self, instance_id, parameters, **kwargs):
        _event(self, "execute", instance_id, parameters)
        if parameters["key"] == "picture":
            return ToolResponse(text="a cat", image=["<an image>"]), 0.0, {}
        if parameters["key"] == "boom":
            raise RuntimeError("the lookup service is down")
        return ToolResponse(text=f"{self.config['prefix']}{self.secrets[instance_id]}"), 0.25, {"hits": 1}

    async def calc_reward(self, instance_id, **kwargs):
        _event(self, "calc_reward", instance_id, None)
        return 0.5

    async def release(self, instance_id, **kwargs):
        _event(self, "release", instance_id, None)
        del self.secrets[instance_id]


class NotATool:
    pass
'''
TOOLS_YAML = f"""
tools:
  - class_name: {TOOL_MODULE}.LookupTool
    config: {{type: native, prefix: "secret="}}
    tool_schema:
      type: function
      function:
        name: lookup
        description: Look a key up.
        parameters:
          type: object
          properties:
            key: {{type: string, description: the key}}
          required: [key]
"""
FUNCTIONS_SOURCE = '''
from verl.tools.function_tool import function_tool


@function_tool
def va_add_numbers(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return str(a + b), 1.0, {"added": 1}
'''

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
SCRIPT = [
    CALL.format(name="lookup", args='{"key": "secret"}') + "\n" + CALL.format(name="va_add_numbers", args='{"a": 2, "b": 3}'),
    CALL.format(name="lookup", args='{"key": "picture"}'),
    CALL.format(name="lookup", args='{"key": "boom"}'),
    "The answer is 5.",
]
SECRETS = ["s-zero", "s-one"]


def write_tool_files(root: Path, events_file: str = "") -> None:
    """The tool's module, its YAML (the tool logs its calls to ``events_file`` when set) and the function file."""
    (root / f"{TOOL_MODULE}.py").write_text(TOOL_MODULE_SOURCE)
    config = f'{{type: native, prefix: "secret=", events_file: "{events_file}"}}'
    (root / "tools.yaml").write_text(TOOLS_YAML.replace('{type: native, prefix: "secret="}', config))
    (root / "functions.py").write_text(FUNCTIONS_SOURCE)


@functools.lru_cache(maxsize=None)
def verl_tool_files() -> Path:
    """The YAML, the function file and the tool's module (put on sys.path), written once per process:
    verl's function-tool registry is global and refuses a second function of the same name."""
    root = Path(tempfile.mkdtemp(prefix="va_verl_tools_"))
    atexit.register(shutil.rmtree, root, True)
    write_tool_files(root)
    sys.path.insert(0, str(root))
    return root


def tool_events() -> list:
    """The tool's calls so far (cleared): ``(method, instance_id, what it got)``."""
    verl_tool_files()
    events = importlib.import_module(TOOL_MODULE).EVENTS
    events.clear()
    return events


def verl_rows(path) -> None:
    """Two rows as verl's preprocessors write them, each with its tool's create_kwargs."""
    with open(path, "w") as f:
        for i, secret in enumerate(SECRETS):
            f.write(json.dumps({
                "data_source": "va/lookup", "ability": "tools", "reward_model": {"style": "rule", "ground_truth": "5"},
                "prompt": [{"role": "user", "content": f"Question {i}: what is 2 + 3? Use the tools."}],
                "extra_info": {"index": i, "tools_kwargs": {"lookup": {"create_kwargs": {"secret": secret}}}},
            }) + "\n")


def rendered_tools(prompt_text: str) -> dict[str, dict]:
    """The tool schemas the chat template rendered into the prompt (Qwen2.5: JSON lines in <tools>)."""
    block = re.search(r"<tools>\n(.*?)\n</tools>", prompt_text, re.S)
    assert block, prompt_text
    schemas = [json.loads(line) for line in block.group(1).splitlines()]
    return {s["function"]["name"]: s for s in schemas}


def check_episode(traj: dict, tokenizer, events: list) -> None:
    """One scripted episode: the tools in its prompt, the calls' results, the life cycle, the rewards."""
    tools = rendered_tools(tokenizer.decode(traj["prompt_ids"]))
    assert sorted(tools) == ["lookup", "va_add_numbers"]
    assert tools["lookup"]["function"]["parameters"]["required"] == ["key"]
    assert tools["va_add_numbers"] == get_function_tool("va_add_numbers").tool_schema.model_dump(
        exclude_unset=True, exclude_none=True)  # verl's schema, from the docstring and type hints
    secret = SECRETS[traj["index"]]
    answers = [m["content"] for m in traj["messages"] if m["role"] == "tool"]
    assert answers[:2] == [f"secret={secret}", "5"]
    assert "returned image content, but the model is text-only" in answers[2]
    assert answers[3] == "Error: lookup raised RuntimeError: the lookup service is down"
    m = traj["metrics"]
    assert (m["tool_calls"], m["tool_ok"], m["tool_error"]) == (4, 2, 2)
    assert m["tool_reward"] == pytest.approx(0.25 + 1.0 + 0.5)  # execute's, the function's, calc_reward's
    mine = [e for e in events if e[0] == "create" and e[2] == {"secret": secret}]
    assert len(mine) == 1, events
    instance = mine[0][1]
    lifecycle = [(e[0], e[2]) for e in events if e[1] == instance]
    assert lifecycle == [("create", {"secret": secret}), ("execute", {"key": "secret"}), ("execute", {"key": "picture"}),
                         ("execute", {"key": "boom"}), ("calc_reward", None), ("release", None)]
