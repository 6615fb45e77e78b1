"""swedev rows: HumanEval problems or generic instances -> a sandbox instance and its hidden tests.

``extra_info.swedev`` = ``{instance_id, files: [{path, content}], test_command}`` (the visible tests,
may be null) and ``reward_model.ground_truth`` = the hidden tests ``{test_files, test_command}``
(``verl_agentic.sandbox.runtime.HiddenTests``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl_agentic.sandbox.runtime import PASS_MARKER, FileSet, HiddenTests, file_list, file_set
from verl_agentic.tasks.data import PREPROCESS_DATASET, PROMPT_GENERATOR, DatasetError
from verl_agentic.tasks.swedev.scorer import INSTANCE_KEY

HUMANEVAL_SOURCE = "openai/openai_humaneval"
SOLUTION_FILE = "solution.py"
HIDDEN_TEST_FILE = "test_hidden.py"
SYSTEM_PROMPT = ("You are a software engineer working in a sandboxed repository. Use the tools to read and change "
                 "files and to run commands and tests. When the task is done, answer without calling a tool.")
# the docstring examples as the visible tests (prompts without examples report "0 examples")
DOCTEST_COMMAND = ('python -c "import doctest, solution; r = doctest.testmod(solution); '
                   "print(f'{r.attempted} examples, {r.failed} failed'); raise SystemExit(1 if r.failed else 0)\"")
_HUMANEVAL_HIDDEN = '''\
# The hidden tests of {task_id} (HumanEval): written into the sandbox after the model's last turn.
import solution as _solution

globals().update({{k: v for k, v in vars(_solution).items() if not k.startswith("__")}})

{test}

check({entry_point})
print("{marker}")
'''


# --- rows ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instance:
    """What a sandbox is built from."""

    instance_id: str
    files: FileSet
    test_command: Optional[str]  # the visible tests (run_tests)
    problem_statement: str = ""

    def as_extra(self) -> dict:
        return {"instance_id": self.instance_id, "files": file_list(self.files), "test_command": self.test_command}


def _humaneval(raw: dict) -> tuple[Instance, HiddenTests]:
    for key in ("task_id", "prompt", "test", "entry_point"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise DatasetError(f"field {key!r} is missing or empty")
    stub = raw["prompt"] + "    pass\n"
    statement = (f"The repository contains `{SOLUTION_FILE}`:\n\n```python\n{stub}```\n\n"
                 f"Implement `{raw['entry_point']}` in {SOLUTION_FILE} according to its docstring (replace the "
                 "`pass`). Hidden tests will check it after you finish; `run_tests` runs the examples of the "
                 "docstring.")
    hidden = _HUMANEVAL_HIDDEN.format(task_id=raw["task_id"], test=raw["test"].strip("\n"),
                                      entry_point=raw["entry_point"], marker=PASS_MARKER)
    return (Instance(raw["task_id"], {SOLUTION_FILE: stub}, DOCTEST_COMMAND, statement),
            HiddenTests({HIDDEN_TEST_FILE: hidden}, f"python {HIDDEN_TEST_FILE}"))


def _generic(raw: dict) -> tuple[Instance, HiddenTests]:
    iid, statement = raw.get("instance_id"), raw.get("problem_statement")
    if not isinstance(iid, str) or not iid:
        raise DatasetError("field 'instance_id' is missing or empty")
    if not isinstance(statement, str) or not statement.strip():
        raise DatasetError("field 'problem_statement' is missing or empty")
    try:
        files = file_set(raw.get("files"), "files")
        hidden = HiddenTests.from_ground_truth(raw.get("hidden_tests"), "hidden_tests")
    except ValueError as e:
        raise DatasetError(str(e)) from None
    test_command = raw.get("test_command")
    if test_command is not None and not isinstance(test_command, str):
        raise DatasetError("field 'test_command' must be a string or null")
    return Instance(iid, files, test_command, statement.strip()), hidden


def _parse_raw(raw: dict) -> tuple[Instance, HiddenTests]:
    if "entry_point" in raw and "test" in raw:
        return _humaneval(raw)
    if "instance_id" in raw:
        return _generic(raw)
    raise DatasetError("not a swedev instance: expected a HumanEval row (task_id, prompt, test, entry_point) or "
                       "(instance_id, problem_statement, files, hidden_tests)")


def _messages(instance: Instance) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Task {instance.instance_id}. {instance.problem_statement}"}]


@PROMPT_GENERATOR.register("swedev")
def swedev_prompt(raw: dict) -> list[dict]:
    return _messages(_parse_raw(raw)[0])


@PREPROCESS_DATASET.register("swedev")
def swedev_preprocess(raw: dict, index: int) -> dict:
    """A HumanEval row or a generic instance -> a rollout row (see the module docstring)."""
    instance, hidden = _parse_raw(raw)
    return {
        "data_source": HUMANEVAL_SOURCE if "entry_point" in raw else raw.get("data_source", "swedev"),
        "task_type": "swedev",
        "prompt": _messages(instance),  # parsed once here; swedev_prompt is the same for a raw row alone
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": hidden.as_dict()},
        "extra_info": {"index": index, "instance_id": instance.instance_id, INSTANCE_KEY: instance.as_extra()},
    }


def instance_from_row(row: dict) -> tuple[Instance, HiddenTests]:
    """The instance and hidden tests of a rollout row; DatasetError naming the field."""
    spec = (row.get("extra_info") or {}).get(INSTANCE_KEY)
    if not isinstance(spec, dict):
        raise DatasetError(f"field 'extra_info.{INSTANCE_KEY}' is missing: preprocess the rows with "
                           "PREPROCESS_DATASET['swedev']")
    try:
        files = file_set(spec.get("files"), f"extra_info.{INSTANCE_KEY}.files")
        hidden = HiddenTests.from_ground_truth((row.get("reward_model") or {}).get("ground_truth"),
                                               "reward_model.ground_truth")
    except ValueError as e:
        raise DatasetError(str(e)) from None
    iid = spec.get("instance_id")
    if not isinstance(iid, str) or not iid:
        raise DatasetError(f"field 'extra_info.{INSTANCE_KEY}.instance_id' is missing or empty")
    return Instance(iid, files, spec.get("test_command")), hidden
