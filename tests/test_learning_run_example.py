"""examples/learning_run: the summary script, and that the committed evidence is what its metrics say."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "learning_run"


def _load_summarize():
    spec = importlib.util.spec_from_file_location("va_learning_run_summarize", EXAMPLE / "summarize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


summarize = _load_summarize()


def _write_run(folder: Path, seed: int, rewards: list[float], step_s: float = 30.0) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"task_type: gsm8k\nseed: {seed}\nmodel:\n  path: embedded\n")
    rows = [{"step": i + 1, "reward/mean": r, "turns/mean": 2.0 - r, "turns/multi_turn_frac": 1.0 - r,
             "timing/step_s": step_s} for i, r in enumerate(rewards)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_summary_metrics_and_curve_from_run_folders(tmp_path, capsys):
    rising = _write_run(tmp_path / "a", 3, [0.1, 0.0, 0.2, 0.1, 0.1, 0.3, 0.5, 0.6, 0.7, 0.6, 0.8])
    flat = _write_run(tmp_path / "b", 4, [0.2] * 10)
    out = tmp_path / "out"
    rc = summarize.main([str(rising), str(flat), "--out", str(out)])
    assert rc == 1  # the flat seed fails the criterion
    s = json.loads((out / "summary.json").read_text())
    assert set(s["seeds"]) == {"3", "4"} and s["all_passed"] is False
    a = s["seeds"]["3"]
    assert a["steps"] == 11 and a["window"] == 5
    assert a["reward/mean"]["first"] == pytest.approx(0.1)
    assert a["reward/mean"]["last"] == pytest.approx(0.64)
    assert a["reward/mean"]["delta"] == pytest.approx(0.54) and a["passed"] is True
    assert a["turns/mean"]["delta"] == pytest.approx(-0.54)
    assert a["train_minutes"] == pytest.approx(11 * 30 / 60)
    assert s["seeds"]["4"]["passed"] is False and s["seeds"]["4"]["reward/mean"]["delta"] == pytest.approx(0.0)
    # per-step metrics are copied unchanged; the curve is a real PNG
    copied = [json.loads(x) for x in (out / "metrics" / "seed3.jsonl").read_text().splitlines()]
    assert copied == [json.loads(x) for x in (rising / "metrics.jsonl").read_text().splitlines()]
    png = (out / "reward_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    table = capsys.readouterr().out
    assert "| 3 | 11 | 5.5 | 0.100 | 0.640 | +0.540 |" in table and "| NO |" in table


def test_too_slow_run_fails_the_criterion(tmp_path):
    slow = _write_run(tmp_path / "s", 0, [0.0] * 5 + [1.0] * 5, step_s=200.0)  # 33 min of steps
    assert summarize.main([str(slow), "--out", str(tmp_path / "out")]) == 1
    s = json.loads((tmp_path / "out" / "summary.json").read_text())["seeds"]["0"]
    assert s["reward/mean"]["delta"] == pytest.approx(1.0) and s["passed"] is False


def test_bad_input_is_named(tmp_path, capsys):
    assert summarize.main([str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "missing: no metrics.jsonl" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 2}\n')
    assert summarize.main([str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "metrics.jsonl:2: no numeric 'reward/mean'" in capsys.readouterr().err
    a = _write_run(tmp_path / "x", 1, [0.1, 0.2])
    b = _write_run(tmp_path / "y", 1, [0.1, 0.2])
    assert summarize.main([str(a), str(b), "--out", str(tmp_path / "o")]) == 2
    assert "seed 1 given twice" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_committed_evidence_matches_its_metrics():
    """The committed summary is recomputable from the committed per-step metrics, and meets the issue's bar:
    three seeds, each last-5 minus first-5 mean reward >= 0.2 within 20 minutes of training steps, with
    the multi-turn path (retry feedback) in use."""
    summary = json.loads((EXAMPLE / "summary.json").read_text())
    files = sorted((EXAMPLE / "metrics").glob("seed*.jsonl"))
    assert len(files) == len(summary["seeds"]) >= 3
    for f in files:
        seed = f.stem[len("seed"):]
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        recomputed = summarize.summarize_run(rows)
        committed = summary["seeds"][seed]
        for key in ("steps", "window", "train_minutes"):
            assert committed[key] == pytest.approx(recomputed[key])
        for key in summarize.KEYS:
            for part in ("first", "last", "delta"):
                assert committed[key][part] == pytest.approx(recomputed[key][part])
        assert recomputed["reward/mean"]["delta"] >= 0.2 and recomputed["train_minutes"] <= 20.0
        assert all(r["turns/multi_turn_frac"] > 0 for r in rows[:5])  # feedback turns happened
        assert all(r.get("episode/errors", 0) == 0 for r in rows)
    assert summary["all_passed"] is True
    assert (EXAMPLE / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_committed_verl_run_is_what_its_metrics_say():
    """examples/learning_run_verl: summary.json is recomputed from the committed per-step rows and verl's
    logged metrics (the same summariser as ours), and the rows agree with verl's own numbers."""
    verl_dir = ROOT / "examples" / "learning_run_verl"
    summary = json.loads((verl_dir / "summary.json").read_text())
    for seed, recorded in summary["verl"].items():
        rows = [json.loads(line) for line in (verl_dir / "metrics" / f"seed{seed}.jsonl").open()]
        logged = [json.loads(line) for line in (verl_dir / "metrics" / f"seed{seed}.verl.jsonl").open()]
        assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) == recorded["steps"]
        by_step = {r["step"]: r for r in logged}
        for r in rows:  # each row's reward is verl's critic/score/mean of that step
            assert r["reward/mean"] == by_step[r["step"]]["critic/score/mean"]
            assert r["episodes"] == 32  # 4 prompts x n=8, every episode dumped
        again = summarize.summarize_run(rows)
        for key in ("reward/mean", "accuracy/first_turn", "turns/mean"):
            assert again[key] == pytest.approx(recorded[key]), key
        assert again["train_minutes"] == pytest.approx(recorded["train_minutes"])
    assert (verl_dir / "reward_curve.png").stat().st_size > 10_000


