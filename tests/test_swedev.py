"""The swedev task end to end: sandbox service -> task (tools, hidden tests) -> reward manager.

The model is replaced by ``ScriptedReplayPolicy``, a test double that replays a fixed script of
assistant turns (hermes tool calls, tokenized by the real Qwen2.5 tokenizer) per instance, e.g.
"write the canonical HumanEval solution, then say done"; the point of those tests is the
environment path, not the model. One test runs the real embedded SmolLM2 model through
``main_rollout.run``. The sandbox service is real (a subprocess or in-process on loopback), so
are the sandboxed processes.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re

import pytest

from va_sandbox import SandboxServerProcess, get_json
from va_testing import REPO
from verl_agentic.agentic_utils import DatasetError
from verl_agentic.backends.base import GenerationBackend
from verl_agentic.interfaces import ConfigError, GenOutput
from verl_agentic.reward.base import RewardConfig, make_reward_manager
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift
from verl_agentic.sandbox.runtime import PASS_MARKER
from verl_agentic.sandbox.server import ServiceConfig, serve
from verl_agentic.tasks.swedev import SwedevConfig, instance_from_row, swedev_preprocess

HUMANEVAL = REPO / "data" / "humaneval" / "HumanEval.jsonl.gz"


def _raw_humaneval() -> list[dict]:
    with gzip.open(HUMANEVAL, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


RAW = _raw_humaneval()
BY_ID = {r["task_id"]: r for r in RAW}


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def write_canonical(task_id: str) -> str:
    r = BY_ID[task_id]
    return "I will implement it.\n" + call("write_file", path="solution.py",
                                           content=r["prompt"] + r["canonical_solution"])


class ScriptedReplayPolicy(GenerationBackend):
    """TEST DOUBLE for the model: replays ``scripts[instance_id][turn]`` (no model runs).

    The instance comes from the prompt ("Task <id>. ..."), the turn from the assistant turns
    already in the context. Each reply is tokenized with the real tokenizer and returned as the
    generated ids (logprob 0.0 each) ending with the template's end-of-turn token, cut at
    ``max_new_tokens`` like a real backend. Past the end of a script it says "Done.".
    ``hook(instance_id, turn)`` (async) runs before each reply: faults are injected there.
    """

    def __init__(self, tokenizer, scripts: dict[str, list[str]], hook=None):
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.stop_token_ids = [self.end_id]
        self.scripts, self.hook = scripts, hook

    async def generate(self, prompt_ids, sampling):
        context = self.tokenizer.decode(prompt_ids)
        iid = re.search(r"Task (\S+)\. ", context).group(1)
        turn = context.count("<|im_start|>assistant") - 1
        if self.hook is not None:
            await self.hook(iid, turn)
        script = self.scripts[iid]
        reply = script[turn] if turn < len(script) else "Done."
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.end_id]
        finish = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        return GenOutput(ids, [0.0] * len(ids), self.tokenizer.decode(ids), finish)


def _rows(task_ids) -> list[dict]:
    return [swedev_preprocess(BY_ID[t], i) for i, t in enumerate(task_ids)]


async def _rollout(policy, rows, url, concurrency=8, max_turns=4, **task_cfg) -> list[dict]:
    cfg = RolloutConfig(max_turns=max_turns, max_new_tokens=4096, max_total_tokens=12288, temperature=0,
                        concurrency=concurrency)
    rollout = AsyncRollout(policy, cfg, task_configs={"swedev": {"url": url, **task_cfg}}, seed=0)
    return await rollout.run(rows)


def _tool_texts(traj: dict) -> list[str]:
    return [m["content"] for m in traj["messages"] if m["role"] in ("tool", "user")][1:]  # after the prompt


# --- rows and config ------------------------------------------------------------------------------
def test_humaneval_rows_and_config_errors():
    rows = [swedev_preprocess(r, i) for i, r in enumerate(RAW)]
    assert len(rows) == 164 and len({r["extra_info"]["instance_id"] for r in rows}) == 164
    for raw, row in zip(RAW, rows):
        instance, hidden = instance_from_row(row)
        stub = instance.files["solution.py"]
        assert stub == raw["prompt"] + "    pass\n" and instance.instance_id == raw["task_id"]
        compile(stub, "solution.py", "exec")
        assert f"Task {raw['task_id']}. " in row["prompt"][1]["content"] and stub in row["prompt"][1]["content"]
        test_file = hidden.files["test_hidden.py"]
        assert raw["test"].strip() in test_file and f"check({raw['entry_point']})" in test_file
        assert PASS_MARKER in test_file and hidden.command == "python test_hidden.py"
        assert raw["canonical_solution"] not in json.dumps(row)  # the answer is nowhere in the row
        assert row["data_source"] == "openai/openai_humaneval" and row["task_type"] == "swedev"
    with pytest.raises(DatasetError, match="'entry_point' is missing"):
        swedev_preprocess({**RAW[0], "entry_point": ""}, 0)
    with pytest.raises(DatasetError, match="not a swedev instance"):
        swedev_preprocess({"question": "?"}, 0)
    generic = swedev_preprocess({"instance_id": "g/1", "problem_statement": "Fix it.", "files": {"a.py": "x"},
                                 "hidden_tests": {"test_files": {"t.py": "pass"}, "test_command": "python t.py"}}, 0)
    assert instance_from_row(generic)[0].files == {"a.py": "x"}
    with pytest.raises(DatasetError, match="hidden_tests.test_files: '../t.py' contains '..'"):
        swedev_preprocess({"instance_id": "g/1", "problem_statement": "Fix it.", "files": {},
                           "hidden_tests": {"test_files": {"../t.py": ""}, "test_command": "x"}}, 0)
    with pytest.raises(ConfigError, match="python -m verl_agentic.sandbox.server"):
        SwedevConfig.from_dict({})
    with pytest.raises(ConfigError, match="unknown task.swedev keys"):
        SwedevConfig.from_dict({"url": "http://127.0.0.1:1", "colour": 1})
    with pytest.raises(ConfigError, match="available"):
        SwedevConfig.from_dict({"url": "http://127.0.0.1:1", "tools": ["rm_rf"]})
    with pytest.raises(ConfigError, match="unknown sandbox limits"):
        SwedevConfig.from_dict({"url": "http://127.0.0.1:1", "limits": {"ram": 1}})


# --- all of HumanEval through the whole path ---------------------------------------------------------
async def test_all_164_canonical_solutions_score_1_and_stubs_0_through_service_task_and_reward(qwen25_tokenizer):
    server = SandboxServerProcess()
    try:
        ids = [r["task_id"] for r in RAW]
        rows = _rows(ids)
        manager = make_reward_manager(RewardConfig(manager="swedev", url=server.url))
        results = {}
        for name, scripts in (("canonical", {t: [write_canonical(t), "Done."] for t in ids}),
                              ("stub", {t: ["I am done."] for t in ids})):
            policy = ScriptedReplayPolicy(qwen25_tokenizer, scripts)
            trajs = await _rollout(policy, rows, server.url, concurrency=12)
            scores = await asyncio.to_thread(manager.score, trajs)
            results[name] = (trajs, scores)
        manager.close()
        canonical, stub = results["canonical"], results["stub"]
        bad = [(t["extra_info"]["instance_id"], t["error"], t["metrics"].get("hidden_tests_passed"))
               for t in canonical[0] if t["reward"] != 1.0]
        assert not bad, bad[:5]
        assert [s.score for s in canonical[1]] == [1.0] * 164, [s for s in canonical[1] if s.score != 1.0][:3]
        assert [t["reward"] for t in stub[0]] == [0.0] * 164
        assert [s.score for s in stub[1]] == [0.0] * 164 and all(s.error is None for s in stub[1])
        for t in canonical[0]:
            assert t["error"] is None and t["finish_reason"] == "stop" and t["num_turns"] == 2
            m = t["metrics"]
            assert (m["tool_calls"], m["tool_ok"], m["files_changed"], m["sandbox_destroyed"]) == (1, 1, 1, 1)
            (written,) = t["extra_info"]["swedev_submission"]["files"]
            raw = BY_ID[t["extra_info"]["instance_id"]]
            assert written == {"path": "solution.py", "content": raw["prompt"] + raw["canonical_solution"]}
            assert "Wrote" in _tool_texts(t)[0]
        assert all(t["metrics"]["files_changed"] == 0 and t["num_turns"] == 1 for t in stub[0])
        for t in canonical[0] + stub[0]:  # token exactness, tool turns included
            report = check_drift(t, qwen25_tokenizer, stop_token_ids=policy.stop_token_ids)
            assert report.ok, report.as_dict()
        health = await get_json(f"{server.url}/health")
        assert health["sandboxes"] == 0 and health["stats"]["created"] == health["stats"]["destroyed"] == 328
        assert health["score_stats"] == {"items": 328, "ok": 328}
    finally:
        server.close()


# --- tools, order, errors --------------------------------------------------------------------------
@pytest.mark.parametrize("tokenizer_name", ["qwen25_tokenizer", "smol_tokenizer"])
async def test_tools_run_in_order_and_model_errors_are_tool_messages(tokenizer_name, request):
    """Qwen2.5 renders the tools itself; SmolLM2's template has no tools, so they go into a system block."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    t = "HumanEval/2"
    body = BY_ID[t]["canonical_solution"]
    script = [
        call("view_file", path="solution.py", start_line=1, end_line=3) + call("view_file", path="../../etc/passwd")
        + call("edit_file", path="solution.py", old_str="    pass\n", new_str=body) + call("run_tests")
        + call("view_file", path="."),
        call("nope") + call("write_file", path="solution.py") + "<tool_call>{not json</tool_call>",
        call("run_command", command="python -c 'from solution import truncate_number as f; print(f(3.5))'"),
        "All done.",
    ]
    async with serve(ServiceConfig()) as url:
        (traj,) = await _rollout(ScriptedReplayPolicy(tokenizer, {t: script}), _rows([t]), url, max_turns=5)
        health = await get_json(f"{url}/health")
    assert traj["error"] is None and traj["reward"] == 1.0 and traj["num_turns"] == 4
    texts = _tool_texts(traj)
    assert texts[0].startswith("   1 | \n   2 | \n   3 | def truncate_number(number: float) -> float:")
    assert "contains '..'" in texts[1]
    assert texts[2] == "Edited solution.py: replaced 1 occurrence."
    assert texts[3].startswith("Tests passed.") and "1 examples, 0 failed" in texts[3]  # it saw the edit
    assert texts[4] == "solution.py"
    assert "unknown tool 'nope'" in texts[5] and "missing required arguments ['content']" in texts[6]
    assert "could not be parsed" in texts[7]  # the parser's feedback, as a user message
    assert texts[8] == "0.5"
    m = traj["metrics"]
    assert (m["tool_calls"], m["tool_ok"], m["tool_error"], m["parse_errors"]) == (8, 5, 3, 1)
    # ... and per turn, on the assistant turn that made the calls (what the inspector marks)
    ok, err = "ok", "error"
    assert [x.get("info") for x in traj["turns"] if x["role"] == "assistant"] == [
        {"tool_calls": [{"name": n, "status": s} for n, s in
                        [("view_file", ok), ("view_file", err), ("edit_file", ok), ("run_tests", ok), ("view_file", ok)]]},
        {"tool_calls": [{"name": "nope", "status": err}, {"name": "write_file", "status": err}], "parse_errors": 1,
         "invalid_calls": 2},  # the unknown tool and the unparseable call
        {"tool_calls": [{"name": "run_command", "status": ok}]},
        None]
    assert (m["test_runs"], m["commands"], m["files_written"], m["hidden_tests_passed"]) == (1, 1, 1, 1)
    report = check_drift(traj, tokenizer, stop_token_ids=[tokenizer.convert_tokens_to_ids("<|im_end|>")])
    assert report.ok and report.injected_tokens > 200, report.as_dict()
    assert health["sandboxes"] == 0


