"""A user's own tasks, written into a folder outside the repository (tests/test_user_tasks.py and
tests/test_verl_user_tasks.py import them there with ``imports=[my_tasks]``).

``length_task``: no scorer of its own, so a reward manager scores it by its episode reward,
``len(last assistant text) / 100`` capped at 1 (a test recomputes it from the trajectory).
``named_task``: names its scorer ``my_len_scorer`` (registered in the same module): the score is
``1.0`` when the last assistant text is longer than the row's ``ground_truth`` number, else ``0.0``
(its episode reward is always ``0.5``, so a score that followed the reward would show).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def user_env(**extra: str) -> dict:
    """This environment without the tests folder on PYTHONPATH: a user's module must come in through
    ``imports`` (or a class_name) and the working directory, nothing else."""
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not p.rstrip("/").endswith("tests")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(keep), "PYTHONWARNINGS": "ignore", **extra}

MODULE = '''
from verl_agentic.interfaces import EpisodeResult, EpisodeState, Observation
from verl_agentic.reward.scorers import register_scorer
from verl_agentic.tasks import register_task


@register_task("length_task")
class LengthTask:
    def start(self, row, ctx):
        return EpisodeState(row=row, messages=list(row["prompt"]), ctx=ctx)

    def obs(self, state, gen_out):
        return Observation(done=state.num_turns >= 2, messages=[{"role": "user", "content": "Go on."}])

    def end(self, state):
        return EpisodeResult(reward=min(1.0, len(state.last_assistant_text) / 100))


@register_scorer("my_len_scorer")
def my_len_scorer(solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) > int(ground_truth))


@register_task("named_task")
class NamedTask:
    scorer = "my_len_scorer"

    def start(self, row, ctx):
        return EpisodeState(row=row, messages=list(row["prompt"]), ctx=ctx)

    def obs(self, state, gen_out):
        return Observation(done=True)

    def end(self, state):
        return EpisodeResult(reward=0.5)
'''


def write_user_tasks(folder: Path, rows: int = 4) -> Path:
    """``folder/my_tasks.py`` and ``folder/rows.jsonl`` (``rows`` rows, alternating the two tasks); returns the rows' path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_tasks.py").write_text(MODULE)
    data = folder / "rows.jsonl"
    with data.open("w") as f:
        for i in range(rows):
            task = ("length_task", "named_task")[i % 2]
            f.write(json.dumps({"prompt": f"Write a short sentence about the number {i}.",
                                "ground_truth": "10" if task == "length_task" else "20",
                                "task_type": task, "data_source": f"my/{task}"}) + "\n")
    return data


def expected_score(traj: dict) -> float:
    """What the reward manager must give ``traj`` (see the module docstring)."""
    last = [m["content"] or "" for m in traj["messages"] if m["role"] == "assistant"][-1]
    if traj["task_type"] == "length_task":
        return min(1.0, len(last) / 100)
    return float(len(last) > int(traj["ground_truth"]))