def test_committed_base_accuracy_is_what_its_counts_say():
    """base_accuracy.json (examples/learning_run/base_accuracy.py) covers every problem of easy_arith.jsonl
    in both modes with run.sh's settings, its rates and per-problem counts agree with its episode counts,
    and the README quotes its greedy and T=1 figures."""
    spec = importlib.util.spec_from_file_location("va_learning_run_base", EXAMPLE / "base_accuracy.py")
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    committed = json.loads((EXAMPLE / "base_accuracy.json").read_text())
    problems = len((EXAMPLE / "easy_arith.jsonl").read_text().splitlines())
    assert committed["problems"] == problems and committed["settings"] == base.SETTINGS
    run_sh = (EXAMPLE / "run.sh").read_text()
    assert all(s in run_sh for s in base.RUN_SETTINGS), "base_accuracy.py measures other settings than run.sh"
    readme = (EXAMPLE / "README.md").read_text()
    for mode, per_problem in (("greedy", 1), ("temperature_1", committed["samples_at_t1"])):
        m = committed["modes"][mode]
        assert m["args"] == base.mode_args(mode, per_problem)
        assert m["episodes"] == problems * per_problem
        for key in base.KEYS:
            assert m["rates"][key] == m["counts"][key] / m["episodes"]
        for part in ("first", "final"):
            by_problem = m[f"{part}_correct_by_problem"]
            assert len(by_problem) == problems and all(0 <= c <= per_problem for c in by_problem)
            assert sum(by_problem) == m["counts"][f"{part}_correct"]
        for key in ("first_correct", "final_correct"):
            assert f"{100 * m['rates'][key]:.1f}%" in readme, (mode, key)


