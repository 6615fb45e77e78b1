"""AsyncRollout end to end on real models: token exactness, dispatch, limits and failures."""

import asyncio
import gc
import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from verl_agentic.backends.base import GenerationBackend
from verl_agentic.backends.hf import HFBackend
from verl_agentic.interfaces import (
    ConfigError,
    EpisodeFailure,
    EpisodeResult,
    EpisodeState,
    Observation,
)
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift, write_jsonl
from verl_agentic.tasks import TASKS, TaskSpec, register_task

from va_testing import GSM8K_TEST, ScriptedPolicy

ENDED: list[str] = []  # uids whose end() ran


def _start(row, ctx):
    return EpisodeState(row=row, messages=[dict(m) for m in row["prompt"]], ctx=ctx)


def _obs_feedback(state, out):
    """Feedback after every turn; a turn reward that identifies the turn."""
    if state.row.get("explode_at") == state.num_turns:
        raise RuntimeError("boom")
    if state.row.get("fail_typed"):
        raise EpisodeFailure("tool_error", "the tool broke")
    info = {}
    if state.row.get("info") == "odd":  # values json cannot write as they are: kept as their str
        info = {"when": Path("/tmp/x"), "turn": state.num_turns, "tags": ("a", "b")}
    elif state.row.get("info") == "circular":
        info = {"self": None}
        info["self"] = info
    return Observation(messages=[{"role": "user", "content": f"Feedback {state.num_turns}: try again."}],
                       turn_reward=float(state.num_turns), info=info)


def _end(state):
    ENDED.append(state.row["uid"])
    if state.row.get("end_raises"):
        raise ValueError("end broke")
    return EpisodeResult(reward=float(state.num_turns), metrics={"custom": 1.0})


async def _slow_obs(state, out):
    await asyncio.sleep(30)
    return Observation(done=True)


register_task("_t_feedback", TaskSpec(start=_start, obs=_obs_feedback, end=_end), replace=True)
register_task("_t_slow", TaskSpec(start=_start, obs=_slow_obs, end=_end), replace=True)


def _row(uid, text="Count to three.", task="_t_feedback", **extra):
    return {"uid": uid, "task_type": task, "prompt": [{"role": "user", "content": text}],
            "reward_model": {"ground_truth": "0"}, **extra}


@pytest.fixture(scope="module")
def tiny_backend(tiny_qwen_dir):
    return HFBackend.from_pretrained(tiny_qwen_dir, max_batch_size=16, seed=0)


@pytest.fixture(scope="module")
def smol_backend(smol_dir):
    return HFBackend.from_pretrained(smol_dir, max_batch_size=16, seed=0)


def _rollout(backend, **kw):
    cfg = dict(max_turns=3, max_new_tokens=12, max_total_tokens=512, temperature=1.0, concurrency=8)
    cfg.update(kw)
    return AsyncRollout(backend, RolloutConfig(**cfg), seed=1)


class RecordingBackend(GenerationBackend):
    """Wraps a real backend and records what it generated (to compare with the trajectory)."""

    def __init__(self, inner):
        self.inner, self.outputs = inner, []
        self.tokenizer, self.stop_token_ids = inner.tokenizer, inner.stop_token_ids

    async def generate(self, prompt_ids, sampling):
        out = await self.inner.generate(prompt_ids, sampling)
        self.outputs.append((list(prompt_ids), out))
        return out


