import subprocess
import sys

import pytest

from verl_agentic.agentic_utils import PREPROCESS_DATASET, PROMPT_GENERATOR
from verl_agentic.interfaces import ConfigError, EpisodeResult, EpisodeState, Observation
from verl_agentic.registry import Registry
from verl_agentic.tasks import TASKS, TaskSpec, get_task, register_task
from verl_agentic.rollout.loops import default_gen, ids_agent_loop


def test_builtin_gsm8k_registered_with_default_gen_and_loop():
    spec = get_task("gsm8k")
    assert spec.gen is default_gen and spec.loop is ids_agent_loop
    assert "gsm8k" in PROMPT_GENERATOR and "gsm8k" in PREPROCESS_DATASET


def test_unknown_task_lists_registered():
    with pytest.raises(ConfigError) as e:
        get_task("gsm9k")
    assert "gsm9k" in str(e.value) and "gsm8k" in str(e.value)


def test_register_class_sync_and_async_methods():
    @register_task("_test_class_task")
    class Echo:
        def start(self, row, ctx):
            return EpisodeState(row=row, messages=row["prompt"], ctx=ctx)

        async def obs(self, state, out):
            return Observation(done=True)

        def end(self, state):
            return EpisodeResult(1.0)

    try:
        spec = get_task("_test_class_task")
        assert spec.name == "_test_class_task"
        assert spec.start.__self__.__class__ is Echo
        assert spec.loop is ids_agent_loop
    finally:
        TASKS.unregister("_test_class_task")


def test_duplicate_registration_names_both_definitions():
    def start_a(row, ctx): ...
    def start_b(row, ctx): ...
    def obs(state, out): ...
    def end(state): ...

    register_task("_test_dup", TaskSpec(start=start_a, obs=obs, end=end))
    try:
        with pytest.raises(ConfigError) as e:
            register_task("_test_dup", TaskSpec(start=start_b, obs=obs, end=end))
        msg = str(e.value)
        assert "start_a" in msg and "start_b" in msg and "test_registry.py" in msg
        # the same definition again (a module imported twice) is fine
        register_task("_test_dup", TaskSpec(start=start_a, obs=obs, end=end))
        # an explicit override is allowed
        register_task("_test_dup", TaskSpec(start=start_b, obs=obs, end=end), replace=True)
        assert get_task("_test_dup").start is start_b
    finally:
        TASKS.unregister("_test_dup")


def test_task_class_missing_methods_is_clear():
    with pytest.raises(ConfigError, match="lacks obs, end"):
        @register_task("_test_bad")
        class Bad:
            def start(self, row, ctx): ...


def test_taskspec_requires_callables():
    with pytest.raises(ConfigError, match="TaskSpec.obs must be callable"):
        TaskSpec(start=lambda r, c: None, obs=None, end=lambda s: None)


def test_entry_point_plugin_is_discovered(tmp_path):
    """A third-party package registers through the entry-point group, with no edit here."""
    pkg = tmp_path / "myplugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from verl_agentic.tasks import TaskSpec\n"
        "from verl_agentic.interfaces import EpisodeResult, Observation\n"
        "TASK = TaskSpec(start=lambda r, c: None, obs=lambda s, o: Observation(done=True),"
        " end=lambda s: EpisodeResult(0.0))\n"
    )
    dist = tmp_path / "myplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[verl_agentic.tasks]\nplugin_task = myplugin:TASK\n")
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from verl_agentic.tasks import TASKS\n"
            "print(TASKS.names()); print(TASKS.source('plugin_task'))\n") % str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "'plugin_task'" in out and "'gsm8k'" in out
    assert "entry point myplugin:TASK" in out


def test_tasks_cli_lists_tasks():
    out = subprocess.run([sys.executable, "-m", "verl_agentic.tasks"], capture_output=True, text=True, check=True)
    assert "gsm8k" in out.stdout and "ids_agent_loop" in out.stdout and "preprocess" in out.stdout


def test_generic_registry_errors():
    reg = Registry("widget")
    reg.register("a", 1, source="here")
    with pytest.raises(ConfigError, match="registered twice: first by here, again by there"):
        reg.register("a", 2, source="there")
    with pytest.raises(ConfigError, match="unknown widget 'b'; registered: a"):
        reg["b"]
    assert list(reg) == ["a"] and len(reg) == 1 and "a" in reg


