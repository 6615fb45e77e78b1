"""Issue 30's "done when": a user's tasks in a folder outside the repository, through ``main_rollout`` and
through verl 0.9.1's trainer on the CPU (one GRPO step), with ``imports``; and docs/migrating.md's verl
command (a verl <= 0.7 interaction YAML and dataset) in the same verl run.

The verl run: ``DEVICE=cpu scripts/run_gsm8k_multiturn.sh`` (verl's ``main_ppo`` with Ray, FSDP2 over
gloo, our ``hf`` rollout) with the page's overrides plus ``+agentic.imports=[my_tasks]``, run from the
user's folder (Ray's workers get the driver's working directory on their ``sys.path``; the tests
folder is not on ``PYTHONPATH``), scored by the ``prime`` manager, whose processes import ``my_tasks``
for its scorer. An agent written with the openai SDK (``my_agents``, issue 39) shares the batch. About 2
minutes on 2 cores (marked ``slow``): one step of 6 prompts x 2.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from va_docs import command_argv, marked_blocks, write_files
from va_testing import REPO
from va_user_tasks import expected_score, user_env, write_user_tasks

pytestmark = pytest.mark.slow  # verl's trainer: not in make test-fast

SCRIPT = REPO / "scripts" / "run_gsm8k_multiturn.sh"
PAGE = REPO / "docs" / "migrating.md"


def _verl_overrides(page_command: str) -> list[str]:
    """The page's ``main_ppo`` overrides, as appended to the launch script: a ``+key`` the script already
    appends is set without the ``+`` (hydra refuses to append a key twice)."""
    argv = command_argv(page_command)
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"], argv[:3]
    script = subprocess.run(["bash", str(SCRIPT), "--print-overrides"], capture_output=True, text=True,
                            env={**user_env(), "DEVICE": "cpu"}, check=True).stdout.split()
    appended = {o.split("=", 1)[0] for o in script if o.startswith("+")}
    return [o[1:] if o.split("=", 1)[0] in appended else o for o in argv[3:]]


def _user_rows(folder) -> list[dict]:
    """The user's rows (my_tasks' two tasks) in verl's dataset layout."""
    rows = []
    for i, line in enumerate((folder / "rows.jsonl").read_text().splitlines()):
        raw = json.loads(line)
        rows.append({"data_source": raw["data_source"], "ability": "demo", "task_type": raw["task_type"],
                     "prompt": [{"role": "user", "content": raw["prompt"]}],
                     "reward_model": {"style": "rule", "ground_truth": raw["ground_truth"]},
                     "extra_info": {"index": i, "interaction_kwargs": None}})
    return rows


def _data_dir(rows: pd.DataFrame, folder):
    """``folder`` with ``rows`` as the launch script's ``train.parquet`` and ``test.parquet``."""
    folder.mkdir()
    for split in ("train", "test"):
        rows.to_parquet(folder / f"{split}.parquet")
    return folder


AGENTS = '''
from verl_agentic.tasks import register_task
from verl_agentic.tasks.agent import agent_task


async def length_agent(row, client):
    """An agent written with the OpenAI SDK: one call, rewarded by the length of the answer. On its second
    row it asks again in a fresh conversation: its episodes make two training rows."""
    reply = await client.chat.completions.create(model="policy", messages=row["prompt"], max_tokens=16)
    calls = 1
    if row["extra_info"]["index"] == 11:
        again = [{"role": "user", "content": "Once more, in other words: " + row["prompt"][-1]["content"]}]
        reply = await client.chat.completions.create(model="policy", messages=again, max_tokens=16)
        calls = 2
    return {"reward": min(1.0, len(reply.choices[0].message.content) / 40), "metrics": {"sdk_calls": calls}}


register_task("length_agent", agent_task(length_agent))
'''


