"""The inspector on training dirs (metrics.jsonl + rollouts/step_*.jsonl), its plots, and ``--compare``.

The training dir is a real ``main_ppo`` run of the tiny Qwen2 model; rollout dirs are real
``main_rollout`` runs. ``rollout_dir``, ``read_jsonl`` and the report readers are also used by
``test_inspect_browser.py``.
"""

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from va_testing import REPO

STEPS = 2


def rollout_overrides(tiny_qwen_dir, out, *extra):
    return [f"model.path={tiny_qwen_dir}", "data.max_samples=2", "rollout.n=2", "rollout.max_new_tokens=8",
            "rollout.max_turns=2", "task.gsm8k.feedback=always_verify", "output.quiet=true", f"output.dir={out}",
            *extra]


def rollout_dir(tiny_qwen_dir, out, *extra):
    """A real main_rollout output dir (tiny model, 2 prompts x 2 samples, feedback turns unless overridden)."""
    from verl_agentic.main_rollout import load_config, run

    run(load_config(rollout_overrides(tiny_qwen_dir, out, *extra)))
    return Path(out)


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def blob(html_text):
    m = re.search(r'<script type="application/json" id="va-data">(.*?)</script>', html_text, re.S)
    assert m, "data blob missing"
    return json.loads(m.group(1))


def episode_details(html_text, prefix="a"):
    """{i: details} of every per-episode element of run ``prefix``."""
    found = re.findall(r'<script type="application/json" id="va-ep-%s-(\d+)">(.*?)</script>' % prefix, html_text, re.S)
    return {int(i): json.loads(s) for i, s in found}


def plot(data, pid):
    return next(p for p in data["plots"] if p["id"] == pid)


def gaps_of(t):
    return [abs(a - b) for a, b, m in zip(t["response_logprobs"], t["trainer_logprobs"], t["response_mask"]) if m]


@pytest.fixture(scope="module")
def ppo_run(tiny_qwen_dir, tmp_path_factory):
    """A real main_ppo output dir: 2 steps x 2 prompts x 2 samples, feedback turns, trainer-recomputed logprobs."""
    from verl_agentic.main_ppo import train
    from verl_agentic.main_rollout import load_config

    out = tmp_path_factory.mktemp("ppo") / "run"
    train(load_config([f"model.path={tiny_qwen_dir}", "data.max_samples=4", f"trainer.total_steps={STEPS}",
                       "trainer.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=6", "rollout.max_turns=2",
                       "task.gsm8k.feedback=always_verify", "actor.recompute_old_logprobs=true",
                       "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=2", "trainer.save_hf_model=false",
                       "output.quiet=true", f"output.dir={out}"], config_name="ppo"))
    return out, {s: read_jsonl(out / "rollouts" / f"step_{s:06d}.jsonl") for s in range(1, STEPS + 1)}


@pytest.fixture(scope="module")
def two_runs(tiny_qwen_dir, tmp_path_factory):
    """The same prompts under two feedback policies: always_verify (2 turns) and none (1 turn)."""
    base = tmp_path_factory.mktemp("cmp")
    a = rollout_dir(tiny_qwen_dir, base / "verify")
    b = rollout_dir(tiny_qwen_dir, base / "nofeedback", "task.gsm8k.feedback=none")
    return a, b


