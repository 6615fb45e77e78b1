"""Our reward managers inside verl's reward loop (verl_agentic/verl_plugin/reward.py).

Everything is real: verl's composed trainer config (hydra, ``ppo_trainer``), verl's
``load_reward_manager``, ``RewardLoopWorker`` (in-process) and ``RewardLoopManager`` (Ray CPU
actors, as the trainer runs it), the Qwen2.5 tokenizer, ``DataProto`` batches shaped like verl's
(left-padded prompts, right-padded responses, attention/response masks), our scorers, the
``prime`` process pool and the reward server in its own process.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from va_services import ServiceProcess
from va_testing import GSM8K_TEST, QWEN25_DIR

import verl  # noqa: F401  (loads the verl.plugins entry points, ours included)
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
from verl.trainer.ppo.reward import load_reward_manager

from verl_agentic.interfaces import ConfigError
from verl_agentic.reward import RewardConfig, RewardItem, make_reward_manager
from verl_agentic.tasks.gsm8k import ground_truth_from_solution
from verl_agentic.verl_plugin.convert import EPISODE_METRICS
from verl_agentic.verl_plugin.reward import (
    AgenticNaiveRewardManager,
    AgenticPrimeRewardManager,
    AgenticSwedevRewardManager,
    close_shared_managers,
    solution_token_ids,
)

PYTHON = sys.executable
VERL_CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
DATA_SOURCE = "openai/gsm8k"
PROMPT_LEN, RESPONSE_LEN = 160, 96


# --------------------------------------------------------------------------------------------
# helpers


def verl_config(*overrides: str):
    """verl's real trainer config (``ppo_trainer.yaml`` composed by hydra) with command-line overrides."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def gsm8k_rows(n: int) -> list[tuple[str, str]]:
    rows = []
    with open(GSM8K_TEST) as f:
        for line in f:
            row = json.loads(line)
            rows.append((row["question"], ground_truth_from_solution(row["answer"])))
            if len(rows) == n:
                break
    return rows


def assistant(text: str) -> tuple[str, int]:
    return text + "<|im_end|>", 1


def injected(text: str) -> tuple[str, int]:
    """A user/tool turn an agent loop puts between two assistant turns (mask 0)."""
    return f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", 0


class Sample:
    def __init__(self, question: str, truth: str, segments: list[tuple[str, int]], extra: dict | None = None):
        self.question, self.truth, self.segments, self.extra = question, truth, segments, extra or {}

    @property
    def last_assistant(self) -> str:
        return [t for t, m in self.segments if m][-1].removesuffix("<|im_end|>")

    @property
    def all_assistant(self) -> str:
        return "\n".join(t.removesuffix("<|im_end|>") for t, m in self.segments if m)

    @property
    def whole(self) -> str:
        return re.sub(r"<\|im_(start|end)\|>", "", "".join(t for t, _ in self.segments))


