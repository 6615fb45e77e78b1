"""The reward-hacking and collapse monitors (verl_agentic/monitors): each monitor's statistic and
threshold, the batch summary both trainers feed them, the table of bench/RESULTS.md (the committed
runs replayed), and the monitors online in a real ``main_ppo`` run, stop rule included. The hook
inside verl's trainer is tested in tests/test_verl_agent_loop.py (in-process) and
tests/test_verl_cpu.py (a real run)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from va_testing import REPO
from verl_agentic.interfaces import ConfigError
from verl_agentic.monitors import (
    MonitorsConfig,
    answer_key,
    batch_summary,
    from_metrics,
    heldout_summary,
    make_monitors,
)


def _replay(summaries: list[dict], **config) -> tuple[dict, list]:
    """first firing step per monitor, and every firing, of a sequence of step summaries (step = index + 1)"""
    monitors = make_monitors(MonitorsConfig(**config))
    fired = []
    for step, s in enumerate(summaries, 1):
        fired += monitors.observe(step, s)
    return monitors.first_fired, fired


def _steady(n: int, **values) -> list[dict]:
    base = {"batch/prompts": 8.0, "batch/answer_top_share": 0.1, "batch/first_answer_top_share": 0.1,
            "batch/reward_mean": 0.2, "batch/reward_without_correct": 0.0, "batch/gen_tokens_per_turn": 20.0,
            "batch/entropy": 0.7, "batch/kl_ref": 0.0, "batch/tool_calls_per_turn": 1.0}
    return [dict(base, **values) for _ in range(n)]


def test_a_steady_run_fires_nothing_and_every_monitor_reports_its_statistic():
    first, fired = _replay(_steady(12))
    assert first == {} and fired == []
    monitors = make_monitors()
    for step, s in enumerate(_steady(8), 1):
        monitors.observe(step, s)
    assert set(monitors.metrics()) >= {"monitor/answer_collapse", "monitor/entropy_collapse", "monitor/kl_acceleration",
                                       "monitor/length_exploitation", "monitor/tool_call_spam"}
    assert monitors.metrics()["monitor/entropy_collapse"] == pytest.approx(1.0)


@pytest.mark.parametrize("name,key,values,expect", [
    # the batch's most common answer: final or first, whichever is more common
    ("answer_collapse", "batch/answer_top_share", [0.1, 0.2, 0.49, 0.5, 0.9], 4),
    ("answer_collapse", "batch/first_answer_top_share", [0.1, 0.3, 0.8, 0.9, 0.9], 3),
    ("reward_without_correct", "batch/reward_without_correct", [0.0, 0.1, 0.24, 0.3, 0.3], 4),
    ("tool_call_spam", "batch/tool_calls_per_turn", [1.0, 1.0, 2.9, 3.5, 1.0], 4),
    # relative to the mean of the first 3 steps (20 tokens, entropy 0.7)
    ("length_exploitation", "batch/gen_tokens_per_turn", [20, 20, 20, 25, 29, 30, 40], 6),
    ("entropy_collapse", "batch/entropy", [0.7, 0.7, 0.7, 0.3, 0.08, 0.06, 0.05], 6),
    # KL rising 0.01 a step, then 0.05 a step: the last 3 steps' rise over the 3 before
    ("kl_acceleration", "batch/kl_ref", [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.11, 0.16, 0.21], 9),
])
def test_each_monitor_fires_where_its_statistic_crosses_its_threshold(name, key, values, expect):
    summaries = _steady(len(values))
    for s, v in zip(summaries, values):
        s[key] = float(v)
    first, fired = _replay(summaries)
    assert first == {name: expect}
    assert [f.monitor for f in fired].count(name) == 1  # one warning while it stays past the threshold
    line = fired[0].line()
    assert line.startswith(f"monitor {name} fired at step {expect}: ") and "\n" not in line
    # a threshold of the user's replaces the default
    later, _ = _replay(summaries, thresholds={name: 1e9 if name != "entropy_collapse" else -1.0})
    assert name not in later


def test_answer_collapse_needs_several_prompts_and_warns_again_after_recovering():
    s = _steady(5, **{"batch/answer_top_share": 0.9})
    s[0]["batch/prompts"] = 2.0  # two prompts may rightly share their answer
    s[2]["batch/answer_top_share"] = 0.1  # recovered, then collapsed again
    first, fired = _replay(s)
    assert first == {"answer_collapse": 2}
    assert [f.step for f in fired] == [2, 4]


def test_reward_rising_while_heldout_accuracy_falls():
    s = _steady(20)
    for i, h in enumerate(s):
        h["batch/reward_mean"] = 0.1 + 0.02 * i  # rising all along
    s[0]["heldout/accuracy"] = 0.30
    s[9]["heldout/accuracy"] = 0.32  # both up at the first validation: healthy
    s[19]["heldout/accuracy"] = 0.25  # then held-out down 0.07 while training reward rose 0.2
    first, fired = _replay(s)
    assert first == {"reward_up_heldout_down": 20}
    assert "rose by 0.190" in fired[0].message and "fell by 0.070" in fired[0].message
    s[19]["heldout/accuracy"] = 0.29  # a 3-point wobble stays under 0.05
    assert _replay(s)[0] == {}


def test_the_stop_rule_and_unknown_names():
    s = _steady(6, **{"batch/answer_top_share": 0.1})
    s[3]["batch/answer_top_share"] = 0.95
    monitors = make_monitors(MonitorsConfig(stop_on=["answer_collapse"]))
    for step, h in enumerate(s, 1):
        monitors.observe(step, h)
    assert monitors.stop is not None and monitors.stop.step == 4
    quiet = make_monitors(MonitorsConfig(stop_on=["entropy_collapse"]))
    for step, h in enumerate(s, 1):
        quiet.observe(step, h)
    assert quiet.stop is None  # only the named monitors stop training
    with pytest.raises(ConfigError, match="unknown monitor 'answer_colapse'.*answer_collapse"):
        make_monitors(MonitorsConfig(thresholds={"answer_colapse": 0.5}))
    with pytest.raises(ConfigError, match="unknown monitor 'nope'"):
        make_monitors(MonitorsConfig(stop_on=["nope"]))
    with pytest.raises(ConfigError, match="monitors.thresholds.answer_collapse must be a number"):
        MonitorsConfig(thresholds={"answer_collapse": "high"})


def _episode(uid: str, answers: list, texts: list[str], reward: float, correct=None, lengths=(10,), finish="stop",
             calls=0, extra=None) -> dict:
    turns, pos = [], 0
    for k, (answer, n) in enumerate(zip(answers, list(lengths) * len(answers))):
        info = {} if answer is ... else {"answer": answer}
        if calls and k == 0:
            info["tool_calls"] = [{"name": "calculator", "status": "ok"}] * calls
        turns.append({"role": "assistant", "start": pos, "end": pos + n, "finish_reason": finish, "info": info})
        pos += n
    ep = {"uid": uid, "turns": turns, "messages": [{"role": "assistant", "content": t} for t in texts],
          "metrics": {} if correct is None else {"final_correct": float(correct)}, "reward": reward}
    if extra is not None:
        ep["score_extra"] = extra
    return ep


def test_the_batch_summary_reads_answers_correctness_lengths_and_tools():
    eps = [
        _episode("a", ["12"], ["#### 12"], 1.0, correct=1),
        _episode("b", ["12", "13"], ["#### 12", "#### 13"], 0.0, correct=0, lengths=(24,), finish="length"),
        _episode("c", ["12", "11"], ["#### 12", "#### 11"], 0.5, correct=0, calls=3),  # partial credit, wrong
        _episode("d", [None], ["  I think   it is\nnine "], 0.0, correct=0),  # nothing the task could read
        _episode("e", [...], ["x"], 1.0, extra={"pred": "7", "acc": 1.0}),  # the scorer's reading wins
    ]
    s = batch_summary(eps)
    assert s["batch/episodes"] == 5 and s["batch/prompts"] == 5
    assert s["batch/reward_mean"] == pytest.approx(2.5 / 5)
    assert s["batch/accuracy"] == pytest.approx(2 / 5)  # a, e
    assert s["batch/reward_without_correct"] == pytest.approx(0.5 / 2.5)  # c's 0.5 of 2.5 earned
    assert [answer_key(e) for e in eps] == ["12", "13", "11", "I think it is nine", "7"]
    assert s["batch/answer_top_share"] == pytest.approx(1 / 5)
    assert s["batch/first_answer_top_share"] == pytest.approx(3 / 5) and s["batch/first_answer_top"] == "12"
    turns = 1 + 2 + 2 + 1 + 1
    assert s["batch/gen_tokens_per_turn"] == pytest.approx((10 + 48 + 20 + 10 + 10) / turns)
    assert s["batch/clip_ratio"] == pytest.approx(2 / turns) and s["batch/tool_calls_per_turn"] == pytest.approx(3 / turns)
    assert "batch/tool_calls_per_turn" not in batch_summary([e for e in eps if e["uid"] != "c"])  # no tools, no calls
    # rewards given explicitly (the trainer's: a masked score is None) win over the episodes' own
    assert batch_summary(eps, [None, 0.0, 0.0, 0.0, 1.0])["batch/reward_without_correct"] == 0.0
    # a batch of one repeated unreadable string is a collapse, varied unreadable answers are not
    same = [_episode(str(i), [None], ["#" * 24], 0.0) for i in range(4)]
    assert heldout_summary(same)["heldout/answer_top_share"] == 1.0
    assert heldout_summary(eps)["heldout/accuracy"] == pytest.approx(2 / 5)


def test_from_metrics_reads_both_trainers_names():
    ours = from_metrics({"reward/mean": 0.4, "accuracy/mean": 0.3, "response_length/mean": 40.0, "turns/mean": 2.0,
                         "actor/entropy": 0.5, "val/accuracy/final": 0.2, "batch/answer_top_share": 0.9})
    assert ours == {"batch/answer_top_share": 0.9, "batch/entropy": 0.5, "heldout/accuracy": 0.2, "batch/reward_mean": 0.4,
                    "batch/accuracy": 0.3, "batch/gen_tokens_per_turn": 20.0,
                    "batch/reward_without_correct": pytest.approx(0.25)}
    verl = from_metrics({"actor/entropy": 0.6, "actor/kl_loss": 0.01, "critic/score/mean": 0.5,
                         "val-core/openai/gsm8k/acc/mean@1": 0.2, "val-core/other/acc/mean@1": 0.4}, "verl")
    assert verl == {"batch/entropy": 0.6, "batch/kl_ref": 0.01, "batch/reward_mean": 0.5,
                    "heldout/accuracy": pytest.approx(0.3)}


def _results_table(script: str = "monitors_on_runs") -> str:
    spec = importlib.util.spec_from_file_location(script, REPO / "bench" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = (REPO / "bench" / "RESULTS.md").read_text()
    start, end = doc.index(mod.BEGIN), doc.index(mod.END)
    return mod, doc[doc.index("\n", start) + 1:end].strip()


def test_the_table_in_results_is_the_replay_of_the_committed_runs():
    mod, committed = _results_table()
    assert committed == mod.table()
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")[1:] for line in committed.splitlines()[2:]}
    names = [c.name for c in mod.BUILTIN]
    # what the evidence says: the strict runs' held-out answers collapsed; the healthy headline runs stay quiet
    for arm in ("hash_strict s0", "hash_strict s1", "hash_noex_strict s0", "hash_noex_strict s1"):
        assert rows[arm][names.index("heldout_answer_collapse")] not in ("-", "n/a"), arm
    for label, cells in rows.items():
        if label.startswith("turn_loo_retry_b8cos"):
            assert all(c in ("-", "n/a") for c in cells), (label, cells)


def test_the_held_out_table_is_the_replay_of_the_preregistered_seeds():
    """bench/monitors_heldout.py: the monitors on the pre-registered learning-run seeds (runs that did not set
    their thresholds), as committed in bench/RESULTS.md, with a row for every seed of every round."""
    mod, committed = _results_table("monitors_heldout")
    assert committed == mod.table()
    seeds = sum(len(json.loads(p.read_text())["runs"]) for p in (REPO / "examples" / "learning_run").glob("prereg*/seeds.json"))
    assert committed.count("| prereg") == seeds >= 5
    # the firing cells come from the runs' own online metrics: round 1's seed 4 warned of answer collapse at step 5
    assert "| prereg seed 4 | no | 0.17 -> 0.25 -> 0.00 | 5 |" in committed


def test_the_inspector_marks_the_firing_steps_on_the_training_curves(tmp_path):
    """A run with the monitors online (their monitor/* metrics) and a run from before them (replayed
    from its metrics): the monitors plot and a marker on every step plot at each onset; the page
    draws the markers."""
    from test_inspect import NODE, _run_page
    from verl_agentic.inspect import write_report
    from verl_agentic.inspect.plots import monitor_history, run_plots
    from verl_agentic.inspect.runs import load_run

    online = REPO / "examples" / "word_problems" / "monitored" / "hash_strict" / "seed0"
    run = load_run(online)
    steps, values, firings = monitor_history(run)
    rows = {r["step"]: r for r in run.steps}
    onsets = [{"x": s, "label": name} for name in values for s in steps
              if rows[s].get(f"monitor/{name}/firing") == 1.0 and rows.get(s - 1, {}).get(f"monitor/{name}/firing") != 1.0]
    assert firings == sorted(onsets, key=lambda f: f["x"]) and {f["label"] for f in firings} == {
        "answer_collapse", "heldout_answer_collapse"}
    assert values["answer_collapse"][steps.index(5)] == pytest.approx(rows[5]["monitor/answer_collapse"] / 0.5)
    plots = {p["id"]: p for p in run_plots(run) if p["group"] == "steps" and "missing" not in p}
    assert "monitors" in plots and all(p["markers"] == firings for p in plots.values())
    # a run logged before the monitors existed: replayed from its metrics, as bench/monitors_on_runs.py does
    old = load_run(REPO / "examples" / "word_problems" / "runs" / "turn_loo_retry" / "seed0")
    _, old_values, old_firings = monitor_history(old)
    assert "entropy_collapse" in old_values and old_firings == []
    if NODE is not None:  # the page's own drawing of the markers (run under node, tests/test_inspect.py's shim)
        page = _run_page(write_report(online, tmp_path / "report", drift=False), tmp_path)
        assert sorted(page["markers"]) == sorted(f["x"] for f in firings for _ in plots)


def test_main_ppo_runs_the_monitors_online_and_stops_when_asked(tiny_smol_dir, tmp_path, capsys):
    """A real run (tiny model, gsm8k rows, validation): the monitors' statistics are in metrics.jsonl
    each step, computed from that step's episodes; a threshold of 0 makes answer_collapse fire at
    step 1, its warning is printed, and ``stop_on`` ends training there with a checkpoint."""
    from verl_agentic.main_rollout import load_config
    from verl_agentic.trainer import PPOTrainer

    cfg = load_config([
        f"model.path={tiny_smol_dir}", "data.path=data/gsm8k/train.jsonl", "data.max_samples=16",
        "data.val_path=data/gsm8k/test.jsonl", "data.val_max_samples=4", "trainer.test_freq=2",
        "trainer.total_steps=3", "trainer.batch_size=4", "rollout.n=2", "rollout.max_turns=2", "rollout.max_new_tokens=8",
        "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size=8", "task.gsm8k.feedback=retry",
        f"output.dir={tmp_path}", "output.quiet=true", "trainer.save_hf_model=false",
        "trainer.monitors.thresholds.answer_collapse=0.0", "trainer.monitors.stop_on=[answer_collapse]"], config_name="ppo")
    history = PPOTrainer(cfg).fit()
    assert len(history) == 1  # stopped after step 1 of 3
    assert (tmp_path / "checkpoints" / "step_000001").is_dir()
    err = capsys.readouterr().err
    assert "WARNING monitor answer_collapse fired at step 1:" in err and "stopping after step 1" in err
    rows = {r["step"]: r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == [0, 1]
    assert rows[0]["heldout/episodes"] == 4 and "monitor/heldout_answer_collapse" in rows[0]
    episodes = [json.loads(x) for x in (tmp_path / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    expect = batch_summary(episodes, [e["score"] for e in episodes])
    for key in ("batch/answer_top_share", "batch/first_answer_top_share", "batch/gen_tokens_per_turn",
                "batch/clip_ratio", "batch/reward_mean"):
        assert rows[1][key] == pytest.approx(expect[key]), key
    assert rows[1]["monitor/answer_collapse"] == max(expect["batch/answer_top_share"],
                                                     expect["batch/first_answer_top_share"])
    assert rows[1]["monitor/answer_collapse/firing"] == 1.0
    # the gsm8k task recorded each turn's answer, which the summary read
    assert all("answer" in t["info"] for e in episodes for t in e["turns"] if t["role"] == "assistant")


def test_monitor_settings_errors_come_before_the_model_loads(tmp_path):
    from verl_agentic.main_rollout import load_config
    from verl_agentic.trainer import PPOTrainer

    cfg = load_config([f"output.dir={tmp_path}", "trainer.monitors.stop_on=[answer_colapse]",
                       "model.path=/nonexistent/model"], config_name="ppo")
    with pytest.raises(ConfigError, match="unknown monitor 'answer_colapse'"):
        PPOTrainer(cfg)


@pytest.fixture(scope="module")
def tiny_smol_dir(smol_dir) -> str:
    from verl_agentic.models.tiny import make_tiny_model

    return make_tiny_model(str(smol_dir))


def test_a_failure_of_the_monitors_never_stops_training(tiny_smol_dir, tmp_path, capsys):
    from verl_agentic.main_rollout import load_config
    from verl_agentic.trainer import PPOTrainer

    cfg = load_config([f"model.path={tiny_smol_dir}", "data.path=data/gsm8k/train.jsonl", "data.max_samples=8",
                       "trainer.total_steps=2", "trainer.batch_size=2", "rollout.n=2", "rollout.max_turns=1",
                       "rollout.max_new_tokens=8", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=4",
                       f"output.dir={tmp_path}", "output.quiet=true", "trainer.save_hf_model=false"], config_name="ppo")
    trainer = PPOTrainer(cfg)

    def broken_observe(step, summary):  # a fault of the monitors' own code, which no real input causes
        raise RuntimeError("broken on purpose")

    trainer.monitors.active.observe = broken_observe
    history = trainer.fit()
    assert len(history) == 2 and trainer.monitors.active is None
    assert capsys.readouterr().err.count("the monitors failed at step 1 and are off for this run") == 1
    assert not any(k.startswith("monitor/") for m in history for k in m)
