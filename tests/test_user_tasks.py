"""A user's own task, one option away (issue 30): ``imports=[...]`` in main_rollout and main_ppo (Ray's
workers and prime's processes included), ``main()`` called from a user's script, a task without a
scorer scored by its own episode reward, a task that names its scorer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from va_user_tasks import expected_score, user_env, write_user_tasks
from verl_agentic.interfaces import ConfigError, EpisodeResult, EpisodeState, Observation


def _trajectories(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


def _check_scores(trajs: list[dict], n: int) -> None:
    assert len(trajs) == n and {t["task_type"] for t in trajs} == {"length_task", "named_task"}
    for t in trajs:
        assert t["score_error"] is None, t["score_error"]
        assert t["score"] == pytest.approx(expected_score(t))
        if t["task_type"] == "length_task":  # no scorer: its own episode reward
            assert t["score"] == t["reward"] and t["score_extra"] == {"scored_by": "episode_reward"}
            assert "scorer" not in t
        else:  # its named scorer, not its reward (always 0.5) nor a data_source lookup
            assert t["reward"] == 0.5 and t["scorer"] == "my_len_scorer" and t["score"] in (0.0, 1.0)


def test_main_rollout_imports_a_users_module_from_the_cli_and_from_a_script(tiny_qwen_dir, tmp_path):
    folder = tmp_path / "my_project"  # outside the repository, not on PYTHONPATH
    data = write_user_tasks(folder)
    common = [f"model.path={tiny_qwen_dir}", f"data.path={data}", "task_type=length_task", "rollout.max_new_tokens=8",
              "reward.manager=prime", "reward.num_workers=1"]
    # 1. the command line
    cli = subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", "imports=[my_tasks]", *common,
                          "output.dir=out_cli"], capture_output=True, text=True, cwd=folder, env=user_env(), timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]
    trajs = _trajectories(folder / "out_cli")
    _check_scores(trajs, 4)
    summary = json.loads((folder / "out_cli" / "summary.json").read_text())
    # the summary says which tasks were scored by their episode reward, and how many samples
    assert summary["reward"]["scored_by_episode_reward_tasks"] == ["length_task"]
    assert summary["reward"]["scored_by_episode_reward"] == 2 and summary["reward"]["ok"] == 4
    assert "error/unknown_scorer" not in summary["reward"]
    assert "no scorer is registered for task(s) length_task" in cli.stderr
    # 2. main() from the user's own script (hydra used to fail: "Primary config module 'verl_agentic.config'
    # not found"); the same run, so the same scores
    (folder / "run.py").write_text(
        "from verl_agentic.main_rollout import main\n"
        f"main(['imports=[my_tasks]', *{common!r}, 'output.dir=out_script', 'output.quiet=true'])\n")
    script = subprocess.run([sys.executable, "run.py"], capture_output=True, text=True, cwd=folder, env=user_env(),
                            timeout=600)
    assert script.returncode == 0, script.stderr[-3000:]
    again = _trajectories(folder / "out_script")
    assert [t["score"] for t in again] == [t["score"] for t in trajs]
    assert [t["response_ids"] for t in again] == [t["response_ids"] for t in trajs]
    # 3. without imports, the task is unknown: one clear line naming the registered ones
    bad = subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", *common, "output.dir=out_bad"],
                         capture_output=True, text=True, cwd=folder, env=user_env(), timeout=300)
    assert bad.returncode == 2 and "unknown task_type 'length_task'" in bad.stderr and "gsm8k" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.serial  # a Ray cluster of its own
def test_main_ppo_imports_a_users_module_in_its_ray_workers(tiny_smol_dir, tmp_path):
    """trainer.use_ray: the rollout actor and the reward actor's prime processes import my_tasks too."""
    folder = tmp_path / "my_project"
    data = write_user_tasks(folder)
    (folder / "train.py").write_text(
        "from verl_agentic.main_ppo import main\n"
        f"main(['imports=[my_tasks]', 'model.path={tiny_smol_dir}', 'data.path={data}', 'data.max_samples=4',\n"
        "      'task_type=length_task', 'trainer.total_steps=1', 'trainer.batch_size=2', 'rollout.n=2',\n"
        "      'rollout.max_new_tokens=8', 'actor.ppo_mini_batch_size=4', 'actor.ppo_micro_batch_size=4',\n"
        "      'trainer.use_ray=true', 'trainer.ray_init.num_cpus=2', 'trainer.val_before_train=false',\n"
        "      'reward.manager=prime', 'reward.num_workers=1', 'trainer.save_hf_model=false', 'output.dir=out',\n"
        "      'output.quiet=true'])\n")
    r = subprocess.run([sys.executable, "train.py"], capture_output=True, text=True, cwd=folder, env=user_env(),
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    trajs = [json.loads(x) for x in (folder / "out" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(trajs) == 4
    for t in trajs:
        assert t["score_error"] is None and t["score"] == pytest.approx(expected_score(t))
    assert any(t["task_type"] == "length_task" and t["score_extra"] == {"scored_by": "episode_reward"} for t in trajs)


def test_an_import_that_fails_is_a_clear_error(tmp_path, monkeypatch):
    from verl_agentic.config import RunConfig, load_config

    with pytest.raises(ConfigError, match=r"imports: cannot import 'no_such_user_module'.*PYTHONPATH"):
        RunConfig.parse(load_config(["imports=[no_such_user_module]"]))
    (tmp_path / "broken_user_module.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"cannot import 'broken_user_module': importing it raised "
                                          r"ModuleNotFoundError: No module named 'no_such_dependency_xyz'"):
        RunConfig.parse(load_config(["imports=broken_user_module"]))


def test_a_task_naming_an_unregistered_scorer_fails_before_the_model_loads(tmp_path):
    from verl_agentic.config import load_config
    from verl_agentic.main_rollout import run
    from verl_agentic.tasks import TASKS, TaskSpec, register_task

    def start(row, ctx):
        return EpisodeState(row=row, messages=list(row["prompt"]), ctx=ctx)

    register_task("names_a_missing_scorer", TaskSpec(start=start, obs=lambda s, o: Observation(done=True),
                                                     end=lambda s: EpisodeResult(reward=0.0), scorer="no_such_scorer"))
    try:
        data = tmp_path / "rows.jsonl"
        data.write_text(json.dumps({"prompt": "Hi.", "ground_truth": "1"}) + "\n")
        with pytest.raises(ConfigError, match="task 'names_a_missing_scorer' names the scorer 'no_such_scorer', "
                                              "which is not registered; registered: .*gsm8k"):
            run(load_config([f"data.path={data}", "task_type=names_a_missing_scorer", f"output.dir={tmp_path / 'o'}",
                             "model.path=/no/model/needed/before/this/check"]))
        # a TaskSpec checks its own field
        with pytest.raises(ConfigError, match="TaskSpec.scorer must be a scorer's name"):
            TaskSpec(start=start, obs=start, end=start, scorer=3)
    finally:
        TASKS.unregister("names_a_missing_scorer")


def test_episode_reward_is_the_score_only_when_no_scorer_is_named_or_registered():
    from verl_agentic.reward import RewardItem, make_reward_manager

    items = [RewardItem("x", "1", data_source="nobody/has", task_type="no_task", episode_reward=0.25),
             RewardItem("x", "1", data_source="nobody/has", task_type="no_task", episode_reward=None),
             RewardItem("x", "1", task_type="no_task", scorer="no_such_scorer", episode_reward=0.25),
             RewardItem("#### 1", "1", data_source="openai/gsm8k", episode_reward=0.25)]
    for manager in ("naive", "prime"):
        with make_reward_manager({"manager": manager, "num_workers": 1, "progress": False}) as m:
            a, b, c, d = m.score_items(items)
            stats = m.stats()
        assert (a.score, a.extra, a.error) == (0.25, {"scored_by": "episode_reward"}, None)
        assert b.error.type == "unknown_scorer" and c.error.type == "unknown_scorer"  # named: never a silent fallback
        assert d.score == 1.0 and d.error is None  # a registered scorer wins over the episode reward
        assert stats["scored_by_episode_reward"] == 1 and stats["error/unknown_scorer"] == 2
    # the remote protocol carries it (a reward server validates the field)
    assert RewardItem.from_dict(items[0].as_dict()) == items[0]
    with pytest.raises(ValueError, match="episode_reward"):
        RewardItem.from_dict({**items[0].as_dict(), "episode_reward": "high"})