def _modes():
    spec = importlib.util.spec_from_file_location("va_modes", ROOT / "examples" / "learning_run_verl" / "modes.py")
    modes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(modes)
    return modes


def _modes_run(folder: Path, arm: str, seed: int, step_s: tuple, rewards: tuple, cut: int = 0) -> None:
    """A run folder as modes.py run leaves it: verl's metrics, our dump (one version's episodes in one
    file, the last of four spanning an update; ``cut`` of them with their second turn at the cap), run.json."""
    (folder / "rollouts").mkdir(parents=True)
    metrics = [{"step": s + 1, "data": {"timing_s/step": t, "timing_s/gen": t / 2, "critic/score/mean": r,
                                        "training/off_policy/trajectory_spans/max": 2 if s else 1}}
               for s, (t, r) in enumerate(zip(step_s, rewards))]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    ends = [1.0, 2.0, 3.0, 10.0]  # the last episode ends 7 s after the median (2.5) of a 10 s phase
    turns = lambda i: [{"role": "assistant", "start": 0, "end": 5, "finish_reason": "stop"},  # noqa: E731
                       {"role": "user", "start": 5, "end": 9},
                       {"role": "assistant", "start": 9, "end": 12, "finish_reason": "length" if i < cut else "stop"},
                       {"role": "assistant", "start": 12, "end": 12, "finish_reason": "length"}]  # empty: not counted
    episodes = [{"step": 0, "response_mask": [1] * (10 * (i + 1)), "timing": {"start": 0.0, "end": e}, "turns": turns(i),
                 "policy_versions": {"min": 0, "max": 1 if i == 3 else 0, "turns": []}} for i, e in enumerate(ends)]
    (folder / "rollouts" / "step_000000.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (folder / "run.json").write_text(json.dumps({"arm": arm, "seed": seed, "commit": "c0ffee", "dirty": [],
                                                 "wall_s": 70.0, "exit": 0}))


def test_the_modes_summary_counts_each_trained_episode_once_and_reads_versions_and_stragglers(tmp_path):
    """examples/learning_run_verl/modes.py on a colocate_async-shaped run: two steps trained on episodes
    that one policy version rolled out together (dumped in one file), one episode spanning an update."""
    modes = _modes()
    run = tmp_path / "colocate_async_seed0"
    _modes_run(run, "colocate_async", 0, (40.0, 20.0), (0.25, 0.5), cut=1)
    row = modes.summarize_run(run)
    assert row["steps"] == 2 and row["episodes_per_step"] == 2.0  # 4 episodes over 2 trained steps
    assert row["episodes_per_s"] == pytest.approx(2 / 30.0, abs=1e-3) and row["step_s"] == 30.0
    assert row["spanning_episodes"] == 1 and row["spans_max"] == 2
    assert row["straggler_share"] == pytest.approx(0.75)  # (10 - 2.5) / 10
    assert row["cut_share"] == pytest.approx(1 / 8) and row["cut_share_by_version"] == {0: 0.125}
    assert (row["length_p50"], row["length_max"]) == (25, 40)  # lengths 10, 20, 30, 40: the median interpolated
    assert row["reward_per_step"] == [0.25, 0.5]
    assert (row["reward_first_half"], row["reward_last_half"], row["reward_mean"]) == (0.25, 0.5, 0.375)