@pytest.mark.slow
def test_a_users_task_folder_through_main_rollout_and_verls_trainer(tiny_qwen_dir, tmp_path):
    """A user's tasks through main_rollout and one GRPO step of verl's trainer (the module's docstring). In
    the same batch of verl's trainer, an agent written with the openai SDK in the user's module (issue 39): the
    gateway runs in verl's agent-loop worker, and each of its episodes is scored by the agent's own reward; on
    one of its two prompts the agent's second call starts a fresh conversation, so each of that prompt's
    episodes is two token-exact rows, both trained on, both with the episode's score."""
    from transformers import AutoTokenizer

    from verl_agentic.models.embedded import embedded_model_dir
    from verl_agentic.rollout import check_drift

    folder = tmp_path / "my_project"  # outside the repository
    write_user_tasks(folder, rows=2)
    (folder / "my_agents.py").write_text(AGENTS)
    files, runs = marked_blocks(PAGE)
    write_files(files, folder)  # the migration guide's interaction class, YAML and dataset script

    # 1. main_rollout, imports=[my_tasks]
    r = subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", "imports=[my_tasks]",
                        f"model.path={tiny_qwen_dir}", "data.path=rows.jsonl", "rollout.max_new_tokens=8",
                        "reward.manager=prime", "reward.num_workers=1", "output.dir=rollout_out", "output.quiet=true"],
                       cwd=folder, env=user_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    trajs = [json.loads(x) for x in (folder / "rollout_out" / "trajectories.jsonl").read_text().splitlines()]
    assert [t["task_type"] for t in trajs] == ["length_task", "named_task"]
    assert all(t["score_error"] is None and t["score"] == pytest.approx(expected_score(t)) for t in trajs)

    # 2. verl's trainer: the page's dataset (2 interaction rows) after the user's 2 rows, one step of 4 prompts
    made = subprocess.run(command_argv(runs["make_rows"]), cwd=folder, env=user_env(), capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    agent_rows = [{"data_source": "my/agent", "ability": "demo", "task_type": "length_agent",
                   "prompt": [{"role": "user", "content": f"Say something about the number {i}."}],
                   "reward_model": {"style": "rule", "ground_truth": "-"},
                   "extra_info": {"index": 10 + i, "interaction_kwargs": None}} for i in range(2)]
    rows = pd.concat([pd.DataFrame(_user_rows(folder)), pd.read_parquet(folder / "rows.parquet"),
                      pd.DataFrame(agent_rows)], ignore_index=True)
    rows.to_parquet(folder / "rows.parquet")
    unused = _data_dir(rows, folder / "unused")  # the script's own gsm8k files: present, so it does not make them
    out = folder / "verl_out"
    env = user_env(DEVICE="cpu", OUT=str(out), DATA_DIR=str(unused), PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        ["bash", str(SCRIPT), *_verl_overrides(runs["verl"]), "+agentic.imports=[my_tasks,my_agents]",
         "agentic.max_new_tokens=24", "data.train_batch_size=6", "data.shuffle=false", "data.val_max_samples=4",
         "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
         "trainer.save_freq=-1", "reward.reward_manager.name=prime", "+reward.agentic.num_workers=1"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=1500)
    (tmp_path / "verl.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]

    # our dump of the step's episodes (step_000000: the policy that generated them) and verl's (each sample's
    # score, decoded text; its uid is the episode's uid plus the sample): the same 6 prompts x rollout.n=2
    episodes = [json.loads(x) for x in (out / "rollouts" / "step_000000.jsonl").read_text().splitlines()]
    dumped = [json.loads(x) for x in (out / "1.jsonl").read_text().splitlines()]
    assert sorted(t["task_type"] for t in episodes) == (["length_agent"] * 4 + ["length_task"] * 2 + ["named_task"] * 2
                                                        + ["tool_agent"] * 4)
    # verl pads the 14 samples to 16 for its workers (copies with a "pad" uid): 12 episodes, 2 of them of 2 rows
    samples = [s for s in dumped if not s["uid"].startswith("pad")]
    assert len(samples) == 14 and len(dumped) in (14, 16)
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir(quiet=True))
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    groups: dict[str, dict] = {}
    for t in episodes:
        groups.setdefault(t["uid"], {"episodes": [], "scores": []})["episodes"].append(t)
    for s in samples:
        groups[s["uid"].rsplit("_", 2)[0]]["scores"].append(s["score"])
    seen = set()
    for group in groups.values():
        eps, scores = group["episodes"], sorted(group["scores"])
        task = eps[0]["task_type"]
        seen.add(task)
        assert len(eps) == 2
        rows = 2 if task == "length_agent" and eps[0]["extra_info"]["index"] == 11 else 1
        assert len(scores) == 2 * rows
        assert all(len(t.get("rows_before") or []) == rows - 1 for t in eps)
        if task == "length_task":  # no scorer: scored by its own episode reward (4 B floats in verl's tensor)
            assert all(t["num_turns"] == 2 and t["reward"] == pytest.approx(expected_score(t)) for t in eps)
            assert scores == pytest.approx(sorted(t["reward"] for t in eps), abs=1e-6)
        elif task == "length_agent":  # the SDK agent: calls of at most 16 tokens each, its reward the score
            for t in eps:
                assert t["error"] is None and t["metrics"]["agent_calls"] == t["metrics"]["sdk_calls"] == rows
                assert t["metrics"]["agent_rows"] == rows
                assert all(0 < sum(r["response_mask"]) <= 16 for r in [*(t.get("rows_before") or []), t])
                assert t["reward"] == pytest.approx(min(1.0, len(t["messages"][-1]["content"]) / 40))
                assert check_drift(t, tokenizer, stop_token_ids=[stop]).ok  # each row, for two
            # each row is a sample of verl's batch with its episode's score (the last row's, given to both)
            assert scores == pytest.approx(sorted(t["reward"] for t in eps for _ in range(rows)), abs=1e-6)
        elif task == "named_task":  # its own scorer, registered by my_tasks in prime's processes, not its reward
            assert all(t["scorer"] == "my_len_scorer" and t["reward"] == 0.5 for t in eps)
            assert scores == sorted(expected_score(t) for t in eps)
        else:  # the verl <= 0.7 interaction: answered each wrong answer; calculate_score is the episode's reward
            for t in eps:
                answers = [m["content"] for m in t["messages"] if m["role"] == "assistant"]
                replies = [m["content"] for m in t["messages"][1:] if m["role"] == "user"]
                wrong = [t["ground_truth"] not in a for a in answers]
                assert replies == ["Your response is incorrect! You need to reflect on your answer and try "
                                   "again."] * sum(wrong[:-1])
                assert t["reward"] == float(not wrong[-1])
            assert scores == sorted(t["reward"] for t in eps)  # no scorer for my/arith: that reward
    assert seen == {"length_agent", "length_task", "named_task", "tool_agent"}