def test_builtins_are_found_through_entry_points_from_a_lower_layer():
    """A process that imports only the registries still finds the built-ins: gsm8k's scorer and
    interactions (in the task's folder), the tools, the parsers and the reward managers, each
    registry importing them through its entry points."""
    code = ("import sys\n"
            "from verl_agentic.reward.scorers import SCORERS\n"
            "from verl_agentic.interactions.registry import load_interactions\n"
            "print('before', 'verl_agentic.tasks.gsm8k' in sys.modules)\n"
            "print('scorer', SCORERS.source('openai/gsm8k'))\n"
            "print('interaction', type(load_interactions('code_verify').by_name['code_verify']).__module__)\n"
            "from verl_agentic.tools.parsers.base import get_parser\n"
            "from verl_agentic.tools.registry import load_tools\n"
            "from verl_agentic.reward.base import REWARD_MANAGERS\n"
            "print('parser', type(get_parser('python_code')).__module__)\n"
            "print('tool', type(load_tools([{'class_name': 'calculator'}])[0]).__module__)\n"
            "print('managers', REWARD_MANAGERS.names())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "parser verl_agentic.tools.parsers.python_code" in out and "tool verl_agentic.tools.calculator" in out
    assert "managers ['naive', 'prime', 'remote', 'swedev']" in out
    assert "before False" in out
    assert "scorer verl_agentic.tasks.gsm8k.scorer.gsm8k_score" in out
    assert "interaction verl_agentic.tasks.gsm8k.interactions" in out


def test_a_registry_of_modules_only_ignores_entry_point_objects(tmp_path):
    """The data registries share the tasks' entry-point group: a task object there is not a prompt generator."""
    pkg = tmp_path / "objplugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("OBJ = object()\n")
    dist = tmp_path / "objplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: objplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[va_test_group]\nthing = objplugin:OBJ\n")
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from verl_agentic.registry import Registry\n"
            "print(Registry('a', 'va_test_group').names(), Registry('b', 'va_test_group', modules_only=True).names())\n"
            ) % str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['thing'] []"


def test_preprocess_row_uses_the_task_prompt_generator_and_the_defaults():
    from verl_agentic.tasks.data import DatasetError, preprocess_row
    from verl_agentic.tasks.gsm8k import gsm8k_prompt

    raw = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
    row = preprocess_row(raw, 7, "gsm8k")  # gsm8k's preprocessor leaves the prompt to gsm8k_prompt
    assert list(row) == ["data_source", "task_type", "prompt", "ability", "reward_model", "extra_info"]
    assert row["prompt"] == gsm8k_prompt(raw) and row["reward_model"]["ground_truth"] == "5"
    # a task with neither: the default preprocessor and prompt generator
    row = preprocess_row({"prompt": "Say hi.", "ground_truth": "hi", "level": 2}, 3, "tool_agent")
    assert row["prompt"] == [{"role": "user", "content": "Say hi."}] and row["task_type"] == "tool_agent"
    assert row["reward_model"]["ground_truth"] == "hi" and row["extra_info"] == {"index": 3, "level": 2}
    assert "default" in PROMPT_GENERATOR and "default" in PREPROCESS_DATASET
    with pytest.raises(DatasetError, match="field 'ground_truth'"):
        preprocess_row({"prompt": "Say hi."}, 0, "tool_agent")
    with pytest.raises(DatasetError, match="field 'question'"):
        preprocess_row({"answer": "#### 5"}, 0, "gsm8k")


def test_gsm8k_interaction_texts_are_whole():
    """The closing text once lost everything after its backslash (a string cut by a stray quote)."""
    from verl_agentic.tasks.gsm8k.interactions import DEFAULT_TERMINATE

    assert DEFAULT_TERMINATE.endswith('after "####".')


def test_an_install_without_the_builtin_entry_points_says_so(tmp_path):
    """Stale package metadata (pyproject.toml changed, no reinstall) shadowing the install: the error says what to do."""
    dist = tmp_path / "verl_agentic-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: verl-agentic\nVersion: 0.1.0\n")
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from verl_agentic.tasks import get_task\n"
            "get_task('gsm8k')\n") % str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0
    assert "unknown task_type 'gsm8k'; registered: (none)" in r.stderr and "pip install -e ." in r.stderr