async def test_hanging_and_crashing_commands_and_hidden_tests_are_killed_and_reported(qwen25_tokenizer):
    raw = {"instance_id": "faulty/1", "problem_statement": "Make f return 42.",
           "files": {"f.py": "def f():\n    while True:\n        pass\n"}, "test_command": "sleep 30",
           "hidden_tests": {"test_files": {"test_f.py": f"from f import f\nassert f() == 42\nprint('{PASS_MARKER}')\n"},
                            "test_command": "python test_f.py"}}
    script = [call("run_command", command="exec python -c 'import os; os.kill(os.getpid(), 9)'")
              + call("run_command", command="python -c 'import f; f.f()'"),
              call("run_tests"), "I cannot fix it."]
    async with serve(ServiceConfig()) as url:
        (traj,) = await _rollout(ScriptedReplayPolicy(qwen25_tokenizer, {"faulty/1": script}),
                                 [swedev_preprocess(raw, 0)], url, command_timeout_s=1, test_timeout_s=1.5)
        assert (await get_json(f"{url}/health"))["sandboxes"] == 0
    texts = _tool_texts(traj)
    assert "[killed by SIGKILL]" in texts[0]
    assert "[timed out after 1 s: the program was killed]" in texts[1]
    assert texts[2].startswith("Tests failed.") and "timed out after 1 s" in texts[2]
    m = traj["metrics"]
    assert (m["tool_error"], m["tool_timeout"], m["hidden_tests_timeout"], traj["reward"]) == (1, 2, 1, 0.0)
    assert traj["error"] is None  # the model's code hanging is not an episode failure
    with make_reward_manager(RewardConfig(manager="naive", scorer_kwargs={"swedev": {"timeout_s": 1.5}})) as m:
        (score,) = await asyncio.to_thread(m.score, [traj])
    assert score.score == 0.0 and score.extra["tests_error"] == "timeout"