def test_multiturn_token_exactness_masks_and_logprobs(tiny_backend):
    backend = RecordingBackend(tiny_backend)
    trajs = _rollout(backend).run_sync([_row("a"), _row("b", "Say something longer, please.")])
    assert len(trajs) == 2 and all(t["error"] is None for t in trajs)
    by_prompt = {}
    for prompt, out in backend.outputs:
        by_prompt[tuple(prompt)] = out
    for t in trajs:
        assert t["num_turns"] == 3 and t["finish_reason"] == "max_turns"
        assert [x["role"] for x in t["turns"]] == ["assistant", "user", "assistant", "user", "assistant"]
        assert [x.get("reward") for x in t["turns"] if x["role"] == "assistant"] == [1.0, 2.0, 3.0]
        context = list(t["prompt_ids"])
        for turn in t["turns"]:
            span = t["response_ids"][turn["start"]:turn["end"]]
            if turn["role"] == "assistant":
                # the ids are exactly what the backend produced for exactly this context
                out = by_prompt[tuple(context)]
                assert span == out.token_ids
                assert t["response_logprobs"][turn["start"]:turn["end"]] == out.logprobs
                assert t["response_mask"][turn["start"]:turn["end"]] == [1] * len(span)
            else:
                assert t["response_mask"][turn["start"]:turn["end"]] == [0] * len(span)
                assert all(x is None for x in t["response_logprobs"][turn["start"]:turn["end"]])
            context += span
        report = check_drift(t, tiny_backend.tokenizer, stop_token_ids=tiny_backend.stop_token_ids)
        assert report.ok, report.as_dict()
        assert report.rerender_differing_tokens == 0  # Qwen2.5's template is append-only


def test_trajectory_logprobs_match_a_training_forward_pass(tiny_backend):
    """What a trainer recomputes at the masked positions equals the rollout logprobs."""
    t = _rollout(tiny_backend, temperature=0.8).run_sync([_row("lp")])[0]
    ids = torch.tensor([t["prompt_ids"] + t["response_ids"]])
    with torch.no_grad():
        logits = tiny_backend.model(ids).logits[0].float() / 0.8
    logp = torch.log_softmax(logits, -1)
    p = len(t["prompt_ids"])
    for i, (tok, m, lp) in enumerate(zip(t["response_ids"], t["response_mask"], t["response_logprobs"])):
        if m:
            assert lp == pytest.approx(logp[p + i - 1, tok].item(), abs=2e-4)


def test_smollm2_gsm8k_feedback_episode_with_stop_tokens(smol_backend):
    from verl_agentic.agentic_utils import load_rows

    rows = load_rows(GSM8K_TEST, "gsm8k", max_samples=2)
    rollout = AsyncRollout(smol_backend, RolloutConfig(max_turns=2, max_new_tokens=48, temperature=0.0),
                           task_configs={"gsm8k": {"feedback": "always_verify"}})
    trajs = rollout.run_sync(rows)
    eos = smol_backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for t in trajs:
        assert t["error"] is None and t["num_turns"] == 2
        assert "Are you sure? Can you write Python code to verify?" in t["messages"][2]["content"]
        assert {"first_correct", "final_correct", "flips_wrong_to_right", "latency_s"} <= set(t["metrics"])
        assert check_drift(t, smol_backend.tokenizer, stop_token_ids=smol_backend.stop_token_ids).ok
    # a short instruction-following prompt ends its turn with the model's own <|im_end|>
    hi = {"uid": "hi", "task_type": "gsm8k", "prompt": [{"role": "user", "content": "Say hello."}],
          "reward_model": {"ground_truth": "1"}}
    t = rollout.run_sync([hi])[0]
    first = t["turns"][0]
    assert first["finish_reason"] == "stop" and t["response_ids"][first["end"] - 1] == eos
    assert t["response_ids"][first["end"]] != eos  # the end-of-turn token is not inserted twice
    assert check_drift(t, smol_backend.tokenizer, stop_token_ids=smol_backend.stop_token_ids).ok


