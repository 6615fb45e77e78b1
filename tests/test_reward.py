"""Scorers, the naive and prime reward managers, and their fault handling (real worker processes)."""

import json
import math
import os
import signal
import time

import pytest

import va_faulty_scorers  # noqa: F401 - registers "faulty" and "fixed_cpu_cost" in this process
from verl_agentic.interfaces import ConfigError
from verl_agentic.reward import (
    REWARD_MANAGERS,
    SCORERS,
    RewardConfig,
    RewardItem,
    RewardResult,
    item_from_trajectory,
    make_reward_manager,
    register_scorer,
    resolve_scorer,
)
from verl_agentic.reward.base import ScoreError, normalize_score
from verl_agentic.tasks.gsm8k.scorer import gsm8k_score, gsm8k_symbolic_score

FAULTS = ["raise", "hang", "spin", "c_hang", "nan", "string", "none", "dict_without_score", "huge_memory", "die"]
EXPECTED_ERROR = {"raise": "scorer_error", "hang": "timeout", "spin": "timeout", "c_hang": "timeout",
                  "nan": "invalid_score",
                  "string": "invalid_score", "none": "invalid_score", "dict_without_score": "invalid_score",
                  "huge_memory": "scorer_error", "die": "worker_died"}


def gsm8k_items(n: int) -> list[RewardItem]:
    """Right, wrong-but-well-formed, flexible-only and unparseable answers, deterministic."""
    items = []
    for i in range(n):
        truth = str(10 + i)
        text = [f"so #### {truth}", f"so #### {int(truth) + 1}", f"the answer is {truth}.", "no idea"][i % 4]
        items.append(RewardItem(text, truth, data_source="openai/gsm8k", task_type="gsm8k"))
    return items


# -- scorers -------------------------------------------------------------------------------
def test_gsm8k_scorer_methods_and_partial_credit():
    assert gsm8k_score("x #### 1,234", "1234")["score"] == 1.0
    assert gsm8k_score("the answer is 72", "72", method="flexible")["score"] == 1.0
    assert gsm8k_score("the answer is 72", "72", method="strict") == {"score": 0.0, "acc": 0.0, "answered": 0.0,
                                                                      "pred": None}
    # a well-formed wrong answer gets format_score; a parseable but not well-formed one does not
    assert gsm8k_score("#### 5", "6", format_score=0.1)["score"] == 0.1
    assert gsm8k_score("it is 5", "6", format_score=0.1)["score"] == 0.0
    # no parseable answer: the format penalty
    assert gsm8k_score("no idea", "6", no_answer_score=-0.5)["score"] == -0.5
    with pytest.raises(ValueError, match="not a number"):
        gsm8k_score("#### 1", "abc")


def test_symbolic_scorer_agrees_with_gsm8k_on_numbers_and_accepts_fractions():
    for item in gsm8k_items(8):
        assert gsm8k_symbolic_score(item.solution_str, item.ground_truth) == gsm8k_score(item.solution_str,
                                                                                         item.ground_truth)
    assert gsm8k_symbolic_score("#### 3/4", "0.75")["acc"] == 0.0  # "3/4" is not one number: pred is "4"


def test_scorer_resolution_is_polymorphic_and_unknown_lists_registered():
    assert resolve_scorer(RewardItem("x", 1, data_source="openai/gsm8k")) == "openai/gsm8k"
    assert resolve_scorer(RewardItem("x", 1, data_source="unknown/ds", task_type="gsm8k")) == "gsm8k"
    assert resolve_scorer(RewardItem("x", 1, data_source="openai/gsm8k", scorer="faulty")) == "faulty"
    assert resolve_scorer(RewardItem("x", 1, data_source="openai/gsm8k"), override="gsm8k_symbolic") == "gsm8k_symbolic"
    with pytest.raises(ScoreError) as e:
        resolve_scorer(RewardItem("x", 1, data_source="nope", task_type="nada"))
    assert e.value.type == "unknown_scorer" and "'nope'" in e.value.message and "gsm8k" in e.value.message


def test_register_scorer_duplicate_is_an_error_naming_both():
    @register_scorer("test_dup_scorer")
    def first(s, gt, extra=None):
        return 1.0

    def second(s, gt, extra=None):
        return 0.0

    try:
        with pytest.raises(ConfigError, match="registered twice"):
            register_scorer("test_dup_scorer", second)
    finally:
        SCORERS.unregister("test_dup_scorer")


