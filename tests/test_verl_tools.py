"""verl 0.9.1's tools, unchanged (issue 40, part 1; verl_agentic/tools/verl_tools.py).

A verl ``BaseTool`` subclass declared in a ``tool_config_path`` YAML and an ``@function_tool`` function
in a ``function_tool_path`` file, both written here and built by verl's own classes, run with a
verl-format dataset row (``extra_info.tools_kwargs``): through ``main_rollout`` (the task's
``tool_config_path`` / ``function_tool_path`` keys) and through the ``task_agent`` loop inside verl
(verl's ``actor_rollout_ref.rollout.multi_turn`` keys, read by verl's ``AgentLoopWorker``). The model is
``ScriptedPolicy`` (its calls are scripted, tokenized by the real Qwen2.5 tokenizer; the chat template
renders the tools), so every call reaches the tools.
"""

from __future__ import annotations

import pytest

from va_testing import QWEN25_DIR, ScriptedPolicy
from va_verl_tools import SCRIPT, TOOL_MODULE, TOOLS_YAML, check_episode, tool_events, verl_rows, verl_tool_files
from verl_agentic.interfaces import ConfigError
from verl_agentic.tools import load_tools


@pytest.fixture
def events():
    return tool_events()

def test_main_rollout_runs_verls_tools_with_the_rows_create_kwargs(events, tiny_qwen_dir, tmp_path):
    from transformers import AutoTokenizer

    from verl_agentic.main_rollout import load_config, run

    verl_rows(tmp_path / "rows.jsonl")
    cfg = load_config([f"model.path={tiny_qwen_dir}", f"data.path={tmp_path / 'rows.jsonl'}", "task_type=tool_agent",
                       f"task.tool_agent.tool_config_path={verl_tool_files() / 'tools.yaml'}",
                       f"task.tool_agent.function_tool_path={verl_tool_files() / 'functions.py'}",
                       "rollout.max_turns=4", "rollout.max_new_tokens=96", "reward.manager=none",
                       "output.quiet=true", f"output.dir={tmp_path / 'out'}"])
    tokenizer = AutoTokenizer.from_pretrained(QWEN25_DIR)
    trajectories, summary = run(cfg, backend=ScriptedPolicy(tokenizer, SCRIPT))
    assert len(trajectories) == 2
    for traj in trajectories:
        assert traj["error"] is None and traj["finish_reason"] == "stop" and traj["num_turns"] == 4
        check_episode(traj, tokenizer, events)
        assert traj["reward"] == pytest.approx(1.75)  # tool_agent's reward: the tools' rewards (no interaction)
    assert summary["drift"]["episodes_ok"] == 2, summary["drift"]  # token-exact against the chat template


def test_bad_tool_files_are_config_errors_naming_file_entry_and_fix(tmp_path):
    verl_tool_files()  # the tool's module on sys.path
    yaml_path = tmp_path / "bad.yaml"
    yaml_path.write_text(f"tools:\n  - class_name: {TOOL_MODULE}.NotATool\n")
    with pytest.raises(ConfigError, match=rf"{yaml_path}: tools\[0\] \(class_name {TOOL_MODULE}.NotATool\): .* is "
                                          r"neither a verl_agentic.tools.BaseTool nor a verl.tools.base_tool.BaseTool "
                                          r"subclass; fix: subclass one of them"):
        load_tools(None, tool_config_path=yaml_path)
    yaml_path.write_text("tools:\n  - class_name: no_such_module.Tool\n")
    with pytest.raises(ConfigError, match=rf"{yaml_path}: tools\[0\] \(class_name no_such_module.Tool\): .*cannot be "
                                          r"imported.*; fix: a registered tool name or the dotted import path"):
        load_tools(None, tool_config_path=yaml_path)
    # the same name in the YAML and the function file, and in our own tools
    clash = tmp_path / "clash.yaml"
    clash.write_text(TOOLS_YAML.replace("name: lookup", "name: va_add_numbers"))
    with pytest.raises(ConfigError, match=rf"tool name 'va_add_numbers' is declared twice: by {clash}: tools\[0\] "
                                          rf"\(class_name {TOOL_MODULE}.LookupTool\) and by @function_tool "
                                          r"va_add_numbers in .*functions.py; fix: rename one"):
        load_tools(None, tool_config_path=clash, function_tool_path=verl_tool_files() / "functions.py")
    ours = [{"class_name": "calculator", "tool_schema": {"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}}]
    with pytest.raises(ConfigError, match=r"tool name 'lookup' is declared twice: by tools\[0\] \(class_name "
                                          rf"calculator\) and by {verl_tool_files() / 'tools.yaml'}: tools\[0\]"):
        load_tools(ours, tool_config_path=verl_tool_files() / "tools.yaml")
    missing = tmp_path / "nope.py"
    with pytest.raises(ConfigError, match=rf"function_tool_path '{missing}' does not exist"):
        load_tools(None, function_tool_path=missing)
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    with pytest.raises(ConfigError, match=rf"function_tool_path '{broken}': loading it raised ModuleNotFoundError"):
        load_tools(None, function_tool_path=broken)


def test_the_task_config_checks_the_files_before_any_model_loads(tmp_path):
    verl_tool_files()
    from verl_agentic.tasks.gsm8k.task import Gsm8kConfig
    from verl_agentic.tasks.tool_agent import ToolAgentConfig

    bad = tmp_path / "bad.yaml"
    bad.write_text(f"tools:\n  - class_name: {TOOL_MODULE}.NotATool\n")
    with pytest.raises(ConfigError, match=rf"{bad}: tools\[0\]"):
        ToolAgentConfig.from_dict({"tool_config_path": str(bad)})
    # gsm8k takes the keys too, and runs as tool_agent with them
    cfg = Gsm8kConfig.from_dict({"function_tool_path": str(verl_tool_files() / "functions.py")})
    assert cfg.tool_agent_config() is not None