def test_report_of_a_main_ppo_run(ppo_run, tmp_path, tiny_qwen_dir):
    """Everything the trainer writes reaches the report; the inspector's own per-step numbers (derived from
    rollouts/ when metrics.jsonl lacks a key) follow the trainer's definitions."""
    from verl_agentic.inspect import write_report
    from verl_agentic.inspect.stats import aggregate

    out, by_step = ppo_run
    index = write_report(out, tmp_path / "rep")
    html_text = index.read_text(encoding="utf-8")
    data, details = blob(html_text), episode_details(html_text)
    logged = read_jsonl(out / "metrics.jsonl")
    trajs = [t for s in sorted(by_step) for t in by_step[s]]
    assert data["meta"]["kind"] == "training" and data["meta"]["steps"] == list(range(1, STEPS + 1))
    assert data["meta"]["tokenizer"] == f"tokenizer: {tiny_qwen_dir}"  # summary.json's config
    assert len(data["episodes"]) == len(details) == len(trajs) == STEPS * 4
    for e, t in zip(data["episodes"], trajs):
        det = details[e["i"]]
        assert e["step"] == t["step"] and e["uid"] == t["uid"] and det["response_ids"] == t["response_ids"]
        assert det["mask"] == "".join(map(str, t["response_mask"])) and e["exact"] is True
        assert det["trainer_logprobs"] == [None if x is None else round(x, 3) for x in t["trainer_logprobs"]]
        g = gaps_of(t)
        assert e["gap"] == pytest.approx(sum(g) / len(g), abs=1e-4)
    for pid, key in (("reward", "reward/mean"), ("accuracy", "accuracy/mean"), ("accuracy", "accuracy/first_turn"),
                     ("response_length_steps", "response_length/mean"), ("flips_steps", "flips/wrong_to_right"),
                     ("logprob_gap_steps", "actor/logprob_gap_mean"), ("logprob_gap_steps", "actor/logprob_gap_max")):
        series = next(x for x in plot(data, pid)["series"] if x["name"] == key)
        assert series["source"] == "metrics.jsonl" and series["y"] == [r[key] for r in logged], (pid, key)
    for s, row in zip(sorted(by_step), logged):
        derived = aggregate(by_step[s])
        for key in ("accuracy/mean", "accuracy/first_turn", "turns/mean", "response_length/mean",
                    "response_length/max", "flips/wrong_to_right", "flips/right_to_wrong"):
            assert derived[key] == pytest.approx(row[key]), key
        assert derived["actor/logprob_gap_mean"] == pytest.approx(row["actor/logprob_gap_mean"], abs=1e-5)
        assert derived["actor/logprob_gap_max"] == pytest.approx(row["actor/logprob_gap_max"], abs=1e-5)
    assert "no tool calls" in plot(data, "tool_success_steps")["missing"]
    hist = plot(data, "logprob_gap")  # per-episode distribution: one count per episode
    assert sum(sum(x["y"]) for x in hist["series"]) == len(trajs)
    turns = plot(data, "turns")
    assert turns["categories"] == [str(k) for k in sorted({t["num_turns"] for t in trajs})]
    assert sum(sum(x["y"]) for x in turns["series"]) == len(trajs)
    # every plot with data has its PNG next to the report; plots without data have none
    for p in data["plots"]:
        if "missing" in p:
            assert "png" not in p and not (index.parent / "plots" / f"{p['id']}.png").exists()
        else:
            png = index.parent / p["png"]
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, p["id"]


def test_per_step_values_missing_from_metrics_are_derived(ppo_run, tmp_path):
    """A metrics.jsonl without some keys (and without its last step): those come from rollouts/, marked so."""
    from verl_agentic.inspect import write_report

    out, by_step = ppo_run
    d = tmp_path / "partial"
    shutil.copytree(out, d)
    logged = read_jsonl(out / "metrics.jsonl")
    kept = [{k: v for k, v in r.items() if not k.startswith(("flips/", "actor/logprob_gap", "response_length/"))}
            for r in logged[:-1]]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    data = blob(write_report(d, drift=False).read_text(encoding="utf-8"))
    reward = plot(data, "reward")["series"][0]
    assert reward["source"] == "metrics.jsonl" and reward["y"] == [r["reward/mean"] for r in logged[:-1]] + [None]
    flips = {x["name"]: x for x in plot(data, "flips_steps")["series"]}
    assert {x["source"] for x in flips.values()} == {"rollouts"}
    assert flips["flips/wrong_to_right"]["y"] == [sum(t["metrics"]["flips_wrong_to_right"] for t in by_step[s])
                                                   for s in sorted(by_step)]
    gap = {x["name"]: x["y"] for x in plot(data, "logprob_gap_steps")["series"]}
    length = {x["name"]: x["y"] for x in plot(data, "response_length_steps")["series"]}
    for k, s in enumerate(sorted(by_step)):
        g = [x for t in by_step[s] for x in gaps_of(t)]
        assert gap["actor/logprob_gap_mean"][k] == pytest.approx(sum(g) / len(g))
        assert gap["actor/logprob_gap_max"][k] == pytest.approx(max(g))
        n = [sum(t["response_mask"]) for t in by_step[s]]
        assert length["response_length/mean"][k] == sum(n) / len(n) and length["response_length/max"][k] == max(n)


