"""README.md's "Adding a task": its code blocks, extracted from the page, run with the one command it
prints next to them (so the page and what runs cannot drift apart)."""

from __future__ import annotations

import json
import re
import subprocess

from va_docs import command_argv, marked_blocks, write_files
from va_testing import REPO
from va_user_tasks import user_env

README = REPO / "README.md"


def test_every_python_block_of_the_readme_is_one_the_tests_run():
    text = README.read_text()
    files, runs = marked_blocks(README)
    python_blocks = re.findall(r"```python\n(.*?)\n```", text, re.S)
    assert python_blocks and all(b + "\n" in files.values() for b in python_blocks)
    assert set(files) == {"count_up.py", "count_up.jsonl"} and set(runs) == {"count_up"}


def test_the_readmes_count_up_example_runs_as_written(tmp_path):
    files, runs = marked_blocks(README)
    write_files(files, tmp_path)  # a folder of the user's, outside the repository
    r = subprocess.run(command_argv(runs["count_up"]), cwd=tmp_path, env=user_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "outputs" / "count_up"
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 2 and {t["task_type"] for t in trajs} == {"count_up"}
    for t in trajs:
        assert t["error"] is None and 1 <= t["num_turns"] <= 3
        # the task's rule, recomputed from what the model wrote
        said = [str(i + 1) in m["content"] for i, m in enumerate(x for x in t["messages"] if x["role"] == "assistant")]
        assert said[:-1] == [False] * (len(said) - 1)  # it went on only while the number was missing
        assert t["reward"] == (1.0 / t["num_turns"] if said[-1] else 0.0)
        assert [turn.get("reward") for turn in t["turns"] if turn["role"] == "assistant"] == [float(s) for s in said]
        # no scorer registered for count_up: scored by that reward, not an unknown_scorer error
        assert t["score"] == t["reward"] and t["score_error"] is None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward"]["scored_by_episode_reward_tasks"] == ["count_up"]
    assert "count_up" in r.stdout and "scored by their own episode reward" in r.stderr
