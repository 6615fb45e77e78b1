"""Record and replay (issue 29, part 1): ``output.record=true``, then ``python -m verl_agentic.replay``.

Real processes throughout: ``main_rollout`` and the replay run as a user runs them (subprocesses), the
models generate (a tiny random Qwen2 with the real Qwen2.5 tokenizer; the committed recording is the
embedded SmolLM2's), the python tool runs in the real bubblewrap sandbox, swedev talks to the real
sandbox service on loopback. Where an episode needs the model to call a tool, ``ScriptedPolicy`` (a TEST
DOUBLE for the model, as in test_swedev.py) answers with fixed replies tokenized by the real tokenizer:
random weights do not call tools.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from va_sandbox import SandboxServerProcess
from va_testing import QWEN25_DIR, REPO, ScriptedPolicy
from verl_agentic.interfaces import EpisodeResult, EpisodeState, Observation
from verl_agentic.record import RecordingError, RecordingWriter, Tape, door, using
from verl_agentic.replay import replay_run
from verl_agentic.rollout import AsyncRollout, RolloutConfig
from verl_agentic.rollout.async_rollout import _sample_seed
from verl_agentic.tasks import TaskSpec, register_task

COMMITTED = REPO / "tests" / "assets" / "replay" / "gsm8k_feedback"


def _run(module: str, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env=env)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _recording(run_dir: Path) -> dict[tuple[int, int], dict]:
    return {(r["index"], r["sample_id"]): r for r in _lines(run_dir / "recording.jsonl")}


# --- gsm8k with feedback: the recording, and its replay ---------------------------------------------------
@pytest.fixture(scope="module")
def gsm8k_run(tiny_qwen_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "gsm8k"
    r = _run("verl_agentic.main_rollout", f"model.path={tiny_qwen_dir}", "data.max_samples=3", "rollout.n=2",
             "rollout.max_turns=3", "rollout.max_new_tokens=16", "task.gsm8k.feedback=always_verify",
             "reward.manager=naive", "output.record=true", "output.quiet=true", f"output.dir={out}")
    assert r.returncode == 0, r.stderr
    return out


def test_the_recording_holds_every_turn_token_exact_and_the_seeds(gsm8k_run):
    header = json.loads((gsm8k_run / "recording.json").read_text())
    assert header["format"] == "verl_agentic.recording/1" and header["rollout"]["max_turns"] == 3
    assert header["stop_token_ids"] and header["task_configs"]["gsm8k"]["feedback"] == "always_verify"
    recs = _recording(gsm8k_run)
    trajs = _lines(gsm8k_run / "trajectories.jsonl")
    assert len(trajs) == 6 and sorted(recs) == [(t["index"], t["sample_id"]) for t in trajs]
    for t in trajs:
        rec = recs[(t["index"], t["sample_id"])]
        assert rec["seed"] == rec["ctx"]["seed"] == _sample_seed(0, t["index"], t["sample_id"])
        assert rec["row"]["reward_model"] and rec["ctx"]["task_config"]["feedback"] == "always_verify"
        assert rec["limits"] == {"max_turns": 3, "max_total_tokens": 2048, "episode_timeout_s": None}
        gens = [e for e in rec["events"] if e["door"] == "generate"]
        spoken = [x for x in t["turns"] if x["role"] == "assistant"]
        assert len(gens) == t["num_turns"] == len(spoken) >= 2
        for turn, (e, x) in enumerate(zip(gens, spoken)):
            # what the model generated, as generated: the ids, logprobs and finish reason of each turn
            assert e["turn"] == turn + 1 and e["answer"]["token_ids"] == t["response_ids"][x["start"]:x["end"]]
            assert e["answer"]["logprobs"] == t["response_logprobs"][x["start"]:x["end"]]
            assert e["answer"]["finish_reason"] == x["finish_reason"]
            assert e["request"]["seed"] == rec["sampling"]["seed"] + 7919 * turn  # each turn's own stream
            assert e["request"]["prompt_len"] == len(t["prompt_ids"]) + x["start"]
        assert rec["outcome"]["response_ids"] == t["response_ids"] and rec["outcome"]["reward"] == t["reward"]


def test_replay_reproduces_every_episode_and_exits_0(gsm8k_run, tmp_path):
    r = _run("verl_agentic.replay", gsm8k_run, "--json", tmp_path / "replay.jsonl")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "replayed 6 episodes" in r.stdout and "6 same as recorded, 0 differ" in r.stdout
    results = _lines(tmp_path / "replay.jsonl")
    assert len(results) == 6 and all(x["same"] and x["difference"] is None for x in results)


def test_a_changed_feedback_text_is_reported_at_turn_1_and_exits_1(gsm8k_run):
    cfg = json.loads((gsm8k_run / "recording.json").read_text())["task_configs"]["gsm8k"]
    changed = {"gsm8k": {**cfg, "verify_message": "Check your work once more."}}
    r = _run("verl_agentic.replay", gsm8k_run, "--task-config", json.dumps(changed))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("episode ")]
    assert len(lines) == 6 and all(": turn 1: messages differ: user turn:" in x for x in lines), lines
    assert "Are you sure?" in lines[0] and "Check your work" in lines[0]  # both texts, where they part
    assert "0 same as recorded, 6 differ" in r.stdout


def test_one_episode_by_id_and_bad_input(gsm8k_run, tmp_path):
    r = _run("verl_agentic.replay", gsm8k_run, "--episode", "2/1")
    assert r.returncode == 0 and "replayed 1 episode of" in r.stdout, r.stdout + r.stderr
    r = _run("verl_agentic.replay", gsm8k_run, "--episode", "gsm8k-1")  # a prompt's uid: both its samples
    assert r.returncode == 2 and "names several episodes" in r.stderr, r.stdout + r.stderr
    r = _run("verl_agentic.replay", gsm8k_run, "--episode", "9/0")
    assert r.returncode == 2 and "no episode '9/0'" in r.stderr
    r = _run("verl_agentic.replay", tmp_path)
    assert r.returncode == 2 and "holds no recording" in r.stderr and "output.record=true" in r.stderr
    r = _run("verl_agentic.replay", gsm8k_run, "--live", "generate")
    assert r.returncode == 2 and "--live: unknown doors ['generate']" in r.stderr


def test_a_resumed_run_keeps_recording(gsm8k_run, tiny_qwen_dir, tmp_path):
    """A kill after two episodes were written: the same command continues the run and records the rest,
    without output.record; a recording asked of a run that has unrecorded episodes is refused."""
    out = tmp_path / "resumed"
    shutil.copytree(gsm8k_run, out)
    lines = (out / "recording.jsonl").read_text().splitlines(keepends=True)[:2]  # killed after two episodes
    (out / "recording.jsonl").write_text("".join(lines))
    kept = {(r["index"], r["sample_id"]) for r in map(json.loads, lines)}
    (out / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in _lines(gsm8k_run / "trajectories.jsonl")
                                                    if (t["index"], t["sample_id"]) in kept))
    args = [f"model.path={tiny_qwen_dir}", "data.max_samples=3", "rollout.n=2", "rollout.max_turns=3",
            "rollout.max_new_tokens=16", "task.gsm8k.feedback=always_verify", "reward.manager=naive"]
    r = _run("verl_agentic.main_rollout", *args, f"output.dir={out}")
    assert r.returncode == 0, r.stderr
    assert "holds a recording: the episodes run now are recorded too" in r.stderr
    assert len(_recording(out)) == 6
    r = _run("verl_agentic.replay", out)
    assert r.returncode == 0 and "6 same as recorded" in r.stdout, r.stdout + r.stderr

    plain = tmp_path / "plain"
    shutil.copytree(gsm8k_run, plain)
    for name in ("recording.json", "recording.jsonl"):
        (plain / name).unlink()
    (plain / "trajectories.jsonl").write_text("".join((plain / "trajectories.jsonl").read_text().splitlines(
        keepends=True)[:2]))
    r = _run("verl_agentic.main_rollout", *args, "output.record=true", "output.quiet=true", f"output.dir={plain}")
    assert r.returncode == 2 and "episodes run without a recording" in r.stderr, r.stderr


def test_committed_recording_replays_identically():
    """The regression test: a committed recording of the embedded model (tests/assets/replay/README.md)."""
    r = _run("verl_agentic.replay", COMMITTED, "--score")  # the scores too (reward.manager=naive, gsm8k's scorer)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "replayed 4 episodes" in r.stdout and "4 same as recorded, 0 differ" in r.stdout
    assert "re-scored with the run's reward.manager=naive: 4/4 scored" in r.stdout and "0 changed" in r.stdout


# --- a changed task, caught at the turn it changed --------------------------------------------------------
COUNT_TASK_VARIANT = {"turn2": "Now count to three."}


def _count_start(row, ctx):
    return EpisodeState(row=row, messages=[{"role": "user", "content": row["question"]}], ctx=ctx, task=[])


async def _count_obs(state, out):
    # a door of the task's own: an outside lookup the recording answers on replay
    looked_up = await door("http", {"method": "GET", "path": f"/lookup/{state.num_turns}", "params": None,
                                    "body": None}, _lookup)
    state.task.append(looked_up["n"])
    text = COUNT_TASK_VARIANT["turn2"] if state.num_turns == 2 else f"Turn {state.num_turns} done. Go on."
    return Observation(messages=[{"role": "user", "content": text}], turn_reward=float(state.num_turns))


async def _lookup():
    await asyncio.sleep(0)
    return {"n": 7}


def _count_end(state):
    return EpisodeResult(float(sum(state.task)), {})


register_task("_t_replay_count", TaskSpec(start=_count_start, obs=_count_obs, end=_count_end))


def test_a_changed_task_is_caught_at_the_turn_it_changed(tiny_qwen_dir, tmp_path, monkeypatch):
    from verl_agentic.backends.hf import HFBackend

    backend = HFBackend.from_pretrained(str(tiny_qwen_dir), seed=0)
    rows = [{"task_type": "_t_replay_count", "question": f"Count the apples, {i}."} for i in range(2)]
    cfg = RolloutConfig(n=2, max_turns=3, max_new_tokens=8, temperature=1.0)
    writer = RecordingWriter(tmp_path, {"config": {}, "tokenizer": str(tiny_qwen_dir),
                                        "stop_token_ids": backend.stop_token_ids,
                                        "rollout": cfg.__dict__, "task_configs": {}, "seed": 3})
    try:
        recorded = AsyncRollout(backend, cfg, seed=3, recorder=writer).run_sync(rows)
    finally:
        writer.close()
        asyncio.run(backend.close())
    assert all(t["num_turns"] == 3 and t["reward"] == 21.0 for t in recorded)
    tok = backend.tokenizer
    assert all(r.difference is None for r in replay_run(tmp_path, tokenizer=tok).episodes)

    monkeypatch.setitem(COUNT_TASK_VARIANT, "turn2", "Now count to four.")  # the task changed at turn 2
    report = replay_run(tmp_path, tokenizer=tok)
    assert [(e.difference["turn"], e.difference["what"]) for e in report.episodes] == [(2, "messages")] * 4
    assert "three" in report.episodes[0].difference["detail"] and "four" in report.episodes[0].difference["detail"]

    monkeypatch.setitem(COUNT_TASK_VARIANT, "turn2", "Now count to three.")
    monkeypatch.setattr(sys.modules[__name__], "_lookup", _make_lookup(8))
    report = replay_run(tmp_path, tokenizer=tok, live=["http"])  # the live door answers otherwise at turn 1
    d = report.episodes[0].difference
    assert (d["turn"], d["what"]) == (1, "http") and "answer differs" in d["detail"], d

    # the recording answers the door: the changed lookup is not asked, the episode replays as recorded
    assert all(e.difference is None for e in replay_run(tmp_path, tokenizer=tok).episodes)


def _make_lookup(n):
    async def lookup():
        return {"n": n}
    return lookup


# --- the python tool (the real bubblewrap sandbox) and re-scoring ------------------------------------------
PYTHON_REPLIES = ["Let me compute it.\n```python\nprint(16 - 3 - 4, (16 - 3 - 4) * 2)\n```",
                  "The sandbox says 9 eggs are sold, so she makes 18 dollars. The answer is 18."]


@pytest.fixture(scope="module")
def python_tool_run(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer

    from verl_agentic.main_rollout import load_config, run

    out = tmp_path_factory.mktemp("replay") / "python_tool"
    policy = ScriptedPolicy(AutoTokenizer.from_pretrained(QWEN25_DIR), PYTHON_REPLIES)
    cfg = load_config(["data.max_samples=2", "rollout.max_turns=3", "rollout.max_new_tokens=64",
                       "task.gsm8k.tools=[python]", "task.gsm8k.parser=python_code", "task.gsm8k.interaction=gsm8k",
                       "reward.manager=naive",
                       f"model.path={QWEN25_DIR}", "output.record=true", "output.quiet=true", f"output.dir={out}"])
    trajs, _ = run(cfg, backend=policy)
    assert [t["metrics"]["tool_ok"] for t in trajs] == [1.0, 1.0], [t["error"] for t in trajs]
    return out


def test_python_tool_results_are_recorded_and_answered_from_the_recording(python_tool_run, tmp_path):
    recs = _recording(python_tool_run)
    tools = [e for r in recs.values() for e in r["events"] if e["door"] == "tool"]
    assert len(tools) == 2 and all(e["turn"] == 1 for e in tools)
    assert tools[0]["request"] == {"name": "python", "arguments": {"code": "print(16 - 3 - 4, (16 - 3 - 4) * 2)"}}
    assert tools[0]["answer"]["text"] == "9 18" and tools[0]["answer"]["status"] == "ok"
    assert any(e["door"] == "tool_reward" for e in recs[(0, 0)]["events"])
    # the gsm8k interaction answers each turn without tool calls: right (problem 0) ends the episode, wrong
    # (problem 1) asks again; its replies and the final score are recorded
    talks = [[(e["turn"], e["request"]["method"]) for e in recs[(i, 0)]["events"] if e["door"] == "interaction"]
             for i in (0, 1)]
    assert talks == [[(2, "generate_response"), (2, "calculate_score")],
                     [(2, "generate_response"), (3, "generate_response"), (3, "calculate_score")]], talks
    r = _run("verl_agentic.replay", python_tool_run)
    assert r.returncode == 0 and "2 same as recorded" in r.stdout, r.stdout + r.stderr
    # bubblewrap runs the code again, the interaction answers again: the same answers
    r = _run("verl_agentic.replay", python_tool_run, "--live", "tool,tool_reward,interaction")
    assert r.returncode == 0 and "2 same as recorded" in r.stdout, r.stdout + r.stderr

    # the replay's tool message comes from the recording: a doctored result shows at the turn it answers
    doctored = tmp_path / "doctored"
    shutil.copytree(python_tool_run, doctored)
    lines = _lines(doctored / "recording.jsonl")
    for rec in lines:
        for e in rec["events"]:
            if e["door"] == "tool":
                e["answer"]["text"] = "9 19"
    (doctored / "recording.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = _run("verl_agentic.replay", doctored, "--episode", "0")
    assert r.returncode == 1 and "turn 1: messages differ: tool turn:" in r.stdout and "9 19" in r.stdout, r.stdout
    r = _run("verl_agentic.replay", doctored, "--episode", "0", "--live", "tool")  # the sandbox says otherwise
    assert r.returncode == 1 and "turn 1: tool differ: tool answer differs from the recording" in r.stdout, r.stdout


def test_rescoring_with_another_scorer(python_tool_run, tmp_path):
    """The recorded episodes scored 1.0 (flexible extraction: the last number); the strict scorer wants
    ``#### 18`` and scores them 0.0."""
    r = _run("verl_agentic.replay", python_tool_run, "--episode", "0", "--scorer", "gsm8k")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "re-scored with gsm8k: 1/1 scored" in r.stdout
    r = _run("verl_agentic.replay", python_tool_run, "--scorer", "gsm8k", "--scorer-kwargs", '{"method": "strict"}')
    assert r.returncode == 0, r.stdout + r.stderr  # the episodes replay as recorded; only the scores change
    recorded = {t["index"]: t["score"] for t in _lines(python_tool_run / "trajectories.jsonl")}
    assert recorded == {0: 1.0, 1: 0.0}  # problem 0's answer is 18, problem 1's is not
    assert "episode 0/0 (gsm8k-0): score 1.0 -> 0.0 (gsm8k)" in r.stdout
    assert "mean 0.5000 recorded -> 0.0000, 1 changed, 0 scorer errors" in r.stdout

    # --score: scored again as the run did (its reward section): the same scores, exit 0 ...
    r = _run("verl_agentic.replay", python_tool_run, "--score")
    assert r.returncode == 0 and "re-scored with the run's reward.manager=naive: 2/2 scored" in r.stdout, r.stdout
    assert "0 changed" in r.stdout
    # ... and a scorer that changed since (here: gsm8k's replaced by a module) is the episode's difference
    (tmp_path / "changed_scorer.py").write_text(
        "import verl_agentic.tasks.gsm8k.scorer  # the built-in one first, then replaced\n"
        "from verl_agentic.reward.scorers import register_scorer\n"
        "register_scorer('gsm8k', lambda s, gt, extra_info=None, **kw: 0.5, aliases=('openai/gsm8k',), replace=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = _run("verl_agentic.replay", python_tool_run, "--score", "--import", "changed_scorer", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "episode 0/0 (gsm8k-0): turn 2: score differ: recorded 1.0, re-scored 0.5" in r.stdout, r.stdout
    assert "episode 1/0 (gsm8k-1): turn 3: score differ: recorded 0.0, re-scored 0.5" in r.stdout, r.stdout


# --- swedev against its real service ---------------------------------------------------------------------
def _humaneval(n: int) -> list[dict]:
    with gzip.open(REPO / "data" / "humaneval" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def _call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_swedev_replays_without_its_service(tmp_path):
    from transformers import AutoTokenizer

    from verl_agentic.main_rollout import load_config, run

    raw = _humaneval(2)
    data = tmp_path / "humaneval2.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in raw))
    scripts = {r["task_id"]: ["I will implement it.\n" + _call("write_file", path="solution.py",
                                                                content=r["prompt"] + r["canonical_solution"]),
                              _call("run_tests"), "Done."] for r in raw}
    policy = ScriptedPolicy(AutoTokenizer.from_pretrained(QWEN25_DIR), scripts, key=r"Task (\S+)\. ")
    out = tmp_path / "run"
    server = SandboxServerProcess()
    try:
        cfg = load_config(["task_type=swedev", f"data.path={data}", f"model.path={QWEN25_DIR}", "rollout.max_turns=4",
                           "rollout.max_new_tokens=2048", "rollout.max_total_tokens=8192",
                           f"task.swedev.url={server.url}", "task.swedev.command_timeout_s=10",
                           "reward.manager=swedev", f"reward.url={server.url}", "output.record=true",
                           "output.quiet=true", f"output.dir={out}"])
        trajs, _ = run(cfg, backend=policy)
    finally:
        server.close()
    assert [t["reward"] for t in trajs] == [1.0, 1.0] and [t["score"] for t in trajs] == [1.0, 1.0]
    rec = _recording(out)[(0, 0)]
    doors = [(e["door"], e["turn"], e["request"].get("path") or e["request"].get("name")) for e in rec["events"]]
    assert doors[0] == ("http", 0, "/sandboxes")  # the sandbox, made at start (its key left out: new every run)
    assert ("tool", 1, "write_file") in doors and ("tool", 2, "run_tests") in doors
    assert [p.rsplit("/", 1)[-1] for d, _, p in doors[-3:]] == ["changes", "test", rec["events"][0]["answer"][
        "sandbox_id"]], doors  # at the end: the submission, the hidden tests, the sandbox destroyed
    assert "key" not in json.dumps(rec["events"][0]["request"])

    # the service is gone: the replay needs none (tools and the service answer from the recording)
    r = _run("verl_agentic.replay", out)
    assert r.returncode == 0 and "2 same as recorded, 0 differ" in r.stdout, r.stdout + r.stderr
    # a task that asks the service something else is caught where it does (the sandbox's limits, at start)
    changed = {"swedev": {**json.loads((out / "recording.json").read_text())["task_configs"]["swedev"],
                          "limits": {"memory_mb": 256}}}
    r = _run("verl_agentic.replay", out, "--task-config", json.dumps(changed))
    assert r.returncode == 1 and "turn 0: http differ: http request not in the recording" in r.stdout, r.stdout


# --- one episode of a 10,000-episode recording ----------------------------------------------------------
@pytest.mark.serial  # a timing: measured with nothing beside it (on 2 busy cores it took 1.03 s of its 1)
def test_one_episode_of_a_10000_episode_recording_in_a_second(tiny_qwen_dir, tmp_path):
    """A greedy run over one problem records every index alike except its seed; the 10,000-episode
    recording is that episode written 10,000 times with each index's own seed (what a greedy run over
    10,000 copies of the row records), then one episode is replayed by the CLI."""
    from verl_agentic.main_rollout import load_config, run

    small = tmp_path / "small"
    run(load_config([f"model.path={tiny_qwen_dir}", "data.max_samples=1", "rollout.max_turns=3",
                     "rollout.max_new_tokens=32", "rollout.temperature=0", "task.gsm8k.feedback=always_verify",
                     "reward.manager=none", "output.record=true", "output.quiet=true", f"output.dir={small}"]))
    big = tmp_path / "big"
    big.mkdir()
    shutil.copy(small / "recording.json", big / "recording.json")
    (rec,) = _lines(small / "recording.jsonl")
    with open(big / "recording.jsonl", "w") as f:
        for i in range(10_000):
            seed = _sample_seed(0, i, 0)
            f.write(json.dumps({**rec, "index": i, "uid": f"gsm8k-{i}", "seed": seed,
                                "ctx": {**rec["ctx"], "seed": seed}}) + "\n")
    size_mb = (big / "recording.jsonl").stat().st_size / 1e6
    t0 = time.perf_counter()
    r = _run("verl_agentic.replay", big, "--episode", "7345")
    wall = time.perf_counter() - t0
    assert r.returncode == 0 and "replayed 1 episode" in r.stdout and "1 same as recorded" in r.stdout, r.stdout
    m = re.search(r"\(([\d.]+) s: reading ([\d.]+), tokenizer ([\d.]+) \((\w+)\), replay ([\d.]+)\)", r.stdout)
    total_s, read_s, replay_s = float(m.group(1)), float(m.group(2)), float(m.group(5))
    print(f"\n10,000 episodes ({size_mb:.0f} MB): the command {wall:.2f} s; in it {total_s:.2f} s: finding the "
          f"episode {read_s:.3f} s, loading the tokenizer {m.group(3)} s ({m.group(4)}), replaying {replay_s:.3f} s")
    assert m.group(4) == "light"  # its fingerprint matched the recorded tokenizer's: no transformers, no torch
    assert read_s + replay_s < 1.0, r.stdout  # the episode: found and replayed within a second
    assert total_s < 3.0, r.stdout  # with the tokenizer (about 1 s idle, the interpreter aside; slack for CI load)
    # the Python API, the tokenizer already loaded (a notebook, a debugger): the same, in-process
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    t0 = time.perf_counter()
    report = replay_run(big, episode="9999", tokenizer=tok)
    assert report.episodes[0].difference is None and time.perf_counter() - t0 < 1.0


def test_tape_refuses_unknown_modes_and_live_doors():
    with pytest.raises(ValueError, match="live doors"):
        Tape("replay", [], live=["generate"])
    with pytest.raises(ValueError, match="mode"):
        Tape("rewind")
    tape = Tape("replay", [])
    with using(tape), pytest.raises(Exception, match="not in the recording"):
        asyncio.run(door("tool", {"name": "x"}, _lookup))
    assert tape.divergence["what"].startswith("tool request beyond the recording")
    with pytest.raises(RecordingError, match="no recording"):
        replay_run(REPO / "docs")


def test_a_taped_backend_speaks_chat_exactly_when_its_backend_does(qwen25_tokenizer):
    """The chat loop talks to a backend with its own chat() through chat(), to others through ChatAdapter
    over generate(): a taped backend must not change which (it once did, and gen_chat's episodes failed)."""
    from verl_agentic.backends.chat_adapter import has_native_chat
    from verl_agentic.interfaces import ChatOutput
    from verl_agentic.record import taped

    class ChatServer(ScriptedPolicy):
        async def chat(self, messages, sampling, tools=None):
            return ChatOutput({"role": "assistant", "content": "4"}, "stop")

    tokens_only, chat = ScriptedPolicy(qwen25_tokenizer, ["4"]), ChatServer(qwen25_tokenizer, ["4"])
    assert not has_native_chat(tokens_only) and has_native_chat(chat)
    assert not has_native_chat(taped(tokens_only, Tape())) and has_native_chat(taped(chat, Tape()))
    tape = Tape()
    out = asyncio.run(taped(chat, tape).chat([{"role": "user", "content": "2+2?"}], _greedy()))
    assert out.message["content"] == "4" and [e["door"] for e in tape.events] == ["chat"] and tape.turn == 1


def _greedy():
    from verl_agentic.interfaces import SamplingParams

    return SamplingParams(max_new_tokens=8, temperature=0.0)


# --- main_ppo: each step's rollout recorded ---------------------------------------------------------------
def test_main_ppo_records_each_steps_rollout(tiny_smol_dir, tmp_path):
    out = tmp_path / "ppo"
    r = _run("verl_agentic.main_ppo", f"model.path={tiny_smol_dir}", "data.max_samples=8", "trainer.total_steps=2",
             "trainer.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8", "rollout.max_turns=2",
             "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=4", "task.gsm8k.feedback=always_verify",
             "trainer.save_hf_model=false", "output.record=true", "output.quiet=true", f"output.dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    for step in (1, 2):
        folder = out / "recordings" / f"step_{step:06d}"
        trajs = _lines(out / "rollouts" / f"step_{step:06d}.jsonl")
        recs = _recording(folder)
        assert len(recs) == len(trajs) == 4
        for t in trajs:  # the recorded tokens are the ones the step trained on
            assert recs[(t["index"], t["sample_id"])]["outcome"]["response_ids"] == t["response_ids"]
        r = _run("verl_agentic.replay", folder)
        assert r.returncode == 0 and "4 same as recorded, 0 differ" in r.stdout, r.stdout + r.stderr
    seeds = [json.loads((out / "recordings" / f"step_{s:06d}" / "recording.json").read_text())["seed"] for s in (1, 2)]
    assert seeds[0] != seeds[1]  # each step's own sampling seed


# --- an episode from a verl run's dump ---------------------------------------------------------------------
def test_episodes_of_verls_agent_loop_are_recorded_beside_the_dump_and_replay(tiny_qwen_dir, tmp_path):
    """verl's AgentLoopWorker runs our ``task_agent`` loop (as tests/test_verl_agent_loop.py does, verl's
    real pieces in this process) with ``+agentic.record=true``; one episode of the dump is replayed."""
    from test_verl_agent_loop import agent_config, dataset_batch, generate, make_worker

    from verl_agentic.agentic_utils import preprocess

    parquet = tmp_path / "gsm8k.parquet"
    assert preprocess("gsm8k", REPO / "data" / "gsm8k" / "test.jsonl", parquet, max_samples=4) == 4
    dump = tmp_path / "dump"
    cfg = agent_config(tiny_qwen_dir, "+agentic.task.gsm8k.feedback=always_verify", "+agentic.max_turns=3",
                       "+agentic.max_new_tokens=16", "+agentic.record=true", f"trainer.rollout_data_dir={dump}",
                       response_length=128)
    worker = make_worker(cfg, tiny_qwen_dir)
    generate(worker, dataset_batch(worker, cfg, parquet, rows=3, n=2))
    trajs = _lines(dump / "rollouts" / "step_000000.jsonl")
    recs = _lines(dump / "recordings" / "step_000000" / "recording.jsonl")
    # verl's trainer gives a prompt's n samples one sample id: the plugin's request id tells them apart
    assert len(trajs) == 6 and len({r["episode_id"] for r in recs}) == 6
    for e in trajs:  # each request's latency as the loop saw it: one per assistant turn, summing to generate_s
        spoken = [t for t in e["turns"] if t["role"] == "assistant"]
        assert len(e["timing"]["requests_s"]) == len(spoken) and all(s > 0 for s in e["timing"]["requests_s"])
        assert sum(e["timing"]["requests_s"]) == pytest.approx(e["timing"]["generate_s"], abs=2e-3)
    t = trajs[3]
    (rec,) = [r for r in recs if r["outcome"]["response_ids"] == t["response_ids"]]
    assert rec["uid"] == t["uid"] and rec["ctx"]["task_config"]["feedback"] == "always_verify"
    assert rec["limits"]["max_total_tokens"] == len(t["prompt_ids"]) + 128  # the budget verl's hook set
    r = _run("verl_agentic.replay", dump / "recordings" / "step_000000", "--episode", rec["episode_id"])
    assert r.returncode == 0 and "1 same as recorded" in r.stdout, r.stdout + r.stderr
    r = _run("verl_agentic.replay", dump / "recordings" / "step_000000")
    assert r.returncode == 0 and "6 same as recorded" in r.stdout, r.stdout + r.stderr


# --- a user's own tasks (imports=[...]): the replay imports what the run imported ---------------------------
def test_a_users_own_tasks_replay_without_naming_their_module(tiny_qwen_dir, tmp_path):
    from va_user_tasks import user_env, write_user_tasks

    folder = tmp_path / "my_project"  # outside the repository, not on PYTHONPATH
    data = write_user_tasks(folder)
    r = subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", "imports=[my_tasks]", f"model.path={tiny_qwen_dir}",
                        f"data.path={data}", "task_type=length_task", "rollout.max_new_tokens=8", "reward.manager=naive",
                        "output.record=true", "output.quiet=true", "output.dir=out"],
                       capture_output=True, text=True, cwd=folder, env=user_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "verl_agentic.replay", "out"], capture_output=True, text=True, cwd=folder,
                       env=user_env(), timeout=600)
    assert r.returncode == 0 and "4 same as recorded, 0 differ" in r.stdout, r.stdout + r.stderr
    # re-scored with the user's scorer (registered by the same module): named_task's own, length_task by it too
    r = subprocess.run([sys.executable, "-m", "verl_agentic.replay", "out", "--scorer", "my_len_scorer"],
                       capture_output=True, text=True, cwd=folder, env=user_env(), timeout=600)
    assert r.returncode == 0 and "re-scored with my_len_scorer: 4/4 scored" in r.stdout, r.stdout + r.stderr


