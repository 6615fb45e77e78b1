"""examples/word_problems: the generator makes the committed splits, they are sound, and the committed
base-model table is what the committed episodes say."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "word_problems"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"va_word_problems_{name}", EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (EXAMPLE / f"{name}.jsonl").read_text().splitlines()]


def test_the_generator_writes_the_committed_splits(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True, cwd=ROOT)
    for name in ("train", "heldout", "train_hash", "heldout_hash", "train_hash_noex", "heldout_hash_noex"):
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (EXAMPLE / f"{name}.jsonl").read_bytes(), name


def test_the_hash_variant_is_the_same_problems_asking_for_the_gsm8k_format():
    """Only the instruction differs, and strict extraction reads an answer written as it asks."""
    from verl_agentic.tasks.gsm8k import extract_answer

    data = _load("make_data")
    for name in ("train", "heldout"):
        plain = _rows(name)
        for suffix, instruction in (("_hash", data.HASH_INSTRUCTION), ("_hash_noex", data.HASH_NOEX_INSTRUCTION)):
            hashed = _rows(f"{name}{suffix}")
            assert len(plain) == len(hashed)
            for a, b in zip(plain, hashed):
                assert b["prompt"][0]["content"] == a["prompt"][0]["content"].replace(data.INSTRUCTION, instruction)
                assert {k: v for k, v in a.items() if k != "prompt"} == {k: v for k, v in b.items() if k != "prompt"}
    gt = hashed[0]["reward_model"]["ground_truth"]
    assert extract_answer(f"#### {gt}", "strict") == gt and extract_answer(gt, "strict") is None


def test_splits_are_disjoint_graded_and_their_answers_right():
    train, heldout = _rows("train"), _rows("heldout")
    for rows, per_level in ((train, 400), (heldout, 50)):
        assert [sum(r["extra_info"]["ops"] == k for r in rows) for k in (1, 2, 3)] == [per_level] * 3
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in heldout}
    for r in train + heldout:
        assert r["data_source"] == "verl_agentic/word_problems" and r["task_type"] == "gsm8k"
        steps = re.findall(r"([\d +*-]+) = (\d+)", r["extra_info"]["answer"])
        assert len(steps) == r["extra_info"]["ops"]
        for expr, value in steps:  # every step's arithmetic, and the last result is the ground truth
            assert eval(expr, {"__builtins__": {}}) == int(value) > 0  # noqa: S307 - digits and + - * only
        assert r["reward_model"]["ground_truth"] == steps[-1][1]


def test_the_gsm8k_scorer_scores_them_under_their_own_name():
    from verl_agentic.reward.base import RewardItem
    from verl_agentic.reward.scorers import import_scorer_modules, resolve_scorer, run_scorer

    import_scorer_modules([])  # the built-in scorers
    row = _rows("heldout")[0]
    item = RewardItem(solution_str=row["reward_model"]["ground_truth"], ground_truth=row["reward_model"]["ground_truth"],
                      data_source=row["data_source"], task_type="gsm8k", extra_info=row["extra_info"])
    assert resolve_scorer(item) == "verl_agentic/word_problems"
    assert run_scorer(item)[0] == 1.0
    assert run_scorer(RewardItem(**{**item.as_dict(), "solution_str": "12345"}))[0] == 0.0


def test_the_committed_base_table_is_what_the_committed_episodes_say():
    base = _load("base_accuracy")
    episodes = [json.loads(x) for x in (EXAMPLE / "base_episodes.jsonl").read_text().splitlines()]
    committed = json.loads((EXAMPLE / "base_accuracy.json").read_text())
    assert committed["table"] == base.table(episodes)  # floats survive JSON exactly
    greedy = [e for e in episodes if e["mode"] == "greedy"]
    sampled = [e for e in episodes if e["mode"] == "temperature_1"]
    assert len(greedy) == 150 and len({e["index"] for e in greedy}) == 150
    assert len(sampled) == 150 * committed["samples_at_t1"]
    heldout_ops = {r["extra_info"]["index"]: r["extra_info"]["ops"] for r in _rows("heldout")}
    assert all(e["ops"] == heldout_ops[e["index"]] for e in episodes)


def test_the_committed_experiment_tables_are_what_the_committed_runs_say():
    """runs/summary.json, runs/TABLES.md and the tables bench/RESULTS.md quotes are recomputed from every
    committed run's metrics.jsonl, final_validation.jsonl and run.json."""
    exp = _load("experiments")
    runs = EXAMPLE / "runs"
    summary = exp.summarize(runs)
    assert summary["arms"], "no committed runs"
    assert json.loads((runs / "summary.json").read_text()) == json.loads(json.dumps(summary))
    text = exp.tables(summary)
    assert (runs / "TABLES.md").read_text() == text
    assert text in (ROOT / "bench" / "RESULTS.md").read_text(), "bench/RESULTS.md does not quote runs/TABLES.md"
    for arm, seeds in summary["arms"].items():
        for seed, s in seeds.items():
            info = json.loads((runs / arm / seed / "run.json").read_text())
            assert info["arm"] == arm and f"seed{info['seed']}" == seed and info["commit"]
            # every arm setting is in the command the run recorded
            assert all(o in info["command"] for o in exp.ARMS[arm][1]), (arm, seed)
            # the final validation's episodes give the metrics row's final accuracy
            eps = [json.loads(x) for x in (runs / arm / seed / "final_validation.jsonl").read_text().splitlines()]
            assert len(eps) == 150
            assert sum(e["final_correct"] for e in eps) / 150 == pytest.approx(s["end"]["val/accuracy/final"])