@pytest.mark.parametrize("value,ok", [(1, True), (0.5, True), (True, True), ({"score": 2, "x": float("nan")}, True),
                                      (float("nan"), False), (float("inf"), False), ("1.0", False), (None, False),
                                      ({"acc": 1}, False), ({"score": "1"}, False), ([1], False)])
def test_normalize_score(value, ok):
    if ok:
        score, extra = normalize_score(value)
        assert math.isfinite(score)
        json.dumps(extra)  # extra is JSON-safe, NaN included
    else:
        with pytest.raises(ScoreError) as e:
            normalize_score(value)
        assert e.value.type == "invalid_score"


def test_reward_config_rejects_bad_keys_and_values():
    with pytest.raises(ConfigError, match="unknown reward keys"):
        RewardConfig.from_dict({"manger": "naive"})
    with pytest.raises(ConfigError, match="failure_policy"):
        RewardConfig.from_dict({"failure_policy": "ignore"})
    with pytest.raises(ConfigError, match="unknown reward manager .fancy.; registered: naive, prime, .*swedev"):
        make_reward_manager({"manager": "fancy"})
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        make_reward_manager({"manager": "naive", "scorer_modules": ["no_such_module"]})


def test_item_from_trajectory_scores_the_last_assistant_turn():
    traj = {"task_type": "gsm8k", "data_source": "openai/gsm8k", "ground_truth": "5", "num_turns": 2,
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 4"},
                         {"role": "user", "content": "Are you sure?"}, {"role": "assistant", "content": "#### 5"}]}
    item = item_from_trajectory(traj)
    assert item.solution_str == "#### 5" and item.extra_info["num_turns"] == 2
    assert item_from_trajectory(traj, "all_assistant").solution_str == "#### 4\n#### 5"
    with pytest.raises(ConfigError, match="trajectory 3: no 'ground_truth'"):
        make_reward_manager({"manager": "naive"}).score([traj, traj, traj, {"messages": []}])


# -- managers agree ------------------------------------------------------------------------
def test_naive_and_prime_give_identical_results_in_order():
    items = gsm8k_items(300)
    with make_reward_manager({"manager": "naive"}) as naive, \
            make_reward_manager({"manager": "prime", "num_workers": 2}) as prime:
        a, b = naive.score_items(items), prime.score_items(items)
    assert [r.as_dict() for r in a] == [r.as_dict() for r in b]
    assert [r.score for r in a[:4]] == [1.0, 0.0, 1.0, 0.0]
    assert prime.stats()["ok"] == 300


def test_scorer_kwargs_and_override_reach_the_scorer_in_workers():
    items = gsm8k_items(8)
    cfg = {"scorer_kwargs": {"gsm8k": {"method": "strict", "format_score": 0.25, "no_answer_score": -1.0}},
           "scorer": "gsm8k"}
    with make_reward_manager({"manager": "naive", **cfg}) as naive, \
            make_reward_manager({"manager": "prime", "num_workers": 2, **cfg}) as prime:
        a, b = naive.score_items(items), prime.score_items(items)
    assert [r.score for r in a] == [r.score for r in b] == [1.0, 0.25, -1.0, -1.0] * 2


def test_scorer_kwargs_keyed_by_name_apply_to_samples_selected_by_alias():
    items = gsm8k_items(4)  # data_source "openai/gsm8k": an alias of "gsm8k"
    with make_reward_manager({"manager": "naive", "scorer_kwargs": {"gsm8k": {"method": "strict"}}}) as m:
        assert [r.score for r in m.score_items(items)] == [1.0, 0.0, 0.0, 0.0]


# -- faults ----------------------------------------------------------------------------------
def fault_items() -> list[RewardItem]:
    good = gsm8k_items(len(FAULTS) + 3)
    bad = [RewardItem("#### 1", "1", scorer="faulty", extra_info={"fault": f}) for f in FAULTS]
    return [x for pair in zip(good, bad) for x in pair] + good[len(bad):]