@pytest.mark.serial  # a Ray cluster of its own
def test_main_ppo_with_ray_records_in_the_rollout_actor(tiny_smol_dir, tmp_path):
    """trainer.use_ray: the rollout actor (another process) writes the step's recording."""
    from verl_agentic.main_rollout import load_config
    from verl_agentic.trainer import PPOTrainer

    out = tmp_path / "ray"
    trainer = PPOTrainer(load_config([
        f"model.path={tiny_smol_dir}", "data.max_samples=8", "trainer.total_steps=1", "trainer.batch_size=2",
        "rollout.n=2", "rollout.max_new_tokens=8", "rollout.max_turns=2", "actor.ppo_mini_batch_size=4",
        "actor.ppo_micro_batch_size=4", "task.gsm8k.feedback=always_verify", "trainer.save_hf_model=false",
        "trainer.use_ray=true", "trainer.ray_init.num_cpus=2", "output.record=true", "output.quiet=true",
        f"output.dir={out}"], config_name="ppo"))
    try:
        trainer.train_step()
    finally:
        trainer.close()
        import ray

        ray.shutdown()
    trajs = _lines(out / "rollouts" / "step_000001.jsonl")
    recs = _recording(out / "recordings" / "step_000001")
    assert len(trajs) == len(recs) == 4
    assert all(recs[(t["index"], t["sample_id"])]["outcome"]["response_ids"] == t["response_ids"] for t in trajs)
    r = _run("verl_agentic.replay", out / "recordings" / "step_000001")
    assert r.returncode == 0 and "4 same as recorded, 0 differ" in r.stdout, r.stdout + r.stderr