def test_the_modes_table_pairs_arms_by_seed_and_recomputes_from_its_own_files(tmp_path):
    """modes.py summarize: per arm the mean over seeds with a 95% interval, the per-seed ratio of seconds per
    step to sync's run of the same seed; a failed run is listed but not averaged; given OUT's own files (the
    committed metrics, episodes and run.json) it writes the same table again."""
    modes = _modes()
    runs, out = tmp_path / "runs", tmp_path / "out"
    for seed, slow in ((0, 1.0), (1, 1.2), (2, 0.9)):
        _modes_run(runs / f"sync_seed{seed}", "sync", seed, (60.0 * slow, 60.0 * slow), (0.1, 0.2), cut=1)
        _modes_run(runs / f"colocate_async_seed{seed}", "colocate_async", seed, (30.0 * slow, 30.0 * slow), (0.1, 0.3),
                   cut=3)
    _modes_run(runs / "colocate_async_seed3", "colocate_async", 3, (30.0,), (0.0,))  # stopped after one step
    info = json.loads((runs / "colocate_async_seed3" / "run.json").read_text())
    (runs / "colocate_async_seed3" / "run.json").write_text(json.dumps({**info, "exit": 1}))
    folders = sorted(p for p in runs.iterdir())
    first = modes.summarize(folders, out)
    arms = {a["arm"]: a for a in first["arms"]}
    assert arms["colocate_async"]["runs"] == 4 and arms["colocate_async"]["complete"] == 3
    (pair,) = [p for p in first["comparisons"] if (p["arm"], p["baseline"]) == ("colocate_async", "sync")]
    assert pair["seeds"] == [0, 1, 2] and pair["step_s_ratio"][0] == pytest.approx(0.5)
    assert pair["step_s_ratio"][1] == pair["step_s_ratio"][2] == pytest.approx(0.5)  # the same ratio each seed
    assert pair["speed"] == "faster" and pair["reward"] == "higher"  # +0.05 each seed: a zero-width interval
    assert pair["reward_mean_diff"][0] == pytest.approx(0.05) and pair["cut_share_higher_in"] == 3
    assert pair["cut_share_diff"][0] == pytest.approx(2 / 8)
    assert [(p["arm"], p["baseline"]) for p in first["comparisons"]] == [("colocate_async", "sync")]  # no TIS runs
    assert arms["sync"]["step_s"][0] == pytest.approx(62.0) and arms["sync"]["step_s"][1] < 62.0 < arms["sync"]["step_s"][2]
    assert arms["colocate_async"]["cut_share"][0] == pytest.approx(3 / 8) and arms["sync"]["cut_share"][0] == pytest.approx(1 / 8)
    assert modes._reading([1.0, 0.9, 1.1], 1.0, ("faster", "slower")) == "not ranked"
    assert modes._reading([0.9, 0.85, 0.95], 1.0, ("faster", "slower")) == "faster"
    table = (out / "modes.md").read_text()
    assert "c0ffee" in table and "| colocate_async | 3 | 1 | 1 |" in table  # the failed run has its row
    again = modes.summarize([out], out)  # `summarize OUT --out OUT`: from the committed files alone
    assert again["arms"] == first["arms"] and again["runs"] == first["runs"]
    assert again["comparisons"] == first["comparisons"]
    assert (out / "modes.png").stat().st_size > 10_000


def test_the_committed_modes_comparison_is_what_its_files_say(tmp_path):
    """examples/learning_run_verl/modes_prereg (PREREG_modes.md's nine runs): recomputed from its committed
    files, the table is the committed one; every run is there, from one clean commit, and exited 0."""
    import shutil

    modes = _modes()
    committed = ROOT / "examples" / "learning_run_verl" / "modes_prereg"
    work = tmp_path / "modes_prereg"
    shutil.copytree(committed, work)
    again = modes.summarize([work], work)
    assert json.loads(json.dumps(again)) == json.loads((committed / "modes.json").read_text())
    assert (work / "modes.md").read_text() == (committed / "modes.md").read_text()
    runs = {(r["arm"], r["seed"]) for r in again["runs"]}
    assert runs == {(a, s) for a in modes.ARMS for s in modes.SERIES_SEEDS}
    assert len(again["commits"]) == 1 and all(r["dirty"] == [] and r["exit"] == 0 for r in again["runs"])
    assert all(r["steps"] == modes.SERIES_STEPS for r in again["runs"])


