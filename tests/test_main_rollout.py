"""``python -m verl_agentic.main_rollout`` as a user runs it (subprocess, real model, real files)."""

import json
import subprocess
import sys

import pytest

from va_testing import REPO


def _run(*overrides, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", *overrides],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def test_cli_writes_trajectories_summary_and_table(tiny_qwen_dir, tmp_path):
    out = tmp_path / "run"
    # run from another directory: the default data path resolves against the repository
    r = _run(f"model.path={tiny_qwen_dir}", "data.max_samples=3", "rollout.n=2", "rollout.max_turns=2",
             "rollout.max_new_tokens=8", "task.gsm8k.feedback=always_verify", "reward.manager=prime", "reward.num_workers=2",
             f"output.dir={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 6 and {t["task_type"] for t in trajs} == {"gsm8k"}
    assert all(t["num_turns"] == 2 and t["error"] is None for t in trajs)
    summary = json.loads((out / "summary.json").read_text())
    g = summary["tasks"]["gsm8k"]
    assert g["episodes"] == 6 and g["turns_mean"] == 2.0 and g["feedback_turns"] == 1.0
    assert summary["drift"]["episodes_ok"] == 6 and summary["drift"]["injected_differing_tokens"] == 0
    assert summary["backend"]["requests"] == 12
    assert summary["stop_token_ids"] and all(isinstance(i, int) for i in summary["stop_token_ids"])
    assert "reward_mean" in r.stdout and "token exactness: 6/6 episodes ok" in r.stdout
    assert "rollout" in r.stderr  # the progress bar
    # scored by the prime manager: the gsm8k scorer agrees with the task's own reward, sample by sample
    assert summary["reward"]["manager"] == "prime" and summary["reward"]["ok"] == 6
    for t in trajs:
        assert t["score"] == t["reward"] and t["score_error"] is None
        assert t["score_extra"]["acc"] == t["metrics"]["final_correct"]
        assert t["ground_truth"] and t["data_source"] == "openai/gsm8k"


def test_cli_unknown_task_type_lists_registered(tmp_path):
    r = _run("task_type=gsm9k", f"output.dir={tmp_path}")
    assert r.returncode == 2
    assert "unknown task_type 'gsm9k'" in r.stderr and "gsm8k" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("override,message", [
    ("model.path=/no/such/model", "model.path '/no/such/model' does not exist"),
    ("data.path=/no/such/data.jsonl", "dataset '/no/such/data.jsonl' does not exist"),
    ("rollout.backend=trtllm", "unknown rollout.backend 'trtllm'; available: hf"),
    ("task.gsm8k.feedback=maybe", "task.gsm8k.feedback must be one of"),
    ("reward.manager=fancy", "unknown reward manager 'fancy'; registered: naive, prime"),
    ("reward.failure_policy=ignore", "reward.failure_policy must be one of"),
    ("+task.gsm8kk.feedback=retry", "unknown task section task.gsm8kk: no task 'gsm8kk' is registered"),
    ("reward.scorer_kwargs={gsm8kk: {method: strict}}", "reward.scorer_kwargs: no scorer 'gsm8kk' is registered"),
    ("rollout.hf.kv_cache_gb=0", "rollout.hf.kv_cache_gb must be > 0, got 0"),
    ("rollout.hf.weight_dtype=fp8", "rollout.hf.weight_dtype must be one of float32 (fp32), bfloat16 (bf16), int8; got 'fp8'"),
])
def test_cli_bad_input_is_one_clear_line(override, message, tmp_path, tiny_qwen_dir):
    r = _run(override, f"model.path={tiny_qwen_dir}" if "model.path" not in override else "seed=0",
             "data.max_samples=1", "rollout.max_new_tokens=4", f"output.dir={tmp_path}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and "model loaded" not in r.stderr