# --- an environment service (gen_chat against python -m verl_agentic.envserver) -----------------------------
def test_gen_chat_against_the_environment_service_replays_without_it(tiny_qwen_dir, tmp_path):
    from va_services import ServiceProcess

    rows = tmp_path / "rows.jsonl"
    r = _run("verl_agentic.envserver.rows", "gsm8k", REPO / "data" / "gsm8k" / "test.jsonl", rows, "--max-samples", "2")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    server = ServiceProcess("verl_agentic.envserver", ready="environment service listening on ")
    try:
        r = _run("verl_agentic.main_rollout", "task_type=gen_chat", f"data.path={rows}", f"task.gen_chat.url={server.url}",
                 "+task.gen_chat.env_config.feedback=always_verify", f"model.path={tiny_qwen_dir}", "rollout.n=2",
                 "rollout.max_new_tokens=8", "rollout.max_turns=2", "output.record=true", "output.quiet=true",
                 f"output.dir={out}")
        assert r.returncode == 0, r.stderr[-3000:]
    finally:
        server.stop()
        server.close()
    recs = _recording(out)
    assert len(recs) == 4
    paths = [e["request"]["path"] for e in recs[(0, 0)]["events"] if e["door"] == "http"]
    assert paths == ["/start", "/step", "/step", "/end"], paths  # each answer of the environment, recorded
    assert all("session_id" not in json.dumps(e["request"]) for e in recs[(0, 0)]["events"])
    r = _run("verl_agentic.replay", out)  # the service is gone
    assert r.returncode == 0 and "4 same as recorded, 0 differ" in r.stdout, r.stdout + r.stderr