def test_prime_survives_every_fault_and_loses_nothing():
    items = fault_items()
    # 384 MB: the memory hog reaches the limit in well under the timeout even on a loaded machine
    cfg = {"manager": "prime", "num_workers": 2, "timeout_s": 3.0, "memory_limit_mb": 384,
           "scorer_modules": ["va_faulty_scorers"]}
    t0 = time.perf_counter()
    with make_reward_manager(cfg) as m:
        results = m.score_items(items)
        stats = m.stats()
    wall = time.perf_counter() - t0
    assert len(results) == len(items) == 2 * len(FAULTS) + 3
    for item, r in zip(items, results):
        fault = item.extra_info.get("fault")
        if fault:
            assert r.error is not None and r.error.type == EXPECTED_ERROR[fault], (fault, r)
            assert r.score is None  # failure_policy=mask
        else:
            assert r.error is None and r.score == gsm8k_score(item.solution_str, item.ground_truth)["score"]
    # the hangs ran side by side with the rest, not one after the other
    assert wall < 2 * 3.0 + 3, wall
    # sleeping and spinning Python code is interrupted in place; the C-level hang costs its worker
    assert stats["pool/workers_killed"] == 1 and stats["error/worker_died"] == 1, stats
    assert stats["error/timeout"] == 3


def test_prime_kills_a_scorer_stuck_in_c_code_with_its_children(tmp_path):
    """A scorer stuck where SIGALRM cannot reach (C code holding the GIL) is killed, process group and all."""
    pid_file = tmp_path / "child.pid"
    cfg = {"manager": "prime", "num_workers": 1, "timeout_s": 0.5, "scorer_modules": ["va_faulty_scorers"]}
    with make_reward_manager(cfg) as m:
        item = RewardItem("x", "1", scorer="faulty", extra_info={"fault": "child_then_c_hang",
                                                                  "pid_file": str(pid_file)})
        m.score_items(gsm8k_items(1))  # the pool is up: what follows times the kill alone
        t0 = time.monotonic()
        (r,) = m.score_items([item])
        assert r.error.type == "timeout" and "killed" in r.error.message
        assert time.monotonic() - t0 < 0.5 + 1.0 + 2.0  # timeout + kill grace + slack
        child = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the scorer's child process survived"
        # the pool goes on with a fresh worker
        assert m.score_items(gsm8k_items(2))[0].score == 1.0
        assert m.stats()["pool/workers_killed"] == 1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_prime_interrupts_a_python_hang_without_losing_the_worker():
    cfg = {"manager": "prime", "num_workers": 1, "timeout_s": 0.3, "scorer_modules": ["va_faulty_scorers"]}
    with make_reward_manager(cfg) as m:
        items = [RewardItem("x", "1", scorer="faulty", extra_info={"fault": f}) for f in ("hang", "spin")]
        results = m.score_items(items + gsm8k_items(2))
        assert [r.error.type if r.error else r.score for r in results] == ["timeout", "timeout", 1.0, 0.0]
        assert "interrupted" in results[0].error.message
        assert m.stats().get("pool/workers_killed", 0) == 0


@pytest.mark.parametrize("policy,expected", [("mask", None), ("zero", 0.0), ("penalty", -2.0)])
def test_failure_policy_sets_the_score_but_keeps_the_error(policy, expected):
    item = RewardItem("#### 1", "1", scorer="faulty", extra_info={"fault": "raise"})
    with make_reward_manager({"manager": "naive", "failure_policy": policy, "penalty": -2.0}) as m:
        (r,) = m.score_items([item])
    assert r.score == expected and r.error.type == "scorer_error"
    assert m.stats()["error/scorer_error"] == 1


def test_naive_reports_a_hang_as_timeout_and_goes_on():
    items = [RewardItem("#### 1", "1", scorer="faulty", extra_info={"fault": "hang"})] + gsm8k_items(2)
    with make_reward_manager({"manager": "naive", "timeout_s": 0.3}) as m:
        t0 = time.perf_counter()
        results = m.score_items(items)
        assert time.perf_counter() - t0 < 3
    assert results[0].error.type == "timeout" and [r.score for r in results[1:]] == [1.0, 0.0]
    assert m.stats()["abandoned_threads"] == 1