# --- service faults ------------------------------------------------------------------------------
async def test_cap_429_fails_the_episode_clearly_or_waits_for_a_slot(qwen25_tokenizer):
    ids = ["HumanEval/3", "HumanEval/4", "HumanEval/5"]
    scripts = {t: [write_canonical(t), "Done."] for t in ids}
    async with serve(ServiceConfig(max_sandboxes=2)) as url:
        trajs = await _rollout(ScriptedReplayPolicy(qwen25_tokenizer, scripts), _rows(ids), url, create_wait_s=0)
        failed = [t for t in trajs if t["error"] is not None]
        assert len(failed) == 1 and failed[0]["error"]["type"] == "tool_error"
        msg = failed[0]["error"]["message"]
        assert msg.startswith("swedev: no sandbox for") and "too_many_sandboxes: 2 of 2 sandboxes are live" in msg
        assert "--max-sandboxes" in msg
        assert [t["reward"] for t in trajs if t["error"] is None] == [1.0, 1.0]
        waited = await _rollout(ScriptedReplayPolicy(qwen25_tokenizer, scripts), _rows(ids), url, create_wait_s=30)
        assert [(t["error"], t["reward"]) for t in waited] == [(None, 1.0)] * 3
        health = await get_json(f"{url}/health")
        assert health["sandboxes"] == 0 and health["stats"]["rejected_at_cap"] >= 2