def test_mixed_task_types_and_n_samples(tiny_backend):
    @register_task("_t_once", replace=True)
    class Once:
        def start(self, row, ctx):
            return _start(row, ctx)

        def obs(self, state, out):
            return Observation(done=True, turn_reward=0.5)

        def end(self, state):
            return EpisodeResult(reward=0.5)

    try:
        rows = [_row("x"), _row("y", task="_t_once"), _row("z")]
        trajs = _rollout(tiny_backend, n=2).run_sync(rows)
        assert [(t["uid"], t["sample_id"], t["task_type"]) for t in trajs] == [
            ("x", 0, "_t_feedback"), ("x", 1, "_t_feedback"), ("y", 0, "_t_once"), ("y", 1, "_t_once"),
            ("z", 0, "_t_feedback"), ("z", 1, "_t_feedback")]
        assert [t["num_turns"] for t in trajs] == [3, 3, 1, 1, 3, 3]
        assert trajs[2]["finish_reason"] == "stop" and trajs[2]["reward"] == 0.5
        # sampled at temperature 1 with per-sample seeds: the two samples of a prompt differ
        assert trajs[0]["response_ids"] != trajs[1]["response_ids"]
    finally:
        TASKS.unregister("_t_once")


def test_seeded_rollout_is_reproducible(tiny_backend):
    a = _rollout(tiny_backend).run_sync([_row("r1"), _row("r2")])
    b = _rollout(tiny_backend, concurrency=1).run_sync([_row("r1"), _row("r2")])  # other batching
    assert [t["response_ids"] for t in a] == [t["response_ids"] for t in b]


def test_unknown_task_type_fails_before_generation_listing_registered(tiny_backend):
    backend = RecordingBackend(tiny_backend)
    with pytest.raises(ConfigError) as e:
        _rollout(backend).run_sync([_row("ok"), _row("bad", task="gsm9k")])
    assert "row 1" in str(e.value) and "gsm9k" in str(e.value) and "gsm8k" in str(e.value)
    assert backend.outputs == []
    with pytest.raises(ConfigError, match="empty"):
        _rollout(backend).run_sync([])


def test_failing_obs_marks_only_that_episode(tiny_backend):
    ENDED.clear()
    rows = [_row("fine"), _row("explodes", explode_at=2), _row("typed", fail_typed=True), _row("endfail", end_raises=True)]
    trajs = {t["uid"]: t for t in _rollout(tiny_backend).run_sync(rows)}
    assert trajs["fine"]["error"] is None and trajs["fine"]["num_turns"] == 3
    boom = trajs["explodes"]
    assert boom["error"]["type"] == "task_error" and "boom" in boom["error"]["message"]
    assert boom["finish_reason"] == "error" and boom["num_turns"] == 2
    assert check_drift(boom, tiny_backend.tokenizer).ok  # what was generated before the error is kept intact
    assert trajs["typed"]["error"] == {"type": "tool_error", "message": "the tool broke"}
    assert trajs["endfail"]["error"]["type"] == "end_error"
    assert sorted(ENDED) == sorted(rows_uid["uid"] for rows_uid in rows)  # end ran for every episode


def test_turn_info_is_stored_as_json_and_a_broken_one_fails_only_its_episode(tiny_backend, tmp_path):
    rows = [_row("plain"), _row("odd", info="odd"), _row("circular", info="circular")]
    trajs = {t["uid"]: t for t in _rollout(tiny_backend).run_sync(rows)}
    assert all("info" not in x for x in trajs["plain"]["turns"])  # no info: no key
    odd = [x["info"] for x in trajs["odd"]["turns"] if x["role"] == "assistant"]
    assert odd == [{"when": "/tmp/x", "turn": k, "tags": ["a", "b"]} for k in (1, 2, 3)]
    bad = trajs["circular"]
    assert bad["error"]["type"] == "task_error" and "not JSON-serialisable" in bad["error"]["message"]
    assert bad["num_turns"] == 1 and trajs["plain"]["error"] is None and trajs["odd"]["error"] is None
    assert write_jsonl(tmp_path / "t.jsonl", trajs.values()) == 3  # the dump never breaks


