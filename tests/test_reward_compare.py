"""scripts/compare_reward_managers.sh end to end: three managers, a real reward server, table + PNG."""

import json
import os
import subprocess
import sys

from va_testing import REPO


def _trajectories(n: int) -> list[dict]:
    out = []
    for i in range(n):
        truth = str(3 * i + 1)
        answer = [f"#### {truth}", f"#### {int(truth) + 2}", "I do not know", f"it is {truth}"][i % 4]
        out.append({"uid": f"u{i}", "task_type": "gsm8k", "index": i, "sample_id": 0, "data_source": "openai/gsm8k",
                    "ground_truth": truth, "extra_info": {"index": i}, "num_turns": 2,
                    "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 0"},
                                 {"role": "user", "content": "Are you sure?"},
                                 {"role": "assistant", "content": answer}]})
    return out


def test_compare_script_agrees_and_writes_table_and_chart(tmp_path):
    traj = tmp_path / "trajectories.jsonl"
    traj.write_text("".join(json.dumps(t) + "\n" for t in _trajectories(40)))
    out = tmp_path / "cmp"
    r = subprocess.run(["bash", str(REPO / "scripts" / "compare_reward_managers.sh"), str(traj), str(out),
                        "--repeat", "5", "--workers", "2", "--quiet"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "comparison.json").read_text())
    assert report["samples"] == 200 and report["all_agree"] is True
    assert set(report["managers"]) == {"naive", "prime", "swedev"}
    for m in report["managers"].values():
        assert m["agree_with_naive"] == 200 and m["failures"] == {} and m["samples_per_s"] > 0
        assert m["score_mean"] == 0.5  # right, wrong, none, right (flexible) per 4
    assert (out / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| swedev |" in (out / "comparison.md").read_text() and "all managers agree: **yes**" in r.stdout


def test_compare_reports_disagreement_with_exit_1(tmp_path):
    """A nondeterministic scorer makes the managers disagree: the script says so and exits 1."""
    trajs = _trajectories(6)
    for t in trajs:
        t["extra_info"]["fault"] = "random"
    traj = tmp_path / "t.jsonl"
    traj.write_text("".join(json.dumps(t) + "\n" for t in trajs))
    r = subprocess.run([sys.executable, "-m", "verl_agentic.reward.compare", str(traj), "--out", str(tmp_path / "o"),
                        "--managers", "naive,prime", "--workers", "1", "--scorer", "faulty",
                        "--scorer-module", "va_faulty_scorers", "--quiet"],
                       capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads((tmp_path / "o" / "comparison.json").read_text())
    assert report["all_agree"] is False and report["managers"]["prime"]["agree_with_naive"] == 0
    assert "all managers agree: **NO**" in r.stdout


def test_compare_bad_input_is_exit_2(tmp_path):
    r = subprocess.run(["bash", str(REPO / "scripts" / "compare_reward_managers.sh"), str(tmp_path / "none.jsonl"),
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2 and "does not exist" in r.stderr
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"messages": [], "task_type": "gsm8k"}) + "\n")
    r = subprocess.run(["bash", str(REPO / "scripts" / "compare_reward_managers.sh"), str(old), str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2 and "trajectory 0: no 'ground_truth'" in r.stderr