def test_recording_writers_of_200_steps_keep_a_bounded_number_of_files_open(tmp_path):
    """verl's agent-loop workers record a folder per step: over 200 steps the process holds at most
    ``max_open`` recording files open (it used to keep one per step, toward ``ulimit -n``), and a closed
    step's writer reopens for a late episode without losing a line."""
    import os

    from verl_agentic.interfaces import RolloutContext, SamplingParams
    from verl_agentic.record import RecordingWriters, read_episodes
    from verl_agentic.rollout.loops import LoopLimits

    def fds() -> int:
        """This process's open files under tmp_path: the recordings' (other threads of the test process, such
        as conftest's memory sampler reading /proc, open files of their own at any time)."""
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
            except OSError:  # closed while listed
                pass
        return count

    writers = RecordingWriters(max_open=4)
    ctx, sampling, limits = RolloutContext(tokenizer=None, task_config={}), SamplingParams(), LoopLimits()
    traj = {"index": 0, "sample_id": 0, "uid": "u0", "task_type": "t", "prompt_ids": [1], "response_ids": [2]}
    before = fds()
    try:
        for step in range(200):
            w = writers.get(str(tmp_path / f"step_{step:06d}"), lambda: {"config": {}, "seed": 0})
            w.finish(Tape("record"), {**traj, "index": step}, row={}, ctx=ctx, sampling=sampling, limits=limits)
            assert writers.open_files <= 4 and fds() <= 4
        late = writers.get(str(tmp_path / "step_000003"), lambda: {"config": {}, "seed": 0})
        late.finish(Tape("record"), {**traj, "sample_id": 1, "index": 3}, row={}, ctx=ctx, sampling=sampling,
                    limits=limits)
    finally:
        writers.close()
    assert before == 0 and fds() == 0
    assert [(e["index"], e["sample_id"]) for e in read_episodes(tmp_path / "step_000003")] == [(3, 0), (3, 1)]