def test_the_modes_series_rotates_the_arms_and_refuses_a_dirty_tree(tmp_path, monkeypatch):
    """modes.py series: each arm runs first, second and third once over three seeds; on a checkout with a
    modified file it stops before any run with the file named."""
    modes = _modes()
    order = []
    monkeypatch.setattr(modes, "source_state", lambda allow_dirty: {"commit": "c0ffee", "dirty": []})
    monkeypatch.setattr(modes, "run", lambda arm, seed, overrides, runs, state: order.append((seed, arm)) or 0)
    assert modes.series([0, 1, 2], 6, allow_dirty=False, runs=tmp_path) == 0
    arms = list(modes.ARMS)
    assert [a for _, a in order] == arms + arms[1:] + arms[:1] + arms[2:] + arms[:2]
    for position in range(3):
        assert sorted(a for i, (_, a) in enumerate(order) if i % 3 == position) == sorted(arms)

    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (repo / "x.py").write_text("1\n")
    git("add", "x.py")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    (repo / "x.py").write_text("2\n")
    from verl_agentic.provenance import source_state
    monkeypatch.setattr(modes, "source_state", lambda allow_dirty: source_state(allow_dirty, repo=repo))
    order.clear()
    with pytest.raises(SystemExit, match=r"x\.py"):
        modes.series([0], 6, allow_dirty=False, runs=tmp_path)
    assert order == []


def _load_precision():
    spec = importlib.util.spec_from_file_location("va_learning_run_precision", EXAMPLE / "precision.py")
    precision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(precision)
    return precision


def test_the_precision_arms_differ_only_in_their_named_setting():
    """Pre-registered (PREREG.md, round 3): bf16 is fp32 plus the rollout's bf16 weights, bf16_tis is bf16
    plus the correction; every arm takes the trainer's old logprobs; each arm runs first, second, third once."""
    precision = _load_precision()
    fp32, bf16, tis = (set(precision.ARMS[a]) for a in ("fp32", "bf16", "bf16_tis"))
    assert fp32 == set() and bf16 - fp32 == {"rollout.hf.weight_dtype=bfloat16"}
    assert tis - bf16 == {"algorithm.rollout_correction.rollout_is=token",
                          "algorithm.rollout_correction.rollout_is_threshold=2.0"} and bf16 <= tis
    assert "actor.recompute_old_logprobs=true" in precision.COMMON
    arms = list(precision.ARMS)
    orders = [precision.order(seed, arms) for seed in (0, 1, 2)]
    assert orders[0] == arms and all(sorted(o) == sorted(arms) for o in orders)
    assert all(sorted(o[i] for o in orders) == sorted(arms) for i in range(3))  # each position once per arm
    run_sh = (EXAMPLE / "run.sh").read_text()
    settings = [*precision.base_accuracy.RUN_SETTINGS, *precision.EVAL[:-1]]
    assert all(x in run_sh for x in settings) and precision.EVAL[-1] == "rollout.hf.weight_dtype=float32"
    # every task.* / reward.* key run.sh sets is set by the evaluation too
    keys = set(re.findall(r"(?:task|reward)\.[\w.]+(?==)", run_sh))
    assert keys and keys <= {x.split("=")[0] for x in settings}, keys


