"""MCP servers as tools (issue 40, part 2; verl_agentic/tools/mcp_tools.py).

The server is real: tests/va_mcp_server.py, written with the official SDK's server API, started over
stdio by the tools entry or, for streamable HTTP, by the test on a loopback port. The client is the SDK's.
Episodes run through ``ToolRunner`` (what ``tool_agent`` runs), through ``main_rollout`` with the real
Qwen2.5 tokenizer and a scripted policy (every call reaches the server), and inside verl's
``AgentLoopWorker`` (tests/test_verl_agent_loop.py; one step of verl's trainer: tests/test_verl_tools.py).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from va_testing import QWEN25_DIR, ScriptedPolicy
from verl_agentic.interfaces import ConfigError
from verl_agentic.tools import load_tools
from verl_agentic.tools.mcp_tools import close_sessions
from verl_agentic.tools.runner import ToolRunner

SERVER = Path(__file__).with_name("va_mcp_server.py")
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


@pytest.fixture(autouse=True)
def _end_sessions():
    yield
    close_sessions()  # each test's servers end with it (a stdio server exits when its stdin closes)


def stdio_entry(events: Path, **options) -> dict:
    return {"mcp": {"command": [sys.executable, str(SERVER), "stdio", str(events)], **options}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_http_server(port: int, events: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port), str(events)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            assert proc.poll() is None, "the HTTP MCP server exited at start"
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the HTTP MCP server did not listen within 30 s")


@pytest.fixture
def http_server(tmp_path):
    port, events = free_port(), tmp_path / "http_events.jsonl"
    procs = [start_http_server(port, events)]
    yield {"url": f"http://127.0.0.1:{port}/mcp", "port": port, "events": events, "procs": procs}
    for p in procs:
        p.kill()
        p.wait()


def events_of(path: Path) -> list:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def episode(tools, *calls, timeout_s: float = 20.0) -> tuple[list[str], list[str], dict]:
    """One episode's turn of ``calls`` ((name, args) pairs) on a fresh event loop: (texts, statuses, metrics)."""
    async def run():
        runner = ToolRunner(tools, "hermes", call_timeout_s=timeout_s)
        await runner.start()
        try:
            turn = await runner.run_turn("\n".join(CALL.format(name=n, args=json.dumps(a)) for n, a in calls))
        finally:
            await runner.close()
        return [m["content"] for m in turn.messages], [r.status for r in turn.results], runner.metrics()
    return asyncio.run(run())


def test_a_stdio_servers_tools_are_listed_once_and_shared_by_episodes_on_any_loop(tmp_path):
    events = tmp_path / "events.jsonl"
    tools = load_tools([stdio_entry(events)])
    assert [t.name for t in tools] == ["stdio_lookup", "stdio_add", "stdio_pid", "stdio_sleep", "stdio_crash",
                                       "stdio_picture", "stdio_probe"]
    lookup = tools[0].get_openai_tool_schema()["function"]
    assert lookup["description"].startswith("Look a key up in the server's table.")
    assert lookup["parameters"]["required"] == ["key"] and lookup["parameters"]["properties"]["key"]["type"] == "string"

    pids = set()
    for i in range(3):  # three episodes, each on its own event loop; four concurrent calls in one turn
        texts, statuses, metrics = episode(tools, ("stdio_lookup", {"key": f"k{i}"}), ("stdio_add", {"a": i, "b": 2}),
                                           ("stdio_pid", {}), ("stdio_pid", {}))
        assert texts[:2] == [f"stdio:k{i}=2", str(i + 2)] and statuses == ["ok"] * 4
        assert (metrics["tool_calls"], metrics["tool_ok"]) == (4, 4)
        pids |= set(texts[2:])
    starts = [e for e in events_of(events) if e[1] == "start"]
    assert len(starts) == 1 and pids == {str(starts[0][0])}  # one server process answered every episode
    close_sessions()  # what the process does at exit: the server ends with its session
    assert not Path(f"/proc/{starts[0][0]}").exists() or "zombie" in Path(f"/proc/{starts[0][0]}/status").read_text()


def test_a_tools_errors_and_media_are_that_calls_tool_errors(tmp_path):
    tools = load_tools([stdio_entry(tmp_path / "events.jsonl", tools=["stdio_lookup", "stdio_picture"])])
    assert [t.name for t in tools] == ["stdio_lookup", "stdio_picture"]  # mcp.tools picks
    texts, statuses, metrics = episode(tools, ("stdio_lookup", {"key": "boom"}), ("stdio_picture", {}),
                                       ("stdio_lookup", {"key": "fine"}))
    assert statuses == ["error", "error", "ok"] and texts[2] == "stdio:fine=4"
    assert "stdio_lookup" in texts[0]  # the SDK's isError result, as the server sent it
    assert "returned image content, but the model is text-only" in texts[1]
    assert metrics["tool_error"] == 2


