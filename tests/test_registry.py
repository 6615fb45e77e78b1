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