def test_the_precision_comparison_summarizes_runs_and_pairs_them_by_seed(tmp_path):
    """examples/learning_run/precision.py summarize: per run the reward of steps 1-5 and 16-20, the fp32
    held-out accuracy, the gap and the correction's metrics; per arm mean and interval; per pair the
    difference paired by seed, ranked only where its 95% interval excludes 0; a crashed run is reported."""
    precision = _load_precision()
    runs = tmp_path / "runs"
    (runs / "base").mkdir(parents=True)
    (runs / "base" / "heldout_fp32.json").write_text(json.dumps({"accuracy_final": 0.3}))
    held = {("fp32", 0): 0.40, ("fp32", 1): 0.42, ("fp32", 2): 0.45,
            ("bf16_tis", 0): 0.50, ("bf16_tis", 1): 0.53, ("bf16_tis", 2): 0.55}
    for (arm, seed), acc in held.items():
        folder = runs / f"{arm}_seed{seed}"
        folder.mkdir()
        tis = arm == "bf16_tis"
        rows = [{"step": step, "reward/mean": 0.1 + 0.02 * step * (1 + tis) + 0.01 * seed,
                 "actor/logprob_gap_mean": 1e-2 if tis else 1e-6, "actor/logprob_gap_max": 0.3 if tis else 1e-5,
                 **({"rollout_corr/rollout_is_mean": 0.99} if tis else {})} for step in range(1, 21)]
        crashed = (arm, seed) == ("fp32", 2)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:7 if crashed else 20]))
        (folder / "run_info.json").write_text(json.dumps(
            {"arm": arm, "seed": seed, "commit": "abc1234", "dirty": [], "exit_status": 1 if crashed else 0,
             "wall_s": 600.0, "max_rss_gb": 5.0}))
        if not crashed:
            (folder / "heldout_fp32.json").write_text(json.dumps({"accuracy_final": acc}))
    out = tmp_path / "out"
    s = precision.summarize(out, runs, ["fp32", "bf16_tis"])
    assert [(r["arm"], r["seed"]) for r in s["runs"]] == [("fp32", 0), ("fp32", 1), ("fp32", 2),
                                                           ("bf16_tis", 0), ("bf16_tis", 1), ("bf16_tis", 2)]
    f0, f2, t0 = s["runs"][0], s["runs"][2], s["runs"][3]
    assert f0["reward_first5"] == pytest.approx(0.16) and f0["reward_last5"] == pytest.approx(0.46)
    assert f0["gain"] == pytest.approx(0.30) and t0["gain"] == pytest.approx(0.60)
    assert f0["heldout_fp32_after"] == 0.40 and f0["heldout_fp32_change"] == pytest.approx(0.10)
    assert not f2["complete"] and f2["gain"] is None and f2["exit_status"] == 1  # reported, not dropped
    assert t0["logprob_gap_max"] == 0.3 and t0["rollout_corr"] == {"rollout_corr/rollout_is_mean": pytest.approx(0.99)}
    assert s["arms"]["fp32"]["complete"] == 2 and s["arms"]["fp32"]["heldout_fp32_after"]["mean"] == pytest.approx(0.41)
    pair = s["comparisons"]["bf16_tis - fp32"]
    assert pair["heldout_fp32_after"]["seeds"] == [0, 1]  # seed 2's fp32 run crashed
    assert pair["heldout_fp32_after"]["differences"] == pytest.approx([0.10, 0.11])
    assert pair["heldout_fp32_after"]["ranked_above"] == "bf16_tis"  # 0.105 +- 12.706 * 0.0035: above 0
    assert pair["gain"]["differences"] == pytest.approx([0.30, 0.30]) and pair["gain"]["ranked_above"] == "bf16_tis"
    assert json.loads((out / "precision.json").read_text()) == json.loads(json.dumps(s))
    table = (out / "precision.md").read_text()
    assert "| fp32 (exit 1) | 2 |" in table and "base model 0.30" in table
    assert "| bf16_tis - fp32 (seeds 0,1) |" in table and "not ranked" not in table.split("paired by seed")[1]
    assert (out / "metrics" / "fp32_seed0.metrics.jsonl").read_text() == (runs / "fp32_seed0" / "metrics.jsonl").read_text()
    assert (out / "metrics" / "base.heldout_fp32.json").is_file()