def test_prompt_longer_than_max_total_tokens(tiny_backend):
    backend = RecordingBackend(tiny_backend)
    t = _rollout(backend, max_total_tokens=8).run_sync([_row("long")])[0]
    assert t["finish_reason"] == "length" and t["error"]["type"] == "context_overflow"
    assert "max_total_tokens=8" in t["error"]["message"] and t["response_ids"] == []
    assert backend.outputs == []


def test_context_budget_ends_episode_with_length(tiny_backend):
    prompt_len = len(_rollout(tiny_backend).template.prompt_ids(_row("b")["prompt"]))
    budget = prompt_len + 12 + 20  # room for one full turn and part of the next
    t = _rollout(tiny_backend, max_total_tokens=budget).run_sync([_row("b")])[0]
    assert t["finish_reason"] == "length" and t["error"]["type"] == "context_overflow"
    assert len(t["prompt_ids"]) + len(t["response_ids"]) <= budget
    assert check_drift(t, tiny_backend.tokenizer).ok


def test_episode_timeout_is_typed_and_end_runs(tiny_backend):
    ENDED.clear()
    t = _rollout(tiny_backend, episode_timeout_s=0.5).run_sync([_row("slow", task="_t_slow")])[0]
    assert t["error"]["type"] == "timeout" and t["finish_reason"] == "error" and ENDED == ["slow"]


def test_cancellation_runs_end(tiny_backend):
    ENDED.clear()

    async def main():
        task = asyncio.create_task(_rollout(tiny_backend).run([_row("c1", task="_t_slow")]))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert ENDED == ["c1"]


def test_start_failure_is_captured(tiny_backend):
    row = _row("nogt", task="gsm8k")
    row["reward_model"] = {"ground_truth": "not a number"}
    t = _rollout(tiny_backend).run_sync([row, _row("fine")])
    assert t[0]["error"]["type"] == "task_error" and "ground_truth" in t[0]["error"]["message"]
    assert t[1]["error"] is None


def test_bad_rollout_config_values():
    with pytest.raises(ConfigError, match="rollout.max_turns must be >= 1"):
        RolloutConfig(max_turns=0)
    with pytest.raises(ConfigError, match="top_p"):
        RolloutConfig(top_p=0)


def test_missing_model_path_is_clear():
    from verl_agentic.models.embedded import resolve_model_path

    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path("/nonexistent/model")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model_path(str(Path(__file__).parent))


class SigtermOnSecondCall(ScriptedPolicy):
    """The scripted policy, but its second call sends this process a real SIGTERM: the handler installed
    (``main_rollout.StopSignals``, the CLIs') raises it as ``KeyboardInterrupt`` inside that episode's task."""

    async def generate(self, prompt_ids, sampling):
        if self.requests == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return await super().generate(prompt_ids, sampling)


@pytest.mark.parametrize("run", ["run_sync", "asyncio.run"])
def test_a_stop_inside_an_episode_leaves_no_unretrieved_task_traceback(qwen25_tokenizer, caplog, run):
    """main_rollout printed its "to continue" line, then asyncio's "Task exception was never retrieved" with
    a traceback (tests/test_faults.py caught it once): a stop that lands while a task runs leaves that task
    finished with it. ``run_sync`` keeps the stop and drops the report; plain ``asyncio.run`` (the control)
    prints it."""
    from verl_agentic.main_rollout import StopSignals

    rollout = AsyncRollout(SigtermOnSecondCall(qwen25_tokenizer, ["The answer is 1."]),
                           RolloutConfig(max_turns=3, max_new_tokens=12, max_total_tokens=512), seed=1)
    rows = [_row("a"), _row("b")]
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with StopSignals() as signals, pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            rollout.run_sync(rows) if run == "run_sync" else asyncio.run(rollout.run(rows))
        gc.collect()  # the finished task's report comes when it is freed
    assert signals.received == signal.SIGTERM
    assert ("never retrieved" in caplog.text) == (run == "asyncio.run"), caplog.text