def test_a_server_that_dies_gives_the_call_a_tool_error_and_is_started_again(tmp_path):
    events = tmp_path / "events.jsonl"
    tools = load_tools([stdio_entry(events)])
    first = episode(tools, ("stdio_pid", {}))[0][0]
    texts, statuses, metrics = episode(tools, ("stdio_crash", {}))
    assert statuses == ["error"] and metrics["tool_error"] == 1
    assert "closed the connection; it is started again at the next call" in texts[0]
    texts, statuses, _ = episode(tools, ("stdio_pid", {}), ("stdio_lookup", {"key": "again"}))
    assert statuses == ["ok", "ok"] and texts[0] != first and texts[1] == "stdio:again=5"
    assert [e[0] for e in events_of(events) if e[1] == "start"] == [int(first), int(texts[0])]
    assert tools[0].session.starts == 2


def test_a_timeout_is_per_call_and_the_session_goes_on(tmp_path):
    tools = load_tools([stdio_entry(tmp_path / "events.jsonl")])
    pid = episode(tools, ("stdio_pid", {}))[0][0]
    t0 = time.monotonic()
    texts, statuses, metrics = episode(tools, ("stdio_sleep", {"seconds": 30}), ("stdio_add", {"a": 1, "b": 1}),
                                       timeout_s=1.5)
    assert time.monotonic() - t0 < 10
    assert statuses == ["timeout", "ok"] and texts == ["Error: stdio_sleep timed out after 1.5 s", "2"]
    assert metrics["tool_timeout"] == 1
    assert episode(tools, ("stdio_pid", {}))[0] == [pid]  # the same server, still serving


def test_a_streamable_http_server_and_its_restart(http_server):
    tools = load_tools([{"mcp": {"url": http_server["url"], "tools": ["http_pid", "http_crash", "http_add"]}}])
    assert sorted(t.name for t in tools) == ["http_add", "http_crash", "http_pid"]
    texts, statuses, _ = episode(tools, ("http_add", {"a": 20, "b": 22}), ("http_pid", {}))
    assert statuses == ["ok", "ok"] and texts == ["42", str(http_server["procs"][0].pid)]

    texts, statuses, _ = episode(tools, ("http_crash", {}))
    assert statuses == ["error"] and "the next call connects again" in texts[0]
    http_server["procs"][0].wait(10)
    texts, statuses, _ = episode(tools, ("http_pid", {}))  # nothing listens: this call's error, typed
    assert statuses == ["error"] and "is not reachable" in texts[0]
    http_server["procs"].append(start_http_server(http_server["port"], http_server["events"]))
    texts, statuses, _ = episode(tools, ("http_pid", {}))
    assert statuses == ["ok"] and texts == [str(http_server["procs"][1].pid)]


def test_bad_mcp_entries_are_config_errors_naming_the_entry_and_the_fix(tmp_path):
    from verl_agentic.tools.registry import tool

    def fails(entries, *patterns):
        with pytest.raises(ConfigError) as e:
            load_tools(entries)
        for p in patterns:
            assert p in str(e.value), str(e.value)

    yaml_file = tmp_path / "tools.yaml"
    yaml_file.write_text(json.dumps({"tools": [{"mcp": {"command": [sys.executable, "-c",
                                                                     "import sys; sys.exit('no server here')"]}}]}))
    fails(str(yaml_file), f"{yaml_file}: tools[0]: MCP server", "did not start", "fix: check that the command starts",
          "its stderr ends:", "no server here")
    fails([{"mcp": {"url": f"http://127.0.0.1:{free_port()}/mcp", "startup_timeout_s": 5}}],
          "tools[0]: MCP server 'http://127.0.0.1:", "did not start", "fix: check that the URL is right")
    fails([{"mcp": {"command": ["x"], "url": "http://h/mcp"}}], "tools[0]: 'mcp' needs exactly one of 'command'")
    fails([{"mcp": {"tools": ["x"]}}], "needs exactly one of")
    fails([{"mcp": {"url": "http://h/mcp", "env": {}}}], "unknown mcp keys ['env']; allowed with url")
    fails([{"mcp": {"command": "python x.py"}, "config": {}}], "an 'mcp' entry has no other keys")
    fails([stdio_entry(tmp_path / "e.jsonl", tools=["stdio_nothing"])], "mcp.tools names ['stdio_nothing']",
          "it offers ['stdio_add'")

    @tool(name="stdio_add")
    def clash(a: int) -> int:
        """A function tool with a server tool's name."""
        return a
    fails([{"function": "stdio_add"}, stdio_entry(tmp_path / "e.jsonl")], "tool name 'stdio_add' is declared twice",
          "tools[0] (function stdio_add)", "tools[1] (mcp server")
    fails([stdio_entry(tmp_path / "e.jsonl"), stdio_entry(tmp_path / "e.jsonl")], "'stdio_lookup' is declared twice")