def test_a_pair_whose_interval_holds_zero_ranks_nothing():
    precision = _load_precision()
    runs = [{"arm": a, "seed": s, "x": v} for (a, s, v) in
            (("bf16", 0, 0.5), ("bf16", 1, 0.4), ("bf16", 2, 0.6), ("fp32", 0, 0.45), ("fp32", 1, 0.5), ("fp32", 2, 0.5))]
    p = precision.paired(runs, "bf16", "fp32", "x")
    assert p["differences"] == pytest.approx([0.05, -0.1, 0.1]) and p["ci95"][0] < 0 < p["ci95"][1]
    assert p["ranked_above"] is None


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"va_learning_run_{name}", EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _seed_run(folder: Path, seed: int, rewards: list[float], heldout: list[float], exit_status: int = 0) -> None:
    folder.mkdir(parents=True)
    (folder / "run_info.json").write_text(json.dumps({"seed": seed, "commit": "abc1234", "dirty": [],
                                                      "exit_status": exit_status, "wall_s": 600, "max_rss_gb": 3.1}))
    rows = [{"step": 0, "val/accuracy/final": heldout[0]}]
    for i, r in enumerate(rewards, 1):
        rows.append({"step": i, "reward/mean": r, "response_length/clip_ratio": 0.5})
        if i in (10, 20):
            rows[-1]["val/accuracy/final"] = heldout[i // 10]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_seeds_table_reports_every_seed_and_the_criterion(tmp_path):
    """seeds.py summarize: a seed meets the pre-registered criterion only with both a reward gain of at
    least 0.2 and held-out accuracy above step 0's; a crashed run is a failed seed, still in the table."""
    seeds = _load("seeds")
    runs = tmp_path / "runs"
    rise = [0.1] * 5 + [0.3] * 10 + [0.5] * 5
    _seed_run(runs / "seed0", 0, rise, [0.38, 0.40, 0.45])          # meets
    _seed_run(runs / "seed1", 1, rise, [0.38, 0.50, 0.30])          # reward up, held-out down: fails
    _seed_run(runs / "seed2", 2, [0.1] * 20, [0.38, 0.40, 0.45])    # flat: fails
    _seed_run(runs / "seed3", 3, rise[:12], [0.38, 0.40], exit_status=1)  # crashed at step 12: fails
    out = tmp_path / "out"
    assert seeds.summarize(out, runs) == 1  # 1 of 4 meets it, the goal is 4
    s = json.loads((out / "seeds.json").read_text())
    assert [r["meets"] for r in s["runs"]] == [True, False, False, False]
    assert s["met"] == 1 and s["commits"] == ["abc1234"]
    assert s["runs"][0]["gain"] == pytest.approx(0.4) and s["runs"][3]["gain"] is None
    table = (out / "seeds.md").read_text()
    assert "| 3 |" in table and "(exit 1)" in table and "abc1234"[:7] in table
    info = json.loads((out / "metrics" / "seed3.run_info.json").read_text())  # committed beside its metrics
    assert info["exit_status"] == 1 and (out / "metrics" / "seed3.jsonl").is_file()
    mean, low, high = seeds.interval([0.4, 0.4, 0.0])
    assert mean == pytest.approx(0.8 / 3) and low < mean < high


def test_results_runners_refuse_a_dirty_tree_with_one_line(tmp_path):
    import subprocess

    from verl_agentic.provenance import DirtyTree, source_state

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    env = ["-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", *env, "-C", str(tmp_path), "add", "."], check=True)
    subprocess.run(["git", *env, "-C", str(tmp_path), "commit", "-qm", "a"], check=True)
    clean = source_state(repo=tmp_path)
    assert len(clean["commit"]) == 40 and clean["dirty"] == []
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "run.log").write_text("not source\n")
    with pytest.raises(DirtyTree, match=r"^the checkout has changes \(a\.py\): commit them first, or pass --allow-dirty"):
        source_state(repo=tmp_path)
    assert source_state(allow_dirty=True, repo=tmp_path)["dirty"] == ["a.py"]