def test_rollout_dir_plots_say_why_they_are_missing(two_runs, tmp_path):
    from verl_agentic.inspect import write_report

    a, _ = two_runs
    data = blob(write_report(a, tmp_path / "rep", drift=False).read_text(encoding="utf-8"))
    trajs = read_jsonl(a / "trajectories.jsonl")
    steps = [p for p in data["plots"] if p["group"] == "steps"]
    # the 7 step curves and the monitors'
    assert len(steps) == 8 and all("no training steps" in p["missing"] for p in steps)
    assert "no tool calls" in plot(data, "tool_outcomes")["missing"]
    assert "trainer_logprobs" in plot(data, "logprob_gap")["missing"]
    flips = plot(data, "flips")
    assert flips["categories"] == ["wrong -> right", "right -> wrong"]
    assert flips["series"][0]["y"] == [sum(t["metrics"]["flips_wrong_to_right"] for t in trajs),
                                       sum(t["metrics"]["flips_right_to_wrong"] for t in trajs)]
    length = plot(data, "response_length")
    assert sum(length["series"][0]["y"]) == len(trajs)
    assert sorted(p.name for p in (tmp_path / "rep" / "plots").iterdir()) == ["flips.png", "response_length.png",
                                                                             "turns.png"]


def test_tool_outcomes_sum_the_episode_metrics(two_runs, tmp_path):
    """Episodes that report tool calls (numbers set in a copy of real trajectories) give the outcome plot."""
    from verl_agentic.inspect import write_report

    a, _ = two_runs
    d = tmp_path / "tools"
    d.mkdir()
    trajs = read_jsonl(a / "trajectories.jsonl")
    for k, t in enumerate(trajs):
        t["metrics"].update(tool_calls=k + 1, tool_ok=k, tool_error=1, tool_timeout=0, parse_errors=k % 2)
    (d / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajs))
    data = blob(write_report(d, drift=False, tokenizer_path=str(tmp_path / "none")).read_text(encoding="utf-8"))
    p = plot(data, "tool_outcomes")
    n = len(trajs)
    assert p["series"] == [{"name": "gsm8k", "y": [float(sum(range(n))), float(n), 0.0, float(n // 2)]}]
    assert "no config in the run dir" in data["meta"]["tokenizer"] or "token ids shown" in data["meta"]["tokenizer"]


def test_compare_two_feedback_policies(two_runs, capsys):
    from verl_agentic.inspect.__main__ import main
    from verl_agentic.inspect.stats import aggregate

    a, b = two_runs
    assert main([str(a), "--compare", str(b), "--no-drift"]) == 0
    index = a / "compare-nofeedback" / "index.html"
    assert str(index.resolve()) in capsys.readouterr().out
    html_text = index.read_text(encoding="utf-8")
    data = blob(html_text)
    ta, tb = read_jsonl(a / "trajectories.jsonl"), read_jsonl(b / "trajectories.jsonl")
    cmp = data["compare"]
    assert cmp["name_a"] == "A: verify" and cmp["name_b"] == "B: nofeedback"
    assert len(episode_details(html_text, "a")) == len(ta) and len(episode_details(html_text, "b")) == len(tb)
    assert cmp["counts"]["pairs"] == cmp["counts"]["by_id"] == len(ta) == len(tb)
    for p in cmp["pairs"]:
        x, y = ta[p["a"]], tb[p["b"]]
        assert (x["uid"], x["sample_id"]) == (y["uid"], y["sample_id"]) == (p["uid"], p["sample_id"])
        assert p["same_prompt"] and x["prompt_ids"] == y["prompt_ids"]
        assert p["turns_a"] == x["num_turns"] and p["turns_b"] == y["num_turns"] == 1
    rows = {(r["task"], r["metric"]): r for r in cmp["deltas"]}
    turns = rows[("gsm8k", "turns")]
    assert turns["a"] == sum(t["num_turns"] for t in ta) / len(ta) and turns["b"] == 1.0
    assert turns["delta"] == pytest.approx(turns["b"] - turns["a"]) and turns["delta"] < 0
    agg_a, agg_b = aggregate(ta), aggregate(tb)
    for metric, key in (("reward", "reward/mean"), ("accuracy", "accuracy/mean"),
                        ("generated tokens", "response_length/mean")):
        assert rows[("gsm8k", metric)]["a"] == agg_a[key] and rows[("gsm8k", metric)]["b"] == agg_b[key]
    w2r = rows[("gsm8k", "flips wrong->right per episode")]
    assert w2r["a"] == sum(t["metrics"]["flips_wrong_to_right"] for t in ta) / len(ta)
    assert [p["id"] for p in cmp["plots"]] == ["cmp_reward_tasks", "cmp_accuracy_tasks", "cmp_reward_steps"]
    assert "two training runs" in cmp["plots"][2]["missing"]
    assert (index.parent / "plots" / "compare" / "cmp_reward_tasks.png").exists()
    assert (index.parent / "plots" / "b" / "turns.png").exists()


def test_compare_falls_back_to_prompt_ids(two_runs, tmp_path):
    """Episodes without uid/index (or with other uids) are paired by their prompt token ids."""
    from verl_agentic.inspect.compare import pair_episodes

    a, b = two_runs
    ta, tb = read_jsonl(a / "trajectories.jsonl"), read_jsonl(b / "trajectories.jsonl")
    for t in tb:
        t["uid"], t["index"] = None, None
    tb = tb[::-1]  # another order: the pairing must not rely on it
    pairs = pair_episodes(ta, tb)
    assert len(pairs) == len(ta) and all(how == "prompt" for _, _, how in pairs)
    assert all(ta[i]["prompt_ids"] == tb[j]["prompt_ids"] for i, j, _ in pairs)
    assert len({j for _, j, _ in pairs}) == len(tb)
    ta[0]["uid"] = "renamed"  # one episode renamed: the rest still pair by id, it pairs by prompt
    pairs = pair_episodes(ta, read_jsonl(b / "trajectories.jsonl"))
    assert [how for _, _, how in pairs].count("prompt") == 1 and len(pairs) == len(ta)


def test_compare_with_a_task_only_in_one_run(two_runs, tmp_path):
    from verl_agentic.inspect.compare import compare_runs
    from verl_agentic.inspect.plots import write_pngs
    from verl_agentic.inspect.runs import load_run

    a, b = two_runs
    other = tmp_path / "other"
    other.mkdir()
    tb = read_jsonl(b / "trajectories.jsonl")
    tb[0]["task_type"] = "other_task"
    (other / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tb))
    cmp = compare_runs(load_run(a), load_run(other), "A", "B")
    rows = {(r["task"], r["metric"]): r for r in cmp["deltas"]}
    assert rows[("other_task", "reward")]["a"] is None and rows[("other_task", "reward")]["delta"] is None
    assert rows[("other_task", "episodes")]["b"] == 1 and rows[("all", "episodes")]["b"] == len(tb)
    assert rows[("gsm8k", "episodes")]["b"] == len(tb) - 1
    bars = next(p for p in cmp["plots"] if p["id"] == "cmp_reward_tasks")
    assert bars["categories"] == ["gsm8k", "other_task", "all"] and bars["series"][0]["y"][1] is None
    assert [p.name for p in write_pngs(cmp["plots"], tmp_path / "rep")] == ["cmp_reward_tasks.png",
                                                                         "cmp_accuracy_tasks.png"]


def test_compare_two_training_runs_pairs_by_step(ppo_run, tmp_path):
    from verl_agentic.inspect.compare import compare_runs, pair_episodes
    from verl_agentic.inspect.runs import load_run

    d, by_step = ppo_run
    other = tmp_path / "other"
    shutil.copytree(d, other)
    rows = read_jsonl(other / "metrics.jsonl")
    for r in rows:
        r["reward/mean"] += 0.5
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmp = compare_runs(load_run(d), load_run(other), "A", "B")
    assert cmp["with_step"] and cmp["counts"]["pairs"] == cmp["counts"]["by_id"] == STEPS * 4
    assert all(p["a"] == p["b"] for p in cmp["pairs"]) and {p["step"] for p in cmp["pairs"]} == set(by_step)
    steps = next(p for p in cmp["plots"] if p["id"] == "cmp_reward_steps")
    ya, yb = steps["series"][0]["y"], steps["series"][1]["y"]
    assert steps["x"] == sorted(by_step) and all(math.isclose(y - x, 0.5) for x, y in zip(ya, yb))
    # when the same uids come back in every step, only the step keeps the pairs apart
    ta = by_step[1] + [{**t, "step": 2} for t in by_step[1]]
    tb = ta[::-1]
    assert all(ta[i]["step"] == tb[j]["step"] for i, j, _ in pair_episodes(ta, tb, with_step=True))
    assert any(ta[i]["step"] != tb[j]["step"] for i, j, _ in pair_episodes(ta, tb, with_step=False))


def test_bad_training_files_name_the_line(ppo_run, tmp_path, caplog):
    from verl_agentic.interfaces import ConfigError
    from verl_agentic.inspect.runs import load_run

    d, _ = ppo_run
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    with open(bad / "metrics.jsonl", "a") as f:
        f.write('{"reward/mean": 1.0}\n')
    with pytest.raises(ConfigError, match=rf"metrics\.jsonl:{STEPS + 1}: needs an integer 'step'"):
        load_run(bad)
    # a line that is not JSON (what a writer killed mid-line left): named with its line and skipped
    (bad / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    with caplog.at_level("WARNING", logger="verl_agentic.jsonl"):
        assert [s["step"] for s in load_run(bad).steps] == [1]
    assert "metrics.jsonl: line 2 is not valid JSON" in caplog.text and "skipped" in caplog.text
    (bad / "metrics.jsonl").unlink()
    step1 = bad / "rollouts" / "step_000001.jsonl"
    t = read_jsonl(step1)[0]
    del t["response_mask"]
    step1.write_text(json.dumps(t) + "\n")
    r = subprocess.run([sys.executable, "-m", "verl_agentic.inspect", str(bad), "--no-drift"], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "step_000001.jsonl: episode 1 lacks ['response_mask']" in r.stderr


def test_verls_file_logger_metrics_read_as_one_dict_a_step(tmp_path):
    """``read_verl_metrics`` (the GPU check's report and the verl trainer tests read metrics.jsonl with it):
    the rows of a step that verl logged in parts are merged; no file is no steps."""
    from verl_agentic.inspect.runs import read_verl_metrics

    path = tmp_path / "metrics.jsonl"
    assert read_verl_metrics(path) == {}
    path.write_text('{"step": 1, "data": {"a": 1.0}}\n\n{"step": 2, "data": {"a": 2.0}}\n'
                    '{"step": 1, "data": {"b": 3.0}}\n')
    assert read_verl_metrics(path) == {1: {"a": 1.0, "b": 3.0}, 2: {"a": 2.0}}