def test_naive_in_process_faults_that_do_not_hang():
    items = [RewardItem("#### 1", "1", scorer="faulty", extra_info={"fault": f})
             for f in ("raise", "nan", "string", "none")] + [RewardItem(123, "1", "openai/gsm8k")]
    with make_reward_manager({"manager": "naive"}) as m:
        types = [r.error.type for r in m.score_items(items)]
    assert types == ["scorer_error", "invalid_score", "invalid_score", "invalid_score", "bad_input"]


def test_one_megabyte_response_is_scored():
    big = "blah " * 200_000 + "#### 42"
    items = [RewardItem(big, "42", "openai/gsm8k"), RewardItem(big, "41", "openai/gsm8k")]
    with make_reward_manager({"manager": "prime", "num_workers": 2}) as m:
        assert [r.score for r in m.score_items(items)] == [1.0, 0.0]


def test_prime_worker_start_failure_is_reported_not_hung(tmp_path, monkeypatch):
    """A scorer module that imports in the parent but crashes in the template process."""
    mod = tmp_path / "va_crashy_scorer_mod.py"
    mod.write_text("import os\nif os.environ.get('VA_CRASH_IN_WORKER'):\n    raise SystemExit('boom in worker')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = {"manager": "prime", "num_workers": 1, "scorer_modules": ["va_crashy_scorer_mod"]}
    with make_reward_manager(cfg) as m:
        monkeypatch.setenv("VA_CRASH_IN_WORKER", "1")
        results = m.score_items(gsm8k_items(3))
    assert all(r.error.type == "worker_died" and "failed to start" in r.error.message for r in results)


def _running_worker(m, timeout_s: float = 20.0):
    """The pool worker that is running a sample (the pool keeps more processes than num_workers)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for w in list(m.pool._workers):
            if w.running()[0] is not None:
                return w
        time.sleep(0.01)
    raise AssertionError("no worker started the sample")


def test_prime_sample_killed_from_outside_is_worker_died():
    cfg = {"manager": "prime", "num_workers": 1, "timeout_s": 30, "scorer_modules": ["va_faulty_scorers"]}
    with make_reward_manager(cfg) as m:
        fut = m.submit(RewardItem("x", "1", scorer="faulty", extra_info={"fault": "sleep", "sleep_s": 20}))
        os.kill(_running_worker(m).pid, signal.SIGKILL)  # as the OOM killer would
        r = fut.result(timeout=10)
    assert r.error.type == "worker_died"


async def test_async_scoring_keeps_the_event_loop_free():
    import asyncio

    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    items = [RewardItem("#### 1", "1", scorer="faulty", extra_info={"fault": "sleep", "sleep_s": 0.5})]
    with make_reward_manager({"manager": "naive", "scorer_modules": ["va_faulty_scorers"]}) as m:
        (r,) = await m.ascore_items(items)
    t.cancel()
    assert r.score == 1.0 and ticks >= 20


def test_builtin_managers_are_registered():
    assert {"naive", "prime", "swedev"} <= set(REWARD_MANAGERS.names())
    assert isinstance(RewardResult.from_dict({"score": 1, "extra": {}, "error": None}), RewardResult)


def test_closing_the_pool_resolves_samples_still_in_flight():
    cfg = {"manager": "prime", "num_workers": 1, "timeout_s": 60, "scorer_modules": ["va_faulty_scorers"]}
    m = make_reward_manager(cfg)
    fut = m.submit(RewardItem("x", "1", scorer="faulty", extra_info={"fault": "sleep", "sleep_s": 30}))
    _running_worker(m)
    m.close()
    r = fut.result(timeout=5)  # not left hanging
    assert r.error.type == "worker_died" and "closed" in r.error.message
    with pytest.raises(RuntimeError, match="closed"):
        m.submit(RewardItem("#### 1", "1", "openai/gsm8k"))


def test_prime_workers_start_with_the_builtin_scorers_loaded():
    """The template process looks the entry-point scorers up once; a forked worker does not import
    them inside its first item's timeout (which took ~0.15-0.3 s and failed items under load)."""
    with make_reward_manager({"manager": "prime", "num_workers": 1, "timeout_s": 0.1}) as m:
        for _ in range(3):  # three batches, each within the tight limit
            results = m.score_items(gsm8k_items(2))
            assert [r.error.type if r.error else r.score for r in results] == [1.0, 0.0]
