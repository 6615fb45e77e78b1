"""``python -m verl_agentic.tasks new NAME``: a new task's folder, ready to run and to edit.

It writes ``NAME/`` (a package: ``imports=[NAME]`` registers everything in it)::

    __init__.py      imports the three modules below
    task.py          the task: answer, a retry message after a wrong answer, reward = the last answer is right
    scorer.py        its scorer (the same rule), which the task names: what reward managers score it with
    data.py          its prompt generator and dataset preprocessor ({question, answer} rows)
    example.jsonl    four raw rows
    test_NAME.py     its tests: the scorer, the rows, and a short real rollout on the embedded model

and prints the commands that test it and roll it out. The test passes as written
(``tests/test_scaffold.py`` runs it).
"""

from __future__ import annotations

import importlib.util
import keyword
import re
from pathlib import Path
from string import Template

from verl_agentic.interfaces import ConfigError
from verl_agentic.rollout.task_spec import TASKS

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")

_INIT = '''"""The $name task. ``imports=[$name]`` (main_rollout, main_ppo) or ``+agentic.imports=[$name]`` (verl's
trainer) registers the task, its scorer and its data helpers."""

from . import data, scorer, task  # noqa: F401  (each registers on import)
'''

_TASK = '''"""The $name task: the model answers; a wrong answer gets one retry message per turn left; the
episode's reward is whether the last answer is right (``scorer.is_correct``, the scorer's rule too).
Edit ``start`` / ``obs`` / ``end`` (the contract: docs/tasks.md)."""

from dataclasses import dataclass, field

from verl_agentic.interfaces import EpisodeResult, EpisodeState, Observation
from verl_agentic.tasks import register_task

from .scorer import is_correct

RETRY = "That is not right. Think again and give your answer."


@dataclass
class ${cls}State:
    correct: list = field(default_factory=list)  # per assistant turn: was the answer right?


@register_task("$name")
class $cls:
    scorer = "$name"  # scorer.py's: reward managers score this task's episodes with it

    def start(self, row, ctx):
        return EpisodeState(row=row, messages=list(row["prompt"]), ctx=ctx, task=${cls}State())

    def obs(self, state, gen_out):
        right = is_correct(state.last_assistant_text, state.row["reward_model"]["ground_truth"])
        state.task.correct.append(right)
        if right:
            return Observation(done=True, turn_reward=1.0)
        return Observation(turn_reward=0.0, messages=[{"role": "user", "content": RETRY}])

    def end(self, state):
        correct = state.task.correct if state.task is not None else []
        return EpisodeResult(reward=float(bool(correct) and correct[-1]),
                             metrics={"first_correct": float(bool(correct) and correct[0])})
'''

_SCORER = '''"""The $name scorer: ``score(solution_str, ground_truth, extra_info)``, registered under "$name"."""

from verl_agentic.reward.scorers import register_scorer


def is_correct(text, answer) -> bool:
    """The answer appears in the text (case-insensitive)."""
    return str(answer).strip().lower() in (text or "").lower()


@register_scorer("$name")
def score(solution_str, ground_truth, extra_info=None):
    right = is_correct(solution_str, ground_truth)
    return {"score": float(right), "acc": float(right)}
'''

_DATA = '''"""The $name task's rows: a raw ``{question, answer}`` becomes a rollout row (docs/tasks.md's format).

    python -m verl_agentic.tasks.data --imports $name $name raw.jsonl rows.parquet   # e.g. for verl's trainer
"""

from verl_agentic.tasks.data import PREPROCESS_DATASET, PROMPT_GENERATOR, DatasetError

INSTRUCTION = "Answer in a few words."


def _field(raw, key):
    value = raw.get(key)
    if value is None or not str(value).strip():
        raise DatasetError(f"field {key!r} is missing or empty")
    return str(value).strip()


@PROMPT_GENERATOR.register("$name")
def prompt(raw):
    return [{"role": "user", "content": f"{_field(raw, 'question')} {INSTRUCTION}"}]


@PREPROCESS_DATASET.register("$name")
def preprocess(raw, index):
    return {"data_source": "$name", "task_type": "$name", "ability": "$name",
            "reward_model": {"style": "rule", "ground_truth": _field(raw, "answer")},
            "extra_info": {"index": index}}
'''