def test_bwrap_isolation_holds_for_a_stdio_server(tmp_path, http_server):
    from verl_agentic.isolation import sandbox_support

    assert sandbox_support()["bwrap"], "bubblewrap must work here (scripts/setup_bwrap.sh)"
    secret = tmp_path / "host_only.txt"
    secret.write_text("the host's file")
    probe = ("stdio_probe", {"path": str(secret), "port": http_server["port"]})
    open_tools = load_tools([stdio_entry(tmp_path / "open.jsonl", tools=["stdio_probe"])])
    assert json.loads(episode(open_tools, probe)[0][0]) == {"uid": 0, "exists": True, "net": "connected"}

    boxed = load_tools([{"mcp": {"command": [sys.executable, str(SERVER), "stdio", "-"], "isolation": "bwrap",
                                 "readonly_paths": [str(SERVER.parent)], "tools": ["stdio_probe"]}}])
    seen = json.loads(episode(boxed, probe)[0][0])
    assert seen["uid"] == 65534 and seen["exists"] is False and seen["net"] != "connected", seen


def test_main_rollout_runs_an_mcp_servers_tools_over_stdio_and_http(tmp_path, tiny_qwen_dir, http_server):
    from transformers import AutoTokenizer

    from verl_agentic.main_rollout import load_config, run

    stdio_events = tmp_path / "stdio_events.jsonl"
    (tmp_path / "tools.yaml").write_text(json.dumps({"tools": [stdio_entry(stdio_events),
                                                               {"mcp": {"url": http_server["url"]}}]}))
    with open(tmp_path / "rows.jsonl", "w") as f:
        for i in range(3):
            f.write(json.dumps({"data_source": "va/mcp", "prompt": [{"role": "user", "content": f"Question {i}"}],
                                "reward_model": {"ground_truth": "5"}, "extra_info": {"index": i}}) + "\n")
    script = [CALL.format(name="stdio_lookup", args='{"key": "abc"}') + "\n"
              + CALL.format(name="http_add", args='{"a": 2, "b": 3}'),
              CALL.format(name="http_lookup", args='{"key": "boom"}'), "The answer is 5."]
    cfg = load_config([f"model.path={tiny_qwen_dir}", f"data.path={tmp_path / 'rows.jsonl'}", "task_type=tool_agent",
                       f"task.tool_agent.tools={tmp_path / 'tools.yaml'}", "rollout.max_turns=3",
                       "rollout.max_new_tokens=96", "reward.manager=none", "output.quiet=true",
                       f"output.dir={tmp_path / 'out'}"])
    tokenizer = AutoTokenizer.from_pretrained(QWEN25_DIR)
    trajectories, summary = run(cfg, backend=ScriptedPolicy(tokenizer, script))
    assert len(trajectories) == 3
    for traj in trajectories:
        assert traj["error"] is None and traj["num_turns"] == 3, traj["error"]
        prompt = tokenizer.decode(traj["prompt_ids"])
        assert '"name": "stdio_lookup"' in prompt and '"name": "http_add"' in prompt  # the servers' schemas
        answers = [m["content"] for m in traj["messages"] if m["role"] == "tool"]
        assert answers[:2] == ["stdio:abc=3", "5"] and "http_lookup" in answers[2]
        m = traj["metrics"]
        assert (m["tool_calls"], m["tool_ok"], m["tool_error"]) == (3, 2, 1)
    assert summary["drift"]["episodes_ok"] == 3, summary["drift"]  # token-exact against the chat template
    assert [e[1:] for e in events_of(stdio_events)].count(["call", "lookup", "abc"]) == 3
    assert [e[1:] for e in events_of(http_server["events"])].count(["call", "add", [2, 3]]) == 3