@pytest.mark.parametrize("round_", sorted(p.name for p in EXAMPLE.glob("prereg*") if p.is_dir()))
def test_committed_preregistered_seeds_are_what_their_metrics_say(tmp_path, round_):
    """examples/learning_run/prereg*/ (one folder per pre-registered round): every seed that ran is in the
    table, from a clean tree at one commit, and seeds.json is what seeds.py computes again from the committed
    metrics and run_info."""
    import shutil

    seeds = _load("seeds")
    folder = EXAMPLE / round_
    committed = json.loads((folder / "seeds.json").read_text())
    runs = tmp_path / "runs"
    for info in sorted((folder / "metrics").glob("seed*.run_info.json")):
        seed = info.name.split(".")[0]
        (runs / seed).mkdir(parents=True)
        shutil.copyfile(info, runs / seed / "run_info.json")
        if (folder / "metrics" / f"{seed}.jsonl").is_file():
            shutil.copyfile(folder / "metrics" / f"{seed}.jsonl", runs / seed / "metrics.jsonl")
    seeds.summarize(tmp_path / "out", runs)
    again = json.loads((tmp_path / "out" / "seeds.json").read_text())
    assert again == committed
    assert [r["seed"] for r in committed["runs"]] == [0, 1, 2, 3, 4][:len(committed["runs"])]
    assert len(committed["commits"]) == 1 and not any(r["dirty"] for r in committed["runs"])
    table = (EXAMPLE / "README.md").read_text()
    assert (folder / "seeds.md").read_text().strip() in table  # the README shows the table as computed


def test_each_seed_records_its_own_exit_status_and_peak_memory(tmp_path):
    """seeds.py run: a crashing seed is recorded with its exit status and the next seed still runs; each
    seed's peak resident memory is its own run's (seed 0 holds ~300 MB, seed 1 ~20 MB), not the largest
    of every run so far."""
    script = tmp_path / "fake_run.sh"
    script.write_text('#!/usr/bin/env bash\nexec "$PYTHON" -c "import sys; b = bytearray((300 if sys.argv[1] == \'0\' '
                      'else 20) * 2**20); b[::4096] = b\'x\' * len(b[::4096]); sys.exit(3 if sys.argv[1] == \'0\' else 0)" "$1"\n')
    runs = tmp_path / "runs"
    # from a small process, as `seeds.py run` is: a child's peak RSS counts the pages its fork inherited,
    # and this test's own process holds gigabytes
    code = (f"import importlib.util, sys; from pathlib import Path; "
            f"spec = importlib.util.spec_from_file_location('seeds', {str(EXAMPLE / 'seeds.py')!r}); "
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            f"sys.exit(m.run([0, 1], True, Path({str(runs)!r}), {str(script)!r}))")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 1
    first, second = (json.loads((runs / f"seed{s}" / "run_info.json").read_text()) for s in (0, 1))
    assert (first["exit_status"], second["exit_status"]) == (3, 0)
    assert first["max_rss_gb"] >= 0.29 and second["max_rss_gb"] < 0.2, (first, second)
    assert first["command"].startswith("bash ") and "data.val_path=" in first["command"]


def test_the_committed_precision_comparison_is_what_its_runs_say(tmp_path):
    """examples/learning_run/precision_prereg/ (issue 38's third comparison): its table, recomputed from the
    committed per-run files, is the committed one; nine runs, each from a clean tree at one commit."""
    precision = _load_precision()
    committed = EXAMPLE / "precision_prereg"
    runs = tmp_path / "runs"
    for f in sorted((committed / "metrics").iterdir()):
        folder, name = f.name.split(".", 1)
        (runs / folder).mkdir(parents=True, exist_ok=True)
        (runs / folder / name).write_bytes(f.read_bytes())
    summary = precision.summarize(tmp_path / "out", runs)
    assert summary == json.loads((committed / "precision.json").read_text())
    assert (tmp_path / "out" / "precision.md").read_text() == (committed / "precision.md").read_text()
    assert len(summary["runs"]) == 9 and len(summary["commits"]) == 1
    assert all(r["dirty"] == [] and r["exit_status"] == 0 for r in summary["runs"])
    assert summary["base_heldout_fp32"] == pytest.approx(0.17)
