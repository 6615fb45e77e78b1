"""docs/migrating.md for verl <= 0.7 users: its files and commands, run as the page shows them (the verl
trainer command: tests/test_verl_user_tasks.py), and the compatibility it promises."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

import pytest
from omegaconf import OmegaConf

from va_docs import command_argv, marked_blocks, write_files
from va_testing import REPO
from va_user_tasks import user_env
from verl_agentic.interactions import BaseInteraction, call_with_instance, load_interactions
from verl_agentic.interfaces import ConfigError

PAGE = REPO / "docs" / "migrating.md"


def test_the_pages_interaction_yaml_and_dataset_run_in_main_rollout(tmp_path):
    files, runs = marked_blocks(PAGE)
    assert set(files) == {"my_interaction.py", "interaction.yaml", "make_rows.py"}
    assert {"make_rows", "main_rollout", "verl", "removed_key"} <= set(runs)
    write_files(files, tmp_path)
    for label in ("make_rows", "main_rollout"):
        r = subprocess.run(command_argv(runs[label]), cwd=tmp_path, env=user_env(), capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, f"{label}: {r.stderr[-3000:]}"
    out = tmp_path / "outputs" / "migrated"
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 2 and {t["task_type"] for t in trajs} == {"tool_agent"}
    for t in trajs:
        assert t["error"] is None and t["reward"] in (0.0, 1.0)
        answers = [m["content"] for m in t["messages"] if m["role"] == "assistant"]
        replies = [m["content"] for m in t["messages"][1:] if m["role"] == "user"]
        # the interaction's verdict on each answer: wrong ones got its retry message (all but a last one)
        wrong = [t["ground_truth"] not in a for a in answers]
        assert replies == ["Your response is incorrect! You need to reflect on your answer and try again."] * \
            sum(wrong[:-1])
        assert t["reward"] == float(not wrong[-1])  # calculate_score of the last answer is the episode's reward
        # no scorer for data_source my/arith: scored by that reward, and the summary says so
        assert t["score"] == t["reward"] and t["score_extra"] == {"scored_by": "episode_reward"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward"]["scored_by_episode_reward_tasks"] == ["tool_agent"]


def test_a_removed_verl_key_names_its_replacement():
    _, runs = marked_blocks(PAGE)
    r = subprocess.run(command_argv(runs["removed_key"]), env=user_env(), capture_output=True, text=True,
                       timeout=300, cwd=REPO)
    assert r.returncode == 2, r.stderr[-3000:]
    assert ("error: actor_rollout_ref.rollout.multi_turn.interaction_config_path no longer exists in verl 0.9.1; "
            "use +agentic.task.tool_agent.interaction=") in r.stderr
    assert "not in struct" not in r.stderr and "Traceback" not in r.stderr


def test_the_key_table_matches_verl_0_9_1s_config():
    """Every removed key is absent from verl 0.9.1's trainer config, every kept one is there."""
    import verl
    from pathlib import Path

    from verl_agentic.verl_plugin.removed_keys import REMOVED, removed_key_messages

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    for key in REMOVED:
        parent, _, leaf = key.rpartition(".")
        assert OmegaConf.select(cfg, parent) is not None and leaf not in OmegaConf.select(cfg, parent), key
        assert f"`{key}=" in PAGE.read_text()  # the page's table lists it
    for kept in ("max_assistant_turns", "max_user_turns", "tool_config_path", "format", "enable"):
        assert kept in cfg.actor_rollout_ref.rollout.multi_turn, kept
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop is not None
    # the check reads overrides, whatever their prefix, and nothing else
    assert len(removed_key_messages(["+actor_rollout_ref.rollout.multi_turn.interaction_config_path=a.yaml",
                                     "actor_rollout_ref.rollout.multi_turn.max_user_turns=2", "--help"])) == 1


def test_the_plugins_checks_read_overrides_one_way():
    """removed_keys and cluster_imports both read verl's command line with ``command_line.overrides``."""
    from verl_agentic.verl_plugin import cluster_imports, removed_keys
    from verl_agentic.verl_plugin.command_line import overrides

    assert overrides(["+a.b=1", "~c=2", "d=x=y", "--help", "~e"]) == {"a.b": "1", "c": "2", "d": "x=y"}
    assert removed_keys.overrides is overrides and cluster_imports.overrides is overrides


class VerlBaseShape(BaseInteraction):
    """A class shaped like verl's base class: calculate_score and finalize_interaction without the id."""

    finalized = 0

    async def generate_response(self, instance_id, messages, **kwargs):
        return True, "", 0.5, {}

    async def calculate_score(self) -> float:
        return 0.25

    async def finalize_interaction(self) -> None:
        VerlBaseShape.finalized += 1


def test_base_interaction_behaves_as_verls_attribute_for_attribute(tmp_path, monkeypatch):
    config = {"threshold": 3}
    it = BaseInteraction(config)
    assert it.config == {"threshold": 3} and it.name == "interaction_agent"  # verl's default name
    assert BaseInteraction({"name": "arith"}).name == "arith"

    async def lifecycle():
        given = await it.start_interaction("abc", query="q")
        fresh = await it.start_interaction(None)
        terminate, response, score, meta = await it.generate_response(given, [{"role": "assistant", "content": "x"}])
        return given, fresh, (terminate, response, score, meta)

    given, fresh, result = asyncio.run(lifecycle())
    assert given == "abc" and str(uuid.UUID(fresh)) == fresh  # a uuid4 string, as verl's
    assert isinstance(result[0], bool) and isinstance(result[1], str) and isinstance(result[3], dict)
    # both of verl's shapes of calculate_score / finalize_interaction are called right
    shaped = VerlBaseShape({"name": "v"})
    assert asyncio.run(call_with_instance(shaped.calculate_score, "id")) == 0.25
    asyncio.run(call_with_instance(shaped.finalize_interaction, "id"))
    assert VerlBaseShape.finalized == 1
    assert asyncio.run(call_with_instance(it.calculate_score, "abc")) == 0.0

    # a module still importing verl's removed base class: the error says which line to change
    (tmp_path / "old_style_interaction.py").write_text(
        "from verl.interactions.base import BaseInteraction\n\n\nclass Old(BaseInteraction):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="verl removed verl.interactions in 0.8: .*from verl_agentic.interactions "
                                          "import BaseInteraction"):
        load_interactions([{"name": "old", "class_name": "old_style_interaction.Old"}])
