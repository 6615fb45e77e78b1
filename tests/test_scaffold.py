"""``python -m verl_agentic.tasks new NAME``: the folder it writes passes its own tests, and the commands it
prints run (a user's folder outside the repository, real subprocesses, the embedded model)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from va_user_tasks import user_env


def _run(args: list[str], cwd, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout)


def test_a_new_task_folder_passes_its_own_test_and_runs(tmp_path):
    made = _run([sys.executable, "-m", "verl_agentic.tasks", "new", "capital_quiz"], tmp_path)
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "capital_quiz"
    assert sorted(p.name for p in folder.iterdir()) == ["__init__.py", "data.py", "example.jsonl", "scorer.py",
                                                        "task.py", "test_capital_quiz.py"]
    steps = [line.split("#")[0].strip() for line in made.stdout.splitlines() if line.startswith("  python ")]
    assert len(steps) == 3 and steps[0] == "python -m pytest capital_quiz"
    # 1. its own tests (a short real rollout among them)
    tested = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "capital_quiz"], tmp_path)
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-2000:]
    assert "3 passed" in tested.stdout
    # 2. the rollout command it prints
    rolled = _run([sys.executable, *shlex.split(steps[1])[1:], "data.max_samples=2", "rollout.max_new_tokens=16",
                   "output.dir=out"], tmp_path)
    assert rolled.returncode == 0, rolled.stderr[-3000:]
    trajs = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    assert [t["task_type"] for t in trajs] == ["capital_quiz"] * 2
    assert all(t["scorer"] == "capital_quiz" and t["score"] == t["reward"] for t in trajs)  # the task names its scorer
    # 3. the preprocessing command: rows for verl's trainer
    rows = _run([sys.executable, *shlex.split(steps[2])[1:]], tmp_path)
    assert rows.returncode == 0, rows.stderr
    import pandas as pd

    table = pd.read_parquet(tmp_path / "rows.parquet")
    assert list(table["task_type"]) == ["capital_quiz"] * 4 and table["reward_model"][0]["ground_truth"] == "Paris"
    # the listing sees it with --imports
    listed = _run([sys.executable, "-m", "verl_agentic.tasks", "--imports", "capital_quiz"], tmp_path)
    assert listed.returncode == 0 and "capital_quiz" in listed.stdout and "preprocess" in listed.stdout


@pytest.mark.parametrize("name, message", [
    ("My-Task", "use lowercase letters, digits and _"),
    ("gsm8k", "task 'gsm8k' is registered already"),
    ("json", "a module named 'json' exists already"),
    ("class", "use lowercase letters"),
])
def test_a_bad_name_is_a_clear_error_and_writes_nothing(tmp_path, name, message):
    r = _run([sys.executable, "-m", "verl_agentic.tasks", "new", name], tmp_path, timeout=120)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_not_overwritten(tmp_path):
    (tmp_path / "quiz").mkdir()
    (tmp_path / "quiz" / "notes.txt").write_text("mine")
    r = _run([sys.executable, "-m", "verl_agentic.tasks", "new", "quiz"], tmp_path, timeout=120)
    assert r.returncode == 2 and "exists already" in r.stderr
    assert [p.name for p in (tmp_path / "quiz").iterdir()] == ["notes.txt"]
