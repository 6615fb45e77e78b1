import json

import pytest

from verl_agentic.agentic_utils import DatasetError, load_rows, preprocess, read_raw_rows
from verl_agentic.interfaces import ConfigError, GenOutput, RolloutContext
from verl_agentic.tasks.gsm8k import (
    DEFAULT_RETRY_MESSAGE,
    DEFAULT_VERIFY_MESSAGE,
    extract_answer,
    gsm8k_end,
    gsm8k_obs,
    gsm8k_start,
    normalize_number,
)

from va_testing import GSM8K_TEST


@pytest.mark.parametrize("text,expected", [
    ("72", "72"), ("1,234", "1234"), ("$18", "18"), ("18.0", "18"), ("18.50", "18.5"),
    ("-3", "-3"), (".5", "0.5"), ("$ 1,000.00.", "1000"), ("abc", None), ("", None),
])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize("text,strict,flexible", [
    ("so the answer is #### 72", "72", "72"),
    ("#### $1,234.00", "1234", "1234"),
    ("first #### 5 then corrected #### 6", "6", "6"),
    ("The total is 42 dollars.", None, "42"),
    ("3 apples and 4 pears make 7.", None, "7"),
    ("no numbers here", None, None),
    ("#### -12", "-12", "-12"),
])
def test_extract_answer(text, strict, flexible):
    assert extract_answer(text, "strict") == strict
    assert extract_answer(text, "flexible") == flexible


def test_extract_answer_rejects_unknown_method():
    with pytest.raises(ConfigError):
        extract_answer("1", "fuzzy")


def test_preprocess_real_gsm8k(tmp_path):
    rows = load_rows(GSM8K_TEST, "gsm8k", max_samples=5)
    assert len(rows) == 5
    first = rows[0]
    assert first["task_type"] == "gsm8k" and first["reward_model"]["ground_truth"] == "18"
    assert first["prompt"][0]["role"] == "user" and "####" in first["prompt"][0]["content"]
    # parquet and jsonl outputs load back unchanged (already-preprocessed rows pass through)
    for name in ("rows.parquet", "rows.jsonl"):
        assert preprocess("gsm8k", GSM8K_TEST, tmp_path / name, max_samples=5) == 5
        again = load_rows(tmp_path / name, "gsm8k")
        assert [r["reward_model"]["ground_truth"] for r in again] == [r["reward_model"]["ground_truth"] for r in rows]
        assert again[0]["prompt"] == first["prompt"]


def test_all_gsm8k_test_rows_have_numeric_ground_truth():
    rows = load_rows(GSM8K_TEST, "gsm8k")
    assert len(rows) == 1319
    assert all(normalize_number(r["reward_model"]["ground_truth"]) is not None for r in rows)


def _write(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def test_row_without_ground_truth_names_file_row_field(tmp_path):
    p = _write(tmp_path, [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "four"}])
    with pytest.raises(DatasetError) as e:
        load_rows(p, "gsm8k")
    assert str(p) in str(e.value) and "row 1" in str(e.value) and "answer" in str(e.value)


def test_row_without_prompt_names_file_row_field(tmp_path):
    p = _write(tmp_path, [{"answer": "#### 2"}])
    with pytest.raises(DatasetError) as e:
        load_rows(p, "gsm8k")
    assert "row 0" in str(e.value) and "question" in str(e.value)
    # a preprocessed row with an empty prompt / missing ground truth
    p2 = _write(tmp_path, [{"prompt": [], "reward_model": {"ground_truth": "1"}}], "p2.jsonl")
    with pytest.raises(DatasetError, match="row 0: field 'prompt'"):
        load_rows(p2, "gsm8k")
    p3 = _write(tmp_path, [{"prompt": [{"role": "user", "content": "hi"}], "reward_model": {}}], "p3.jsonl")
    with pytest.raises(DatasetError, match="row 0: field 'reward_model.ground_truth'"):
        load_rows(p3, "gsm8k")


def test_empty_and_broken_datasets(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match="has no rows"):
        load_rows(empty, "gsm8k")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "x", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(DatasetError, match="line 2 is not valid JSON"):
        read_raw_rows(broken)
    with pytest.raises(DatasetError, match="does not exist"):
        load_rows(tmp_path / "missing.jsonl", "gsm8k")
    with pytest.raises(DatasetError, match="unsupported dataset format"):
        read_raw_rows(_write(tmp_path, [], "x.csv"))