_EXAMPLE = '''{"question": "What is the capital of France?", "answer": "Paris"}
{"question": "What color is the sky on a clear day?", "answer": "blue"}
{"question": "How many legs does a spider have?", "answer": "8"}
{"question": "What is the opposite of hot?", "answer": "cold"}
'''

_TEST = '''"""Tests of the $name task: ``python -m pytest $name`` from the folder that holds ``$name/``."""

from pathlib import Path

import pytest

import $name  # noqa: F401  (registers the task, its scorer and its data helpers)
from $name.scorer import is_correct
from verl_agentic.config import load_config
from verl_agentic.main_rollout import run
from verl_agentic.reward.scorers import SCORERS
from verl_agentic.tasks.data import DatasetError, load_rows

HERE = Path(__file__).parent


def test_the_scorer():
    score = SCORERS.get("$name")
    assert score("It is Paris.", "Paris") == {"score": 1.0, "acc": 1.0}
    assert score("London", "Paris")["score"] == 0.0


def test_the_rows(tmp_path):
    rows = load_rows(HERE / "example.jsonl", "$name")
    assert len(rows) == 4 and rows[0]["task_type"] == "$name"
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["reward_model"]["ground_truth"] == "Paris"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Where?"}\\n')
    with pytest.raises(DatasetError, match="answer"):
        load_rows(bad, "$name")


def test_a_short_rollout(tmp_path):
    """Real episodes on the embedded model (SmolLM2-135M-Instruct): turns, rewards and scores follow the task."""
    trajectories, summary = run(load_config([
        "imports=[$name]", "task_type=$name", f"data.path={HERE / 'example.jsonl'}", "data.max_samples=2",
        "rollout.max_turns=2", "rollout.max_new_tokens=24", f"output.dir={tmp_path / 'out'}", "output.quiet=true"]))
    assert len(trajectories) == 2
    for t in trajectories:
        right = [is_correct(m["content"], t["ground_truth"]) for m in t["messages"] if m["role"] == "assistant"]
        assert t["error"] is None and not any(right[:-1])  # a retry only after a wrong answer
        assert t["reward"] == float(right[-1])
        assert t["score"] == t["reward"] and t["score_error"] is None  # the scorer agrees with the task
'''


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part) or "Task"


def check_name(name: str) -> None:
    """A new task's name: a fresh Python package name that no registered task or importable module has."""
    if not _NAME.match(name or "") or keyword.iskeyword(name):
        raise ConfigError(f"task name {name!r}: use lowercase letters, digits and _ (a Python package name), "
                          "e.g. my_task")
    if name in TASKS:
        raise ConfigError(f"task {name!r} is registered already ({TASKS.source(name)}); registered: "
                          f"{', '.join(TASKS.names())}")
    if importlib.util.find_spec(name) is not None:
        raise ConfigError(f"a module named {name!r} exists already ({importlib.util.find_spec(name).origin}): "
                          "imports=[...] would import that one; pick another name")


def new_task(name: str, parent: Path = Path(".")) -> Path:
    """Write the task folder ``parent/name`` (see the module docstring); returns it."""
    check_name(name)
    folder = Path(parent) / name
    if folder.exists():
        raise ConfigError(f"{folder} exists already: pick another name or folder (nothing was written)")
    files = {"__init__.py": _INIT, "task.py": _TASK, "scorer.py": _SCORER, "data.py": _DATA,
             "example.jsonl": _EXAMPLE, f"test_{name}.py": _TEST}
    folder.mkdir(parents=True)
    for file, text in files.items():
        (folder / file).write_text(Template(text).substitute(name=name, cls=_class_name(name)))
    return folder


def next_steps(name: str) -> str:
    """What to run once the folder is written (from the folder that holds it)."""
    return "\n".join([
        f"  python -m pytest {name}          # its tests: the scorer, the rows, a short rollout",
        f"  python -m verl_agentic.main_rollout 'imports=[{name}]' task_type={name} data.path={name}/example.jsonl",
        f"  python -m verl_agentic.tasks.data --imports {name} {name} {name}/example.jsonl rows.parquet  # verl's rows",
    ])