def test_the_tokenizer_a_replay_uses_is_logged(tiny_qwen_dir, caplog):
    """The light tokenizer when its fingerprint is the recorded one's (info); transformers otherwise, with a
    warning that says why: a fingerprint that differs, or a folder the light tokenizer cannot serve."""
    import logging

    from verl_agentic.record.probe import tokenizer_probe
    from verl_agentic.replay import load_tokenizer
    from verl_agentic.replay.tokenizer import LightTokenizer

    probe = tokenizer_probe(LightTokenizer(tiny_qwen_dir), [])
    with caplog.at_level(logging.INFO, logger="verl_agentic.replay"):
        assert load_tokenizer(str(tiny_qwen_dir), probe)[1] == "light"
        assert load_tokenizer(str(tiny_qwen_dir), {**probe, "render0": "another"})[1] == "transformers"
        assert load_tokenizer(str(QWEN25_DIR), probe)[1] == "transformers"  # no tokenizer.json there
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "verl_agentic.replay"]
    assert ("INFO", f"replay: tokenizer {tiny_qwen_dir} (light: its fingerprint is the recorded tokenizer's)") in logged
    assert ("WARNING", f"replay: tokenizer {tiny_qwen_dir} loaded with transformers, not the light tokenizer: the "
                       "light tokenizer's fingerprint differs from the recorded tokenizer's") in logged
    assert any(level == "WARNING" and m.startswith(f"replay: tokenizer {QWEN25_DIR} loaded with transformers, not "
                                                   "the light tokenizer: the light tokenizer cannot serve it (")
               and f"FileNotFoundError: {QWEN25_DIR}: no tokenizer.json" in m for level, m in logged), logged