def _episode(feedback, max_turns=3, answer_gt="18"):
    row = {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": answer_gt}}
    ctx = RolloutContext(tokenizer=None, task_config={"feedback": feedback}, max_turns=max_turns)
    return gsm8k_start(row, ctx)


def _answer(state, text):
    state.messages.append({"role": "assistant", "content": text})
    state.num_turns += 1
    ob = gsm8k_obs(state, GenOutput([], [], text, "stop"))
    state.messages.extend(ob.messages)
    return ob


@pytest.mark.parametrize("policy,message", [("retry", DEFAULT_RETRY_MESSAGE), ("verify", DEFAULT_VERIFY_MESSAGE)])
def test_feedback_on_wrong_then_flip(policy, message):
    s = _episode(policy)
    ob = _answer(s, "#### 17")
    assert not ob.done and ob.turn_reward == 0.0 and ob.messages == [{"role": "user", "content": message}]
    ob = _answer(s, "#### 18")
    assert ob.done and ob.turn_reward == 1.0
    res = gsm8k_end(s)
    assert res.reward == 1.0
    assert res.metrics["first_correct"] == 0.0 and res.metrics["final_correct"] == 1.0
    assert res.metrics["flips_wrong_to_right"] == 1.0 and res.metrics["flips_right_to_wrong"] == 0.0
    assert res.metrics["feedback_turns"] == 1.0


def test_always_verify_asks_even_when_right_and_counts_right_to_wrong():
    s = _episode("always_verify")
    ob = _answer(s, "The answer is 18")
    assert not ob.done and ob.turn_reward == 1.0 and ob.messages[0]["content"] == DEFAULT_VERIFY_MESSAGE
    ob = _answer(s, "Actually #### 20")
    assert not ob.done  # wrong now: verify again
    ob = _answer(s, "#### 20")
    res = gsm8k_end(s)
    assert res.reward == 0.0 and res.metrics["flips_right_to_wrong"] == 1.0
    assert res.metrics["feedback_turns"] == 2.0  # the third turn had no turns left


def test_none_policy_stops_after_first_answer():
    s = _episode("none")
    assert _answer(s, "#### 3").done


def test_unknown_policy_and_keys_are_config_errors():
    with pytest.raises(ConfigError, match="feedback must be one of"):
        _episode("sometimes")
    row = {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "1"}}
    with pytest.raises(ConfigError, match="unknown task.gsm8k keys"):
        gsm8k_start(row, RolloutContext(tokenizer=None, task_config={"feedbak": "retry"}))


def test_a_turn_cut_at_max_new_tokens_has_no_answer_when_configured():
    """``answer_in_cut_turn=false``: a turn cut at max_new_tokens is wrong whatever number it ends on (its
    text is unfinished working), in the task's turn answers and in the scorer the reward managers call;
    the default keeps the flexible extraction's last number."""
    from verl_agentic.interfaces import GenOutput
    from verl_agentic.reward.items import item_from_trajectory
    from verl_agentic.reward.scorers import run_scorer
    from verl_agentic.tasks.gsm8k.task import gsm8k_obs, gsm8k_start

    row = {"prompt": [{"role": "user", "content": "Ben has 8 and gives 6 away. How many?"}],
           "reward_model": {"ground_truth": "2"}}
    text = "Ben had 8, gave 6, so he has 2"
    for setting, expected in ((True, "2"), (False, None)):
        ctx = RolloutContext(tokenizer=None, task_config={"feedback": "retry", "answer_in_cut_turn": setting},
                             max_turns=2)
        state = gsm8k_start(row, ctx)
        state.messages.append({"role": "assistant", "content": text})
        state.num_turns = 1
        gsm8k_obs(state, GenOutput(token_ids=[1] * 24, logprobs=None, text=text, finish_reason="length"))
        assert state.task.answers == [expected]
        traj = {"ground_truth": "2", "data_source": "openai/gsm8k", "messages": [{"role": "assistant", "content": text}],
                "turns": [{"role": "assistant", "start": 0, "end": 24, "finish_reason": "length"}]}
        score, extra = run_scorer(item_from_trajectory(traj), scorer_kwargs={"gsm8k": {"answer_in_cut_turn": setting}})
        assert score == float(setting) and extra["pred"] == expected
        traj["turns"][0]["finish_reason"] = "stop"  # a finished turn answers either way
        assert run_scorer(item_from_trajectory(traj), scorer_kwargs={"gsm8k": {"answer_in_cut_turn": setting}})[0] == 1.0