async def test_service_restart_mid_run_fails_the_affected_episodes_typed_and_the_rest_go_on(qwen25_tokenizer):
    ids = [r["task_id"] for r in RAW[:6]]
    scripts = {t: [write_canonical(t), call("run_tests"), "Done."] for t in ids}
    server = SandboxServerProcess()
    waiting: list[str] = []
    released = asyncio.Event()

    async def restart_when_first_wave_waits(iid: str, turn: int) -> None:
        """The first 3 episodes (concurrency 3) reach their second turn: crash and restart the service."""
        if turn == 1 and not released.is_set():
            waiting.append(iid)
            if len(waiting) == 3:
                await asyncio.to_thread(server.restart)
                released.set()
            await released.wait()

    try:
        policy = ScriptedReplayPolicy(qwen25_tokenizer, scripts, hook=restart_when_first_wave_waits)
        trajs = await _rollout(policy, _rows(ids), server.url, concurrency=3)
        with make_reward_manager(RewardConfig(manager="swedev", url=server.url)) as manager:
            scores = await asyncio.to_thread(manager.score, trajs)
        health = await get_json(f"{server.url}/health")
    finally:
        server.close()
    hit, rest = trajs[:3], trajs[3:]
    assert sorted(waiting) == sorted(ids[:3])
    for t in hit:
        assert t["error"]["type"] == "tool_error" and t["finish_reason"] == "error", t["error"]
        assert t["error"]["message"].startswith("swedev: the sandbox failed during a tool call")
        assert "sandbox_lost" in t["error"]["message"] and "restarted" in t["error"]["message"]
        assert t["reward"] == 0.0 and t["metrics"]["sandbox_errors"] == 1 and t["num_turns"] == 2
        assert "swedev_submission" not in t["extra_info"]
    assert [(t["error"], t["reward"]) for t in rest] == [(None, 1.0)] * 3
    # the lost episodes are not scored 0: they carry a typed error (masked by default)
    assert [(s.score, s.error.type if s.error else None) for s in scores] == \
        [(None, "scorer_error")] * 3 + [(1.0, None)] * 3
    assert health["sandboxes"] == 0 and health["stats"]["created"] == 3  # the new service's share


# --- the real model ----------------------------------------------------------------------------------
def test_smollm2_end_to_end_through_main_rollout(smol_dir, tmp_path):
    from verl_agentic.main_rollout import load_config, run

    data = tmp_path / "humaneval2.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RAW[:2]))
    server = SandboxServerProcess()
    try:
        cfg = load_config([
            "task_type=swedev", f"data.path={data}", "data.max_samples=2", f"model.path={smol_dir}",
            "rollout.max_turns=2", "rollout.max_new_tokens=48", "rollout.max_total_tokens=4096",
            "rollout.temperature=0.7",
            f"task.swedev.url={server.url}", "task.swedev.command_timeout_s=5", "reward.manager=swedev",
            f"reward.url={server.url}", f"output.dir={tmp_path / 'out'}", "output.quiet=true"])
        trajs, summary = run(cfg)
        health = asyncio.run(get_json(f"{server.url}/health"))
    finally:
        server.close()
    assert len(trajs) == 2 and summary["drift"]["episodes_ok"] == 2, summary["drift"]
    for t in trajs:
        assert t["error"] is None, t["error"]
        assert 0.0 <= t["reward"] <= 1.0 and t["metrics"]["sandbox_destroyed"] == 1.0
        assert t["score"] == t["reward"] and t["score_error"] is None  # the service's score equals the episode's
        assert t["tools"] and {f["function"]["name"] for f in t["tools"]} == {
            "view_file", "write_file", "edit_file", "run_command", "run_tests"}
    assert health["sandboxes"] == 0 and health["stats"]["created"] == health["stats"]["destroyed"] == 2
    assert (tmp_path / "out" / "trajectories.jsonl").exists()
