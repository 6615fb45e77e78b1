"""verl 0.9.1's tools, unchanged (issue 40, part 1; verl_agentic/tools/verl_tools.py).

A verl ``BaseTool`` subclass declared in a ``tool_config_path`` YAML and an ``@function_tool`` function
in a ``function_tool_path`` file, both written here and built by verl's own classes, run with a
verl-format dataset row (``extra_info.tools_kwargs``): through ``main_rollout`` (the task's
``tool_config_path`` / ``function_tool_path`` keys) and through the ``task_agent`` loop inside verl
(verl's ``actor_rollout_ref.rollout.multi_turn`` keys: tests/test_verl_agent_loop.py, and one step of verl's
trainer here, marked ``slow``). The model is
``ScriptedPolicy`` (its calls are scripted, tokenized by the real Qwen2.5 tokenizer; the chat template
renders the tools), so every call reaches the tools.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from va_testing import QWEN25_DIR, ScriptedPolicy
from va_verl_tools import (
    SCRIPT,
    SECRETS,
    TOOL_MODULE,
    TOOLS_YAML,
    check_episode,
    rendered_tools,
    tool_events,
    verl_rows,
    verl_tool_files,
    write_tool_files,
)
from verl_agentic.interfaces import ConfigError
from verl_agentic.tools import load_tools


@pytest.fixture
def events():
    return tool_events()


def test_main_rollout_runs_verls_tools_with_the_rows_create_kwargs(events, tiny_qwen_dir, tmp_path):
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
    with pytest.raises(ConfigError, match=r"^task.gsm8k.max_consecutive_invalid_tool_calls must be"):  # checked as its own
        Gsm8kConfig.from_dict({"function_tool_path": str(verl_tool_files() / "functions.py"),
                               "max_consecutive_invalid_tool_calls": -1})


def test_in_verl_a_task_without_tools_refuses_verls_tool_keys_by_name():
    from verl_agentic.rollout.task_spec import TASKS
    from verl_agentic.verl_plugin.agent_loop import check_task_config

    with pytest.raises(ConfigError, match=r"agentic.task.dr: unknown task.dr keys \['tool_config_path'\].*\("
                                          r"tool_config_path: from verl's actor_rollout_ref.rollout.multi_turn keys; "
                                          r"only tasks with tools take them"):
        check_task_config("dr", TASKS.get("dr"), {"index": "x.db", "tool_config_path": "tools.yaml"})


def test_the_hint_follows_an_unknown_keys_error_not_its_wording(tmp_path):
    """The hint comes with ``UnknownKeysError`` (``check_keys``'s) whatever it says; a task that takes the keys
    gets none when one of their files fails, though its message names the key."""
    import pickle
    import types

    from verl_agentic.interfaces import UnknownKeysError
    from verl_agentic.rollout.task_spec import TASKS
    from verl_agentic.verl_plugin.agent_loop import check_task_config

    def refuse(config):
        raise UnknownKeysError("this task runs no tools", ["function_tool_path"])

    with pytest.raises(ConfigError, match=r"^agentic.task.mine: this task runs no tools \(function_tool_path: from "
                                          r"verl's actor_rollout_ref.rollout.multi_turn keys; only tasks with tools"):
        check_task_config("mine", types.SimpleNamespace(check_config=refuse), {"function_tool_path": "f.py"})
    missing = tmp_path / "no_such_tools.py"
    with pytest.raises(ConfigError, match=rf"^agentic.task.gsm8k: function_tool_path '{missing}' does not exist") as e:
        check_task_config("gsm8k", TASKS.get("gsm8k"), {"function_tool_path": str(missing)})
    assert "only tasks with tools" not in str(e.value)
    copied = pickle.loads(pickle.dumps(UnknownKeysError("m", ["b", "a"])))  # crosses Ray's process boundaries
    assert str(copied) == "m" and copied.unknown == ["a", "b"]


@pytest.mark.serial  # verl's trainer (Ray)
@pytest.mark.slow
def test_one_step_of_verls_trainer_with_verls_tool_keys(tiny_qwen_dir, tmp_path):
    """verl's trainer on the CPU (``DEVICE=cpu scripts/run_gsm8k_multiturn.sh``: Ray, FSDP2, our ``hf``
    rollout), one GRPO step of the 2 verl-format rows x 2 samples, with verl's own keys, and two MCP
    servers' tools besides (``+agentic.task.tool_agent.tools``: tests/va_mcp_server.py over stdio, started
    by the agent-loop worker, and over streamable HTTP, started here). The tiny random model calls no
    tool, so this checks what every episode does with them in the agent-loop worker (the tool logs its
    calls to a file): the tools rendered in the prompt, ``create`` with the row's create_kwargs,
    ``calc_reward`` and ``release``; the MCP tools in the prompt (both servers listed), the stdio server
    started by the worker's process. About 2 minutes on 2 cores."""
    import pandas as pd

    from test_mcp_tools import free_port, start_http_server, stdio_entry
    from va_testing import REPO
    from va_user_tasks import user_env

    folder = tmp_path / "project"  # the tool's module comes in through the working directory, as a user's
    folder.mkdir()
    events_file = tmp_path / "events.jsonl"
    write_tool_files(folder, str(events_file))
    verl_rows(tmp_path / "rows.jsonl")
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        pd.read_json(tmp_path / "rows.jsonl", lines=True).to_parquet(data / f"{split}.parquet")
    port, http_events, stdio_events = free_port(), tmp_path / "http_events.jsonl", tmp_path / "stdio_events.jsonl"
    (folder / "mcp.yaml").write_text(json.dumps({"tools": [
        stdio_entry(stdio_events, tools=["stdio_lookup"]), {"mcp": {"url": f"http://127.0.0.1:{port}/mcp",
                                                                    "tools": ["http_add"]}}]}))
    http_server = start_http_server(port, http_events)
    out = tmp_path / "verl_out"
    env = user_env(DEVICE="cpu", OUT=str(out), DATA_DIR=str(data), MODEL_PATH=str(tiny_qwen_dir),
                   PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "run_gsm8k_multiturn.sh"), "agentic.task_type=tool_agent",
             "agentic.max_new_tokens=16", f"actor_rollout_ref.rollout.multi_turn.tool_config_path={folder / 'tools.yaml'}",
             f"actor_rollout_ref.rollout.multi_turn.function_tool_path={folder / 'functions.py'}",
             "data.max_prompt_length=1024", "data.max_response_length=128", "data.train_batch_size=2",
             "data.shuffle=false", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "trainer.total_training_steps=1",
             "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
             f"+agentic.task.tool_agent.tools={folder / 'mcp.yaml'}"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=1500)
    finally:
        http_server.kill()
        http_server.wait()
    (tmp_path / "verl.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "are not used" not in proc.stdout + proc.stderr

    episodes = [json.loads(x) for x in (out / "rollouts" / "step_000000.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and all(t["task_type"] == "tool_agent" for t in episodes)
    tokenizer = AutoTokenizer.from_pretrained(QWEN25_DIR)
    for t in episodes:
        assert sorted(rendered_tools(tokenizer.decode(t["prompt_ids"]))) == ["http_add", "lookup", "stdio_lookup",
                                                                              "va_add_numbers"]
    events = [json.loads(x) for x in events_file.read_text().splitlines()]
    created = {e[1]: e[2]["secret"] for e in events if e[0] == "create"}
    assert sorted(created.values()) == sorted(SECRETS * 2)  # each episode its own row's create_kwargs
    for method in ("calc_reward", "release"):
        assert sorted(e[1] for e in events if e[0] == method) == sorted(created), (method, events)
    starts = [e for e in map(json.loads, stdio_events.read_text().splitlines()) if e[1] == "start"]
    assert starts and all(pid != os.getpid() for pid, *_ in starts), starts  # started by verl's worker process


# --------------------------------------------------------------------------------------------
# the preflight in verl's trainer (verl_plugin/preflight.py): the same checks before any worker starts


def test_the_preflight_checks_what_the_workers_would(tmp_path, tiny_qwen_dir):
    import types

    from test_verl_agent_loop import agent_config, verl_config
    from verl_agentic.verl_plugin import preflight

    verl_tool_files()
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"tools:\n  - class_name: {TOOL_MODULE}.NotATool\n")
    keys = ("+agentic.task_type=tool_agent", f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}")
    with pytest.raises(ConfigError, match=rf"^agentic.task.tool_agent: {bad}: tools\[0\] \(class_name "
                                          rf"{TOOL_MODULE}.NotATool\): .* is neither"):
        preflight.check(agent_config(tiny_qwen_dir, *keys))
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text(json.dumps({"tools": [{"mcp": {"command": [sys.executable, "-c", "raise SystemExit('no server')"]}}]}))
    with pytest.raises(ConfigError, match=rf"agentic.task.tool_agent: {mcp}: tools\[0\]: MCP server .* did not start"):
        preflight.check(agent_config(tiny_qwen_dir, "+agentic.task_type=tool_agent",
                                     f"+agentic.task.tool_agent.tools={mcp}"))
    with pytest.raises(ConfigError, match=r"^agentic.task_type: unknown task_type 'no_such_task'; registered: .*gsm8k"):
        preflight.check(agent_config(tiny_qwen_dir, "+agentic.task_type=no_such_task"))
    with pytest.raises(ConfigError, match=r"agentic.task.gsm8k: unknown task.gsm8k keys \['feedbak'\]"):
        preflight.check(agent_config(tiny_qwen_dir, "+agentic.task.gsm8k.feedbak=retry"))  # rows name their task
    preflight.check(agent_config(tiny_qwen_dir, "+agentic.task_type=tool_agent",  # verl's own files: fine
                                 f"actor_rollout_ref.rollout.multi_turn.tool_config_path={verl_tool_files() / 'tools.yaml'}"))
    preflight.check(verl_config(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}"))  # not task_agent's

    class PPOTrainer:  # the wrap, on a stand-in for verl's trainer_base module (the real one: the slow test below)
        calls = []

        def __init__(self, config):
            self.config = config

        def init(self):
            self.calls.append("init")

    module = types.SimpleNamespace(PPOTrainer=PPOTrainer)
    preflight.install(module)
    preflight.install(module)  # once per process
    PPOTrainer(agent_config(tiny_qwen_dir, "+agentic.task_type=tool_agent")).init()
    assert PPOTrainer.calls == ["init"]
    with pytest.raises(ConfigError, match=rf"{bad}: tools\[0\]"):
        PPOTrainer(agent_config(tiny_qwen_dir, *keys)).init()
    assert PPOTrainer.calls == ["init"]  # verl's init never ran


@pytest.mark.serial  # verl's trainer (Ray)
@pytest.mark.slow
def test_verls_trainer_stops_on_a_bad_tool_file_before_any_worker_starts(tiny_qwen_dir, tmp_path):
    """verl's trainer on the CPU with a tool_config_path whose class is not a tool: the preflight in
    ``PPOTrainer.init`` stops the run with the ConfigError that names the file and the entry, before verl's
    init builds any worker (verl's own loader would fail in the agent-loop worker, after the models load)."""
    import pandas as pd

    from va_testing import REPO
    from va_user_tasks import user_env

    folder = tmp_path / "project"
    folder.mkdir()
    write_tool_files(folder)
    (folder / "bad.yaml").write_text(f"tools:\n  - class_name: {TOOL_MODULE}.NotATool\n")
    verl_rows(tmp_path / "rows.jsonl")
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        pd.read_json(tmp_path / "rows.jsonl", lines=True).to_parquet(data / f"{split}.parquet")
    env = user_env(DEVICE="cpu", OUT=str(tmp_path / "out"), DATA_DIR=str(data), MODEL_PATH=str(tiny_qwen_dir),
                   PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_gsm8k_multiturn.sh"), "agentic.task_type=tool_agent",
         f"actor_rollout_ref.rollout.multi_turn.tool_config_path={folder / 'bad.yaml'}", "data.train_batch_size=2",
         "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "trainer.total_training_steps=1", "trainer.val_before_train=false"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (f"ConfigError: agentic.task.tool_agent: {folder / 'bad.yaml'}: tools[0] (class_name "
            f"{TOOL_MODULE}.NotATool)") in output, output[-6000:]
    assert "verl_plugin/preflight.py" in output  # raised by the wrap of PPOTrainer.init, before verl's init ran
    assert "AgentLoopWorker" not in output and "init_model" not in output, output[-6000:]