def make_batch(tokenizer, samples: list[Sample], with_response_mask: bool = True) -> DataProto:
    """A verl batch as the agent loop hands it to the reward loop."""
    n = len(samples)
    pad = tokenizer.pad_token_id
    prompts = torch.full((n, PROMPT_LEN), pad, dtype=torch.long)
    responses = torch.full((n, RESPONSE_LEN), pad, dtype=torch.long)
    attention = torch.zeros((n, PROMPT_LEN + RESPONSE_LEN), dtype=torch.long)
    response_mask = torch.zeros((n, RESPONSE_LEN), dtype=torch.long)
    for i, s in enumerate(samples):
        chat = tokenizer.apply_chat_template([{"role": "user", "content": s.question}], add_generation_prompt=True,
                                             tokenize=False)
        p_ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
        assert len(p_ids) <= PROMPT_LEN
        prompts[i, PROMPT_LEN - len(p_ids):] = torch.tensor(p_ids)
        attention[i, PROMPT_LEN - len(p_ids):PROMPT_LEN] = 1
        r_ids, r_mask = [], []
        for text, m in s.segments:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            r_ids += ids
            r_mask += [m] * len(ids)
        assert len(r_ids) <= RESPONSE_LEN
        responses[i, :len(r_ids)] = torch.tensor(r_ids)
        response_mask[i, :len(r_ids)] = torch.tensor(r_mask)
        attention[i, PROMPT_LEN:PROMPT_LEN + len(r_ids)] = 1
    tensors = {"prompts": prompts, "responses": responses, "attention_mask": attention,
               "input_ids": torch.cat([prompts, responses], dim=1)}
    if with_response_mask:
        tensors["response_mask"] = response_mask
    non_tensors = {
        "data_source": np.array([DATA_SOURCE] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": s.truth, "style": "rule"} for s in samples], dtype=object),
        "extra_info": np.array([{"index": i, **s.extra} for i, s in enumerate(samples)], dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def run_all(manager, data: DataProto) -> list[dict]:
    """What verl's RewardLoopWorker.compute_score_batch does: run_single per sample, concurrently."""
    async def go():
        return await asyncio.gather(*(manager.run_single(data[i:i + 1]) for i in range(len(data))))

    return asyncio.run(go())


def gather_like_verl(outputs: list[dict]) -> dict[str, np.ndarray]:
    """RewardLoopManager.compute_rm_score's gathering of reward_extra_info (first sample's keys)."""
    infos = [o["reward_extra_info"] for o in outputs]
    return {key: np.array([info[key] for info in infos]) for key in infos[0]}


def naive_scores(texts: list[str], samples: list[Sample], **cfg) -> list[float]:
    items = [RewardItem(solution_str=t, ground_truth=s.truth, data_source=DATA_SOURCE) for t, s in zip(texts, samples)]
    with make_reward_manager(RewardConfig(manager="naive", **cfg)) as m:
        return [r.score for r in m.score_items(items)]


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    (q0, t0), (q1, t1), (q2, t2) = gsm8k_rows(3)
    wrong = lambda t: str(int(t) + 7)  # noqa: E731
    return [
        Sample(q0, t0, [assistant(f"She sells 9 eggs for $2 each.\n#### {t0}")]),  # right
        Sample(q1, t1, [assistant(f"I think it is {wrong(t1)}.\n#### {wrong(t1)}")]),  # wrong
        Sample(q2, t2, [assistant("I cannot solve this one.")]),  # no answer
        Sample(q0, t0, [assistant(f"#### {wrong(t0)}"), injected("That is wrong, try again."),  # wrong -> right
                        assistant(f"Let me recompute: 16 - 3 - 4 = 9, 9 * 2 = {t0}.\n#### {t0}")]),
        Sample(q1, t1, [assistant(f"#### {t1}"), injected(f"The checker printed #### {t1}. Explain."),  # right -> none
                        assistant("I would rather not explain.")]),
    ]


@pytest.fixture(scope="module")
def expected(samples):
    # gsm8k (flexible by default): by hand, then the last assistant turn decides
    return [1.0, 0.0, 0.0, 1.0, 0.0]


@pytest.fixture(autouse=True, scope="module")
def _close_managers():
    yield
    close_shared_managers()


# --------------------------------------------------------------------------------------------
# plugin loading


def test_import_verl_registers_our_managers_through_the_entry_point():
    code = textwrap.dedent("""
        import json
        import verl
        from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
        names = ("agentic_naive", "prime", "agentic_prime", "agentic_remote", "swedev", "agentic_swedev", "naive")
        classes = {n: get_reward_manager_cls(n) for n in names}  # what resolve_reward_manager_cls calls
        print(json.dumps({n: c.__module__ + "." + c.__qualname__ for n, c in classes.items()}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "VERL_USE_EXTERNAL_MODULES")}
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    mod = "verl_agentic.verl_plugin.reward."
    assert got == {
        "agentic_naive": mod + "AgenticNaiveRewardManager",
        "prime": mod + "AgenticPrimeRewardManager",
        "agentic_prime": mod + "AgenticPrimeRewardManager",
        "agentic_remote": mod + "AgenticRemoteRewardManager",
        "swedev": mod + "AgenticSwedevRewardManager",
        "agentic_swedev": mod + "AgenticSwedevRewardManager",
        "naive": "verl.experimental.reward_loop.reward_manager.naive.NaiveRewardManager",  # verl's stays verl's
    }
    # and it is the plugin mechanism that did it: with plugins off, the names are unknown
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    off = subprocess.run([PYTHON, "-c", "import verl, json\nfrom verl.experimental.reward_loop.reward_manager.registry "
                                        "import REWARD_MANAGER\nprint(json.dumps(sorted(REWARD_MANAGER)))"],
                         capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert off.returncode == 0, off.stderr[-3000:]
    names = json.loads(off.stdout.strip().splitlines()[-1])
    assert "naive" in names and not {"agentic_naive", "prime", "swedev"} & set(names)


def test_a_short_name_verl_already_owns_is_left_to_verl_with_a_warning():
    code = textwrap.dedent("""
        import json, warnings
        import verl
        from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
        from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER, register

        @register("prime")
        class TheirPrime(RewardManagerBase):
            async def run_single(self, data):
                return {}

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import verl_agentic.verl_plugin
        print(json.dumps({"prime": REWARD_MANAGER["prime"].__name__,
                          "agentic_prime": REWARD_MANAGER["agentic_prime"].__name__,
                          "warned": [str(w.message) for w in caught if "already has" in str(w.message)]}))
    """)
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"}
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["prime"] == "TheirPrime" and got["agentic_prime"] == "AgenticPrimeRewardManager"
    assert len(got["warned"]) == 1 and "registered as agentic_prime only" in got["warned"][0]


def test_registered_in_this_process_too():
    assert REWARD_MANAGER["agentic_naive"] is AgenticNaiveRewardManager
    assert REWARD_MANAGER["prime"] is AgenticPrimeRewardManager
    assert REWARD_MANAGER["swedev"] is AgenticSwedevRewardManager


def test_solution_token_ids_picks_runs_of_the_mask_within_the_valid_response():
    ids = torch.arange(10, 20)  # 10 response slots, 8 valid (2 padding)
    attention = torch.tensor([1, 1, 1] + [1] * 8 + [0, 0])  # 3 prompt tokens, then the response part
    mask = torch.tensor([1, 1, 0, 0, 1, 1, 1, 0, 1, 1])  # the last run lies in the padding: ignored
    assert solution_token_ids(ids, attention, mask) == [[14, 15, 16]]
    assert solution_token_ids(ids, attention, mask, "all_assistant") == [[10, 11], [14, 15, 16]]
    assert solution_token_ids(ids, attention, None) == [list(range(10, 18))]
    assert solution_token_ids(ids, attention, torch.zeros(10, dtype=torch.long)) == []  # no model tokens
    ends_on_one = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 0, 0])
    assert solution_token_ids(ids, attention, ends_on_one) == [list(range(12, 18))]
    assert solution_token_ids(ids, attention, ends_on_one.tolist()) == [list(range(12, 18))]  # a list works too


# --------------------------------------------------------------------------------------------
# scoring through load_reward_manager


@pytest.mark.parametrize("name", ["agentic_naive", "prime"])
def test_scores_match_our_naive_manager_and_score_the_last_assistant_turn(name, qwen25_tokenizer, samples, expected):
    cfg = verl_config(f"reward.reward_manager.name={name}", "+reward.agentic.timeout_s=20",
                      "+reward.agentic.num_workers=2", "+reward.agentic.extra_keys=[pred]")
    manager = load_reward_manager(cfg, qwen25_tokenizer)
    assert type(manager) is REWARD_MANAGER[name]
    assert manager.reward_manager.name == {"agentic_naive": "naive", "prime": "prime"}[name]
    data = make_batch(qwen25_tokenizer, samples)

    # the scored text is exactly the last assistant turn, decoded without special tokens
    for i, s in enumerate(samples):
        assert manager.build_item(data[i:i + 1]).solution_str == s.last_assistant

    outputs = run_all(manager, data)
    scores = [o["reward_score"] for o in outputs]
    assert scores == expected
    assert scores == naive_scores([s.last_assistant for s in samples], samples)
    # scoring the whole response (injected text included) would differ on the last sample
    assert naive_scores([s.whole for s in samples], samples)[4] == 1.0

    info = gather_like_verl(outputs)
    assert set(info) == {"acc", "reward_failed", "reward_error_type", "pred", *EPISODE_METRICS}
    assert info["acc"].tolist() == expected
    assert info["reward_failed"].tolist() == [0] * 5
    assert info["reward_error_type"].tolist() == [""] * 5
    assert info["pred"].tolist()[:3] == [samples[0].truth, str(int(samples[1].truth) + 7), None]
    # all samples of one gather went to our manager as ONE batch
    stats = manager.stats()
    assert stats["adapter/batches"] == 1 and stats["adapter/items"] == 5
    assert stats["ok"] >= 5


def test_without_response_mask_the_whole_valid_response_is_scored(qwen25_tokenizer, samples):
    manager = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive"), qwen25_tokenizer)
    data = make_batch(qwen25_tokenizer, samples, with_response_mask=False)
    texts = [manager.build_item(data[i:i + 1]).solution_str for i in range(len(samples))]
    assert texts == [s.whole for s in samples]
    scores = [o["reward_score"] for o in run_all(manager, data)]
    assert scores == naive_scores([s.whole for s in samples], samples)
    assert scores[4] == 1.0  # the injected "#### N" now counts: why the mask matters


def test_all_assistant_mode_and_mask_from_tool_extra_fields(qwen25_tokenizer, samples):
    manager = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive",
                                              "+reward.agentic.solution=all_assistant"), qwen25_tokenizer)
    data = make_batch(qwen25_tokenizer, samples)
    assert [manager.build_item(data[i:i + 1]).solution_str for i in range(5)] == [s.all_assistant for s in samples]
    assert [o["reward_score"] for o in run_all(manager, data)] == naive_scores(
        [s.all_assistant for s in samples], samples)

    # verl's streaming reward (AgentLoopWorker._compute_score) sends no response_mask tensor; an agent
    # loop can put the mask into its extra_fields, which arrive as tool_extra_fields
    last = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive"), qwen25_tokenizer)
    streamed = make_batch(qwen25_tokenizer, samples, with_response_mask=False)
    masks = make_batch(qwen25_tokenizer, samples).batch["response_mask"]
    streamed.non_tensor_batch["tool_extra_fields"] = np.array(
        [{"response_mask": masks[i].tolist(), "turn_scores": [0.5], "raw_prompt": "x" * 100} for i in range(5)],
        dtype=object)
    streamed.non_tensor_batch["__num_turns__"] = np.array([2, 2, 2, 4, 4], dtype=np.int32)
    item = last.build_item(streamed[4:5])
    assert item.solution_str == samples[4].last_assistant
    assert item.extra_info == {"index": 4, "turn_scores": [0.5], "num_turns": 4}  # bulky fields left out
    json.dumps(item.extra_info)  # plain JSON types (numpy converted): safe for the reward server
    assert [o["reward_score"] for o in run_all(last, streamed)] == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_the_episodes_own_extra_info_reaches_the_scorer_and_its_metrics_the_result(qwen25_tokenizer, samples):
    """A task_agent episode's extra_info (the row's plus what the task added, e.g. a swedev submission)
    overrides the dataset's for the scorer; the bulky agentic field itself is not sent; the episode's
    metrics come back in reward_extra_info."""
    manager = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive"), qwen25_tokenizer)
    data = make_batch(qwen25_tokenizer, samples[:1])
    agentic = {"extra_info": {"index": 0, "swedev_submission": {"files": {"a.py": "x = 1\n"}}},
               "num_assistant_turns": 3, "reward": 1.0, "error": None, "messages": [{"role": "user"}] * 50,
               "metrics": {"first_correct": 0.0, "final_correct": 1.0, "flips_wrong_to_right": 1.0},
               "turns": [{"role": "assistant", "info": {"tool_calls": [{"name": "python", "status": "ok"},
                                                                      {"name": "python", "status": "timeout"}]}}]}
    data.non_tensor_batch["tool_extra_fields"] = np.array([{"agentic": agentic}], dtype=object)
    item = manager.build_item(data)
    assert item.extra_info == {"index": 0, "swedev_submission": {"files": {"a.py": "x = 1\n"}}}
    info = run_all(manager, data)[0]["reward_extra_info"]
    assert {k: info[k] for k in EPISODE_METRICS} == {
        "turns": 3.0, "task_reward": 1.0, "first_correct": 0.0, "final_correct": 1.0, "flips_wrong_to_right": 1.0,
        "flips_right_to_wrong": 0.0, "answered": 0.0, "tool_calls": 2.0, "tool_ok": 1.0,
        "invalid_tool_calls": 0.0, "invalid_tool_call_stop": 0.0, "episode_error": 0.0}


def test_manager_is_shared_per_configuration(qwen25_tokenizer):
    a = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive", "+reward.agentic.timeout_s=7"),
                            qwen25_tokenizer)
    b = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive", "+reward.agentic.timeout_s=7"),
                            qwen25_tokenizer)
    c = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive", "+reward.agentic.timeout_s=8"),
                            qwen25_tokenizer)
    assert a.reward_manager is b.reward_manager
    assert c.reward_manager is not a.reward_manager and c.reward_manager.config.timeout_s == 8


def test_strict_scorer_kwargs_from_the_config(qwen25_tokenizer, samples):
    (q, t), = gsm8k_rows(1)
    flexible_only = [Sample(q, t, [assistant(f"The answer is {t}.")])]  # right, but not "#### N"
    data = make_batch(qwen25_tokenizer, flexible_only)
    flex = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive"), qwen25_tokenizer)
    # scorer_kwargs are keyed by the scorer name that is resolved: force "gsm8k" so the key applies to the
    # samples' data_source "openai/gsm8k" (an alias of the same scorer)
    strict = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive", "+reward.agentic.scorer=gsm8k",
                                             "+reward.agentic.scorer_kwargs={gsm8k:{method:strict}}"),
                                 qwen25_tokenizer)
    assert run_all(flex, data)[0]["reward_score"] == 1.0
    assert run_all(strict, data)[0]["reward_score"] == 0.0


# --------------------------------------------------------------------------------------------
# verl's reward-loop worker (the class verl runs as a Ray actor; here in-process, no Ray)


def test_through_verl_reward_loop_worker(qwen25_tokenizer, samples, expected):
    from verl.experimental.reward_loop import RewardLoopWorker

    cfg = verl_config("reward.reward_manager.name=prime", "+reward.agentic.num_workers=2",
                      f"actor_rollout_ref.model.path={QWEN25_DIR}")
    worker = RewardLoopWorker(cfg)
    assert isinstance(worker.reward_manager, AgenticPrimeRewardManager)
    data = make_batch(qwen25_tokenizer, samples)

    async def go():
        return await worker.compute_score_batch(data)

    outputs = asyncio.run(go())
    assert [o["reward_score"] for o in outputs] == expected
    rm_scores = REWARD_MANAGER["prime"].assemble_rm_scores(data, [o["reward_score"] for o in outputs])
    last_token = data.batch["attention_mask"][:, PROMPT_LEN:].sum(dim=1) - 1
    assert rm_scores.sum(dim=1).tolist() == expected
    assert rm_scores[torch.arange(5), last_token].tolist() == expected
    assert set(gather_like_verl(outputs)) == {"acc", "reward_failed", "reward_error_type", *EPISODE_METRICS}


@pytest.mark.serial  # a Ray cluster of its own
def test_through_verl_reward_loop_manager_in_ray(qwen25_tokenizer, samples, expected):
    """The trainer's own path: RewardLoopManager starts RewardLoopWorker Ray actors (CPU-only), whose
    ``import verl`` loads our plugin through the entry point; compute_rm_score returns rm_scores + extra keys."""
    import ray

    from verl.experimental.reward_loop import RewardLoopManager

    cfg = verl_config("reward.reward_manager.name=prime", "reward.num_workers=2", "+reward.agentic.num_workers=1",
                      f"actor_rollout_ref.model.path={QWEN25_DIR}")
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = RewardLoopManager(cfg).compute_rm_score(make_batch(qwen25_tokenizer, samples))
    finally:
        ray.shutdown()
    assert out.batch["rm_scores"].sum(dim=1).tolist() == expected
    assert out.meta_info["reward_extra_keys"] == ["acc", "reward_failed", "reward_error_type", *EPISODE_METRICS]
    assert out.non_tensor_batch["reward_failed"].tolist() == [0] * 5
    assert out.non_tensor_batch["acc"].tolist() == expected


# --------------------------------------------------------------------------------------------
# failures


@pytest.mark.parametrize("name", ["agentic_naive", "prime"])
def test_scorer_failures_become_flags_in_extra_info(name, qwen25_tokenizer, samples):
    faults = [None, "raise", "nan", None, "string"]
    bad = [Sample(s.question, s.truth, s.segments, {"fault": f} if f else {}) for s, f in zip(samples, faults)]
    data = make_batch(qwen25_tokenizer, bad)
    base = [f"reward.reward_manager.name={name}", "+reward.agentic.scorer=faulty",
            "+reward.agentic.scorer_modules=[va_faulty_scorers]", "+reward.agentic.num_workers=2"]

    masked = load_reward_manager(verl_config(*base), qwen25_tokenizer)  # failure_policy=mask (default)
    outputs = run_all(masked, data)
    info = gather_like_verl(outputs)
    assert [o["reward_score"] for o in outputs] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert info["reward_failed"].tolist() == [0, 1, 1, 0, 1]
    assert info["reward_error_type"].tolist() == ["", "scorer_error", "invalid_score", "", "invalid_score"]
    assert info["acc"].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    # the fixed keys plus the episode metrics (all 0.0 here: these samples did not come from task_agent)
    assert all(set(o["reward_extra_info"]) == {"acc", "reward_failed", "reward_error_type", *EPISODE_METRICS}
               for o in outputs)
    assert all(o["reward_extra_info"][k] == 0.0 for o in outputs for k in EPISODE_METRICS)

    penalised = load_reward_manager(verl_config(*base, "+reward.agentic.failure_policy=penalty",
                                                "+reward.agentic.penalty=-0.5"), qwen25_tokenizer)
    assert [o["reward_score"] for o in run_all(penalised, data)] == [1.0, -0.5, -0.5, 1.0, -0.5]


def test_prime_timeout_is_flagged(qwen25_tokenizer, samples):
    hang = [Sample(samples[0].question, samples[0].truth, samples[0].segments, {"fault": "hang"}), samples[0]]
    manager = load_reward_manager(verl_config("reward.reward_manager.name=prime", "+reward.agentic.scorer=faulty",
                                              "+reward.agentic.scorer_modules=[va_faulty_scorers]",
                                              "+reward.agentic.num_workers=2", "+reward.agentic.timeout_s=1.5"),
                                  qwen25_tokenizer)
    t0 = time.monotonic()
    outputs = run_all(manager, make_batch(qwen25_tokenizer, hang))
    assert time.monotonic() - t0 < 20
    assert [o["reward_score"] for o in outputs] == [0.0, 1.0]
    assert outputs[0]["reward_extra_info"] == {"acc": 0.0, "reward_failed": 1, "reward_error_type": "timeout",
                                               **dict.fromkeys(EPISODE_METRICS, 0.0)}


# --------------------------------------------------------------------------------------------
# configuration errors


def test_config_errors_are_clear(qwen25_tokenizer, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown reward.agentic keys \['timeout'\].*timeout_s"):
        load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive", "+reward.agentic.timeout=3"),
                            qwen25_tokenizer)
    with pytest.raises(ConfigError, match="needs the reward server's address"):
        load_reward_manager(verl_config("reward.reward_manager.name=swedev"), qwen25_tokenizer)
    with pytest.raises(ConfigError, match="contradicts reward.reward_manager.name"):
        load_reward_manager(verl_config("reward.reward_manager.name=prime", "+reward.agentic.manager=naive"),
                            qwen25_tokenizer)
    with pytest.raises(ConfigError, match="failure_policy"):
        load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive",
                                        "+reward.agentic.failure_policy=ignore"), qwen25_tokenizer)
    with pytest.raises(ConfigError, match="always emitted"):
        load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive",
                                        "+reward.agentic.extra_keys=[acc]"), qwen25_tokenizer)
    # verl's custom_reward_function is rejected, not silently ignored
    fn = tmp_path / "my_reward.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    with pytest.raises(ConfigError, match="custom_reward_function.*register_scorer"):
        load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive",
                                        f"reward.custom_reward_function.path={fn}"), qwen25_tokenizer)


def test_missing_ground_truth_is_a_clear_error(qwen25_tokenizer, samples):
    manager = load_reward_manager(verl_config("reward.reward_manager.name=agentic_naive"), qwen25_tokenizer)
    data = make_batch(qwen25_tokenizer, samples[:1])
    data.non_tensor_batch["reward_model"] = np.array([{"style": "rule"}], dtype=object)
    with pytest.raises(ValueError, match="'reward_model' dict with 'ground_truth'"):
        run_all(manager, data)


# --------------------------------------------------------------------------------------------
# swedev: the reward server in its own process


@pytest.fixture(scope="module")
def reward_server():
    with ServiceProcess("verl_agentic.reward.server", "--workers", "2", "--timeout-s", "10", "--scorer-module",
                        "va_faulty_scorers", "--quiet", ready="reward server listening on ",
                        start_timeout_s=90) as server:
        yield server.url
        assert server.stop() == 0


def test_swedev_through_the_reward_server(reward_server, qwen25_tokenizer, samples, expected):
    manager = load_reward_manager(verl_config("reward.reward_manager.name=swedev",
                                              f"+reward.agentic.url={reward_server}",
                                              "+reward.agentic.extra_keys=[answered]"), qwen25_tokenizer)
    assert manager.reward_manager.name == "swedev"
    outputs = run_all(manager, make_batch(qwen25_tokenizer, samples))
    assert [o["reward_score"] for o in outputs] == expected
    assert [o["reward_score"] for o in outputs] == naive_scores([s.last_assistant for s in samples], samples)
    assert gather_like_verl(outputs)["answered"].tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert manager.stats()["adapter/batches"] == 1

    faults = [None, "raise", None, None, "nan"]
    bad = [Sample(s.question, s.truth, s.segments, {"fault": f} if f else {}) for s, f in zip(samples, faults)]
    faulty = load_reward_manager(verl_config("reward.reward_manager.name=swedev",
                                             f"+reward.agentic.url={reward_server}",
                                             "+reward.agentic.scorer=faulty"), qwen25_tokenizer)
    info = gather_like_verl(run_all(faulty, make_batch(qwen25_tokenizer, bad)))
    assert info["reward_failed"].tolist() == [0, 1, 0, 0, 1]
    assert info["reward_error_type"].tolist() == ["", "scorer_error", "", "", "invalid_score"]


def test_swedev_unreachable_server_is_flagged(qwen25_tokenizer, samples):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = load_reward_manager(verl_config("reward.reward_manager.name=swedev",
                                              f"+reward.agentic.url=http://127.0.0.1:{port}",
                                              "+reward.agentic.max_retries=1", "+reward.agentic.retry_backoff_s=0.01"),
                                  qwen25_tokenizer)
    outputs = run_all(manager, make_batch(qwen25_tokenizer, samples[:2]))
    assert [o["reward_score"] for o in outputs] == [0.0, 0.0]
    assert [o["reward_extra_info"]["reward_error_type"] for o in outputs] == ["service_unavailable"] * 2


# --------------------------------------------------------------------------------------------
# a user's own task inside verl (issue 30): +agentic.imports, a task's own scorer, its episode reward


def test_agentic_imports_register_a_users_scorer_and_episodes_carry_their_task_and_reward(
        qwen25_tokenizer, tmp_path, monkeypatch):
    from va_user_tasks import write_user_tasks

    write_user_tasks(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = verl_config("reward.reward_manager.name=prime", "+reward.agentic.num_workers=1", "+agentic.imports=[my_tasks]")
    manager = load_reward_manager(cfg, qwen25_tokenizer)
    assert manager.settings.reward.scorer_modules == ["my_tasks"]  # prime's processes import it too
    samples = [Sample("Say something.", "10", [assistant("A short reply of some thirty characters.")]),
               Sample("Say something.", "20", [assistant("A much longer reply, longer than twenty characters.")]),
               Sample("Say something.", "20", [assistant("Tiny.")])]
    data = make_batch(qwen25_tokenizer, samples)
    # the task_agent loop's episode field: its task, the scorer the task names, its own reward
    data.non_tensor_batch["agentic"] = np.array([
        {"task_type": "length_task", "reward": 0.37, "scorer": None},
        {"task_type": "named_task", "reward": 0.5, "scorer": "my_len_scorer"},
        {"task_type": "named_task", "reward": 0.5, "scorer": "my_len_scorer"}], dtype=object)
    data.non_tensor_batch["data_source"] = np.array(["my/length_task", "my/named_task", "my/named_task"], dtype=object)
    item = manager.build_item(data[0:1])
    assert (item.task_type, item.scorer, item.episode_reward) == ("length_task", None, 0.37)
    outputs = run_all(manager, data)
    assert [o["reward_score"] for o in outputs] == [0.37, 1.0, 0.0]  # its reward; my_len_scorer (len > 20), twice
    assert [o["reward_extra_info"]["reward_failed"] for o in outputs] == [0, 0, 0]
    assert [o["reward_extra_info"]["task_reward"] for o in outputs] == [0.37, 0.5, 0.5]
    assert manager.stats()["scored_by_episode_reward"] == 1