def test_experiments_reject_an_unknown_arm_and_a_run_without_a_base(tmp_path):
    exp = _load("experiments")
    with pytest.raises(exp.InputError, match="unknown arm 'grpo'; the arms: grpo_retry, "):
        exp.command("grpo", 0, tmp_path, [])
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5, "val/accuracy/final": 0.2}) + "\n")
    with pytest.raises(exp.InputError, match="no step-0 validation"):
        exp.read_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/accuracy/final": 0.2}) + "\n{not json\n")
    with pytest.raises(exp.InputError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        exp.read_run(tmp_path)


def test_answer_shape_counts_the_hash_format_and_a_collapse():
    """The format experiment's two columns, on constructed final answers: '#### N' is counted only when
    strict extraction reads it, and the top answer's share sees a policy that gives one number to every problem."""
    exp = _load("experiments")

    def ep(*answers):
        return {"answers": list(answers)}

    collapsed = [ep("#### 12 is the answer.", "#### 10."), ep("#### 12", "#### 10"), ep("#### 12"), ep("It is 10")]
    assert exp.answer_shape(collapsed) == {"end_hash_format": 0.75, "end_top_answer_share": 0.75}
    varied = [ep("Tom has 3 + 4 = 7 pens."), ep("####"), ep("#### 5"), ep("")]
    assert exp.answer_shape(varied) == {"end_hash_format": 0.25, "end_top_answer_share": 0.25}


def test_paired_against_base_counts_changed_problems_and_their_sign_test():
    """Constructed: 4 problems the base got wrong and the run right, 1 the reverse, 2 unchanged. The exact
    one-sided sign test on the 5 that changed is P(X >= 4), X ~ Binomial(5, 1/2) = (5 + 1) / 32."""
    exp = _load("experiments")
    base = {i: c for i, c in enumerate([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])}
    run = [{"index": i, "final_correct": c} for i, c in enumerate([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0])]
    assert exp.paired_against_base(run, base) == {"gained": 4, "lost": 1, "p_one_sided": 6 / 32}
    # nothing changed: no evidence either way
    assert exp.paired_against_base([{"index": 4, "final_correct": 1.0}], base)["p_one_sided"] == 1.0
    with pytest.raises(exp.InputError, match=r"the base episodes have no problem \[9\]"):
        exp.paired_against_base([{"index": 9, "final_correct": 1.0}], base)


def test_the_paired_table_refuses_a_run_whose_base_is_not_the_base_episodes(tmp_path):
    """A retry-feedback run is compared with base_episodes.jsonl only if its own step-0 validation has the same
    accuracy (the same untrained model and settings); a copied run with another step-0 figure is refused."""
    exp = _load("experiments")
    src = EXAMPLE / "runs" / "turn_loo_retry_b8cos" / "seed0"
    dest = tmp_path / "turn_loo_retry_b8cos" / "seed0"
    dest.mkdir(parents=True)
    for name in ("run.json", "final_validation.jsonl", "metrics.jsonl"):
        (dest / name).write_text((src / name).read_text())
    committed = json.loads((EXAMPLE / "runs" / "summary.json").read_text())["paired"]["turn_loo_retry_b8cos"]["seed0"]
    assert exp.summarize(tmp_path)["paired"] == {"turn_loo_retry_b8cos": {"seed0": committed}}
    rows = [json.loads(x) for x in (src / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and "val/accuracy/final" in rows[0]
    rows[0]["val/accuracy/final"] += 0.1
    (dest / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(exp.InputError, match="not the base episodes' accuracy"):
        exp.summarize(tmp_path)


def test_the_committed_format_probe_is_what_its_answers_say():
    """format_probe.json: one greedy answer per held-out problem in each variant, and its counts (quoted in
    DEVLOG and make_data.py) are recomputed from the answers."""
    probe = _load("format_probe")
    committed = json.loads((EXAMPLE / "format_probe.json").read_text())
    assert set(committed["variants"]) == set(probe.VARIANTS) and committed["settings"] == probe.SETTINGS
    for variant, v in committed["variants"].items():
        assert [a["index"] for a in v["answers"]] == list(range(len(_rows(variant))))
        assert json.loads(json.dumps(probe.counts(v["answers"]))) == v["counts"], variant
