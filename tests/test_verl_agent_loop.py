"""The ``task_agent`` agent loop inside verl (verl_agentic/verl_plugin/agent_loop.py) and the GPU launch script.

Everything runs through verl's real pieces: the trainer config composed by hydra
(``ppo_trainer``), ``RLHFDataset`` + ``collate_fn`` on our preprocessed GSM8K parquet,
``AgentLoopWorker.generate_sequences`` (the agent loop built from verl's registry, padding,
masks, position ids), ``load_reward_manager`` with our ``agentic_naive`` adapter, and
``DataProto.to_tensordict`` (what the trainer calls before every log-prob pass). The LLM
server is our ``HFBackend`` behind ``BackendLLMClient``, generating real tokens with a tiny
random Qwen2 (the real Qwen2.5 tokenizer and template) or the embedded SmolLM2.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import types
import uuid

import numpy as np
import pytest
import torch

from va_testing import GSM8K_TEST, REPO

import verl  # noqa: F401  (loads the verl.plugins entry points, ours included)
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _agent_loop_registry

from verl_agentic.interfaces import ConfigError
from verl_agentic.rollout import check_drift
from verl_agentic.tasks.gsm8k import DEFAULT_RETRY_MESSAGE, DEFAULT_VERIFY_MESSAGE
from verl_agentic.verl_plugin.agent_loop import TaskAgentError, TaskAgentLoop, TaskAgentSettings, model_stop_token_ids
from verl_agentic.verl_plugin.backend import BackendLLMClient, from_verl_sampling, to_verl_sampling
from verl_agentic.verl_plugin.convert import (
    AGENTIC_FIELD,
    EPISODE_METRICS,
    RESPONSE_MASK_FIELD,
    to_agent_loop_output,
    trajectories_from_batch,
    truncate_trajectory,
)

VERL_CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
SCRIPT = REPO / "scripts" / "run_gsm8k_multiturn.sh"
AGENT_LOOP_YAML = REPO / "examples" / "gsm8k_multiturn" / "agent_loop.yaml"


# --------------------------------------------------------------------------------------------
# helpers


def verl_config(*overrides: str):
    """verl's real trainer config (``ppo_trainer.yaml`` composed by hydra) with command-line overrides."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def agent_config(model_dir, *extra: str, prompt_length: int = 256, response_length: int = 128):
    return verl_config(
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=vllm",
        f"data.max_prompt_length={prompt_length}", f"data.max_response_length={response_length}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.agent.default_agent_loop=task_agent",
        "reward.reward_manager.name=agentic_naive", *extra)


@functools.lru_cache(maxsize=None)
def tokenizer_of(model_dir) -> object:
    """One tokenizer per model for the backends (loading Qwen2.5's takes seconds; verl loads its own)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def make_worker(cfg, model_dir, reward_loop_worker_handles=None):
    from transformers import AutoModelForCausalLM

    from verl_agentic.backends.hf import HFBackend

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    backend = HFBackend(model, tokenizer_of(model_dir), seed=0)
    return AgentLoopWorker(cfg, llm_client=BackendLLMClient(backend, cfg.actor_rollout_ref.rollout.response_length),
                           reward_loop_worker_handles=reward_loop_worker_handles)


class InProcessActor:
    """Ray's calling convention (``handle.method.remote(...)``, awaited) for an object in this process:
    verl's AgentLoopWorker calls its reward-loop workers through Ray actor handles."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        return types.SimpleNamespace(remote=getattr(self._obj, name))


def dataset_batch(worker, cfg, parquet, rows: int, n: int, **columns) -> DataProto:
    """What the trainer hands the agent loop: RLHFDataset rows, collated, a uid each, repeated n times."""
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    ds = RLHFDataset(data_files=[str(parquet)], tokenizer=worker.tokenizer, config=cfg.data)
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(rows)]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(rows)], dtype=object)
    for key, values in columns.items():
        batch.non_tensor_batch[key] = np.array(values, dtype=object)
    return batch.repeat(n, interleave=True)


def generate(worker, batch: DataProto) -> DataProto:
    return asyncio.run(worker.generate_sequences(batch))


def registered_task_agent(worker) -> TaskAgentLoop:
    """One task_agent loop made from verl's registry as verl's agent-loop workers make it (one per sample)."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    return hydra.utils.instantiate(
        _agent_loop_registry["task_agent"], trainer_config=DictConfigWrap(worker.config),
        server_manager=worker.llm_client, tokenizer=worker.tokenizer, processor=worker.processor,
        hf_model_type=worker.hf_model_type, dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(worker.config.data), tools=ToolListWrap(worker.tools))


def unpadded(out: DataProto, i: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """prompt ids, response ids, response mask, rollout logprobs of sample i, padding removed."""
    width = out.batch["prompts"].shape[1]
    attention = out.batch["attention_mask"][i]
    n = int(attention[width:].sum())
    return (out.batch["prompts"][i][attention[:width].bool()].tolist(), out.batch["responses"][i, :n].tolist(),
            out.batch["response_mask"][i, :n].tolist(), out.batch["rollout_log_probs"][i, :n].tolist())


def check_batch_layout(out: DataProto, cfg, n_samples: int) -> None:
    """verl's padded layout: left-padded prompts, right-padded responses, masks and positions consistent."""
    P, R = cfg.actor_rollout_ref.rollout.prompt_length, cfg.actor_rollout_ref.rollout.response_length
    b = out.batch
    assert b["prompts"].shape == (n_samples, P) and b["responses"].shape == (n_samples, R)
    assert b["response_mask"].shape == (n_samples, R) and b["attention_mask"].shape == (n_samples, P + R)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    for i in range(n_samples):
        attention = b["attention_mask"][i]
        p = int(attention[:P].sum())
        r = int(attention[P:].sum())
        assert attention[:P].tolist() == [0] * (P - p) + [1] * p  # left padding
        assert attention[P:].tolist() == [1] * r + [0] * (R - r)  # right padding
        assert b["response_mask"][i, r:].sum() == 0
        assert b["position_ids"][i, P - p:P + r].tolist() == list(range(p + r))


def check_masks_against_turns(out: DataProto, i: int) -> dict:
    """response_mask is 1 exactly on the assistant turns' tokens (and 0 on injected ones)."""
    _, response, mask, logprobs = unpadded(out, i)
    agentic = out.non_tensor_batch[AGENTIC_FIELD][i]
    expected = [0] * len(response)
    for t in agentic["turns"]:
        if t["role"] == "assistant":
            expected[t["start"]:t["end"]] = [1] * (t["end"] - t["start"])
    assert agentic["turns"][-1]["end"] == len(response)
    assert mask == expected
    assert out.non_tensor_batch[RESPONSE_MASK_FIELD][i] == mask
    for m, lp in zip(mask, logprobs):  # verl pads logprobs with 0.0: injected tokens have none
        assert (lp == 0.0) if m == 0 else lp <= 0.0
    return agentic


def reference_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of each response token from one forward pass over the whole sequence."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    if temperature > 0:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1).tolist()


def reward_scores(cfg, tokenizer, out: DataProto) -> list[dict]:
    """Our agentic_naive adapter as verl loads it, scoring each sample (what RewardLoopWorker does)."""
    from verl.trainer.ppo.reward import load_reward_manager

    manager = load_reward_manager(cfg, tokenizer)

    async def go():
        return await asyncio.gather(*(manager.run_single(out[i:i + 1]) for i in range(len(out))))

    return asyncio.run(go())


@pytest.fixture(scope="module")
def gsm8k_parquet(tmp_path_factory):
    """The first GSM8K test problems through our preprocessor (what the launch script writes)."""
    import verl_agentic.tasks  # noqa: F401  (registers the gsm8k preprocessor)
    from verl_agentic.agentic_utils import preprocess

    path = tmp_path_factory.mktemp("gsm8k") / "test.parquet"
    assert preprocess("gsm8k", GSM8K_TEST, path, max_samples=8) == 8
    return path


@pytest.fixture(scope="module")
def tiny_run(tiny_qwen_dir, gsm8k_parquet):
    """3 prompts x 2 samples of multi-turn GSM8K (verify after every first answer) on the tiny model."""
    cfg = agent_config(tiny_qwen_dir, "+agentic.task.gsm8k.feedback=always_verify", "+agentic.max_turns=3",
                       "+agentic.max_new_tokens=16", response_length=128)
    worker = make_worker(cfg, tiny_qwen_dir)
    out = generate(worker, dataset_batch(worker, cfg, gsm8k_parquet, rows=3, n=2))
    return cfg, worker, out


# --------------------------------------------------------------------------------------------
# the batch verl gets


def test_registered_in_verl():
    assert _agent_loop_registry["task_agent"]["_target_"] == "verl_agentic.verl_plugin.agent_loop.TaskAgentLoop"


def test_tiny_model_batch_shapes_masks_turns_and_token_exactness(tiny_run):
    cfg, worker, out = tiny_run
    check_batch_layout(out, cfg, 6)
    stops = model_stop_token_ids(cfg.actor_rollout_ref.model, worker.tokenizer)
    assert stops == [worker.tokenizer.convert_tokens_to_ids("<|im_end|>")]  # Qwen2.5: generation config + tokenizer

    trajs = trajectories_from_batch(out)
    for i, traj in enumerate(trajs):
        agentic = check_masks_against_turns(out, i)
        # answer, "Are you sure?", answer, "Are you sure?", answer: verl counts 1 + 5 turns
        assert [t["role"] for t in agentic["turns"]] == ["assistant", "user"] * 2 + ["assistant"]
        assert out.non_tensor_batch["__num_turns__"][i] == 6
        assert agentic["finish_reason"] == "max_turns" and agentic["num_assistant_turns"] == 3
        assert agentic["metrics"]["feedback_turns"] == 2 and agentic["task_type"] == "gsm8k"
        assert len(out.non_tensor_batch["turn_scores"][i]) == 3
        for t in agentic["turns"]:
            if t["role"] == "assistant":  # every turn ended on <|im_end|> (kept, mask 1) or at 16 tokens
                ids = traj["response_ids"][t["start"]:t["end"]]
                assert (t["finish_reason"] == "stop" and ids[-1] in stops) or len(ids) == 16
            else:  # the feedback the task sent, as tokens the model did not generate
                text = worker.tokenizer.decode(traj["response_ids"][t["start"]:t["end"]])
                assert DEFAULT_VERIFY_MESSAGE in text
        # token exactness: the injected spans are exactly the template's rendering in context
        report = check_drift(traj, worker.tokenizer, stop_token_ids=stops)
        assert report.ok, report.as_dict()
        assert report.injected_tokens > 0 and report.generated_tokens == sum(traj["response_mask"])
    # the n samples of one prompt share its uid and differ in their tokens
    uids = out.non_tensor_batch["uid"]
    assert uids[0] == uids[1] != uids[2]
    assert trajs[0]["response_ids"] != trajs[1]["response_ids"]


def test_logprobs_match_a_forward_pass_of_the_model(tiny_run, tiny_qwen_dir):
    from transformers import AutoModelForCausalLM

    cfg, _, out = tiny_run
    model = AutoModelForCausalLM.from_pretrained(str(tiny_qwen_dir), dtype=torch.float32).eval()
    temperature = cfg.actor_rollout_ref.rollout.temperature
    for i in (0, 3):
        prompt, response, mask, logprobs = unpadded(out, i)
        ref = reference_logprobs(model, prompt, response, temperature)
        generated = [k for k, m in enumerate(mask) if m]
        assert generated
        assert np.allclose([logprobs[k] for k in generated], [ref[k] for k in generated], atol=2e-3)


def test_the_trainer_can_use_the_batch_and_our_reward_manager_scores_it(tiny_run):
    cfg, worker, out = tiny_run
    # the trainer's first step on a rollout batch (legacy trainer) converts it to a TensorDict: a
    # non-tensor column named like a tensor (e.g. 'response_mask') would fail here
    td = out.to_tensordict()
    assert torch.equal(td["response_mask"], out.batch["response_mask"])
    results = reward_scores(cfg, worker.tokenizer, out)
    trajs = trajectories_from_batch(out)
    for result, traj in zip(results, trajs):
        info = result["reward_extra_info"]
        assert set(info) >= {"acc", "reward_failed", "reward_error_type"}
        assert info["reward_failed"] == 0
        # the episode's own metrics ride along for verl's per-data-source validation metrics
        assert info["turns"] == traj["num_turns"] and info["task_reward"] == traj["reward"]
        assert info["final_correct"] == traj["metrics"].get("final_correct", 0.0)
        assert info["flips_wrong_to_right"] == traj["metrics"].get("flips_wrong_to_right", 0.0)
        # the manager scores the last answer with the task's own rule: the same score
        assert result["reward_score"] == traj["reward"]


def test_streaming_reward_path(tiny_qwen_dir, gsm8k_parquet):
    """verl's default: the agent-loop worker scores each episode as soon as it ends (a reward-loop
    worker's ``compute_score`` on the loop's own output: no mask tensor, the loop's extra fields as
    ``tool_extra_fields``), and the trainer gets ``rm_scores`` plus the reward's extra columns."""
    from verl.experimental.reward_loop import RewardLoopWorker

    cfg = agent_config(tiny_qwen_dir, "+agentic.task.gsm8k.feedback=always_verify", "+agentic.max_turns=2",
                       "+agentic.max_new_tokens=8", "+reward.agentic.extra_keys=[pred]")
    reward_worker = RewardLoopWorker(cfg)
    worker = make_worker(cfg, tiny_qwen_dir, reward_loop_worker_handles=[InProcessActor(reward_worker)])
    out = generate(worker, dataset_batch(worker, cfg, gsm8k_parquet, rows=2, n=1))
    check_batch_layout(out, cfg, 2)
    assert out.meta_info["reward_extra_keys"] == ["acc", "reward_failed", "reward_error_type", *EPISODE_METRICS, "pred"]
    width = out.batch["prompts"].shape[1]
    last = out.batch["attention_mask"][:, width:].sum(dim=1) - 1
    trajs = trajectories_from_batch(out)
    for i, traj in enumerate(trajs):
        assert [t["role"] for t in traj["turns"]] == ["assistant", "user", "assistant"]
        assert out.batch["rm_scores"][i].sum() == out.batch["rm_scores"][i, last[i]] == traj["reward"]
        assert out.non_tensor_batch["reward_failed"][i] == 0
    out.to_tensordict()  # the batch is usable by the trainer on this path too


def test_monitors_inside_verls_trainer_read_the_steps_episodes(tiny_qwen_dir, gsm8k_parquet):
    """verl_plugin/monitors.py wraps verl's ``PPOTrainer._compute_metrics`` (the signature it calls
    stays verl's) and feeds each step to the monitors: here the episodes our loop and our reward
    manager really produced (verl's streaming reward path), as the v1 trainer stores them per sample
    (``extra_fields``: our ``agentic`` record and ``reward_extra_info``; the reward: ``rm_scores``).
    ``batch/*`` and ``monitor/*`` join verl's metrics; the stop rule saves and ends training; a trainer
    config without an ``agentic`` section is left alone."""
    import inspect

    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verl_agentic.monitors import batch_summary
    from verl_agentic.verl_plugin.monitors import fields_from_tensordict, observe_safely, observe_step

    hook = PPOTrainer._compute_metrics
    assert getattr(hook, "__verl_agentic_monitors__", False)
    assert list(inspect.signature(hook.__wrapped__).parameters) == ["self", "batch", "metrics", "timing_raw",
                                                                    "global_steps", "epoch"]
    cfg = agent_config(tiny_qwen_dir, "+agentic.task.gsm8k.feedback=retry", "+agentic.max_turns=2",
                       "+agentic.max_new_tokens=8", "+agentic.monitors.thresholds.answer_collapse=0.0",
                       "+agentic.monitors.stop_on=[answer_collapse]")
    worker = make_worker(cfg, tiny_qwen_dir, reward_loop_worker_handles=[InProcessActor(RewardLoopWorker(cfg))])
    out = generate(worker, dataset_batch(worker, cfg, gsm8k_parquet, rows=4, n=2))
    keys = out.meta_info["reward_extra_keys"]
    fields = [{AGENTIC_FIELD: out.non_tensor_batch[AGENTIC_FIELD][i],
               "reward_extra_info": {k: out.non_tensor_batch[k][i] for k in keys}} for i in range(len(out))]
    scores = out.batch["rm_scores"].sum(dim=1).tolist()
    saved = []
    trainer = types.SimpleNamespace(config=cfg, total_training_steps=5, _save_checkpoint=lambda: saved.append(1))
    metrics = {"actor/entropy": 0.5}
    observe_step(trainer, object(), metrics, 3, fetch=lambda _batch: (fields, scores))
    assert metrics["batch/episodes"] == 8 and metrics["batch/prompts"] == 4
    episodes = [dict(f[AGENTIC_FIELD], reward_extra_info=f["reward_extra_info"]) for f in fields]
    expect = batch_summary(episodes, scores)
    assert metrics["batch/answer_top_share"] == expect["batch/answer_top_share"]
    assert metrics["monitor/answer_collapse"] == max(expect["batch/answer_top_share"],
                                                     expect["batch/first_answer_top_share"])
    assert metrics["batch/accuracy"] == pytest.approx(np.mean([f["reward_extra_info"]["acc"] for f in fields]))
    assert "monitor/entropy_collapse" not in metrics  # no baseline yet after one step
    assert saved == [1] and trainer.total_training_steps == 3  # the stop rule: a checkpoint, and the last step
    alone = {}
    observe_step(types.SimpleNamespace(config=verl_config()), object(), alone, 1, fetch=lambda _b: (fields, scores))
    assert alone == {}
    # what TransferQueue returns for the step (the stored fields; rm_scores jagged, one row per sample)
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    width = out.batch["prompts"].shape[1]
    lengths = out.batch["attention_mask"][:, width:].sum(dim=1).tolist()
    td = list_of_dict_to_tensordict([{"extra_fields": f, "rm_scores": out.batch["rm_scores"][i, :lengths[i]]}
                                     for i, f in enumerate(fields)])
    got_fields, got_scores = fields_from_tensordict(td, [{"is_padding": i == 7} for i in range(8)])
    assert got_scores == pytest.approx(scores[:7]) and [f[AGENTIC_FIELD]["uid"] for f in got_fields] == [
        f[AGENTIC_FIELD]["uid"] for f in fields[:7]]
    # a failure of the monitors is reported once and turns them off; the step's metrics are verl's alone
    def broken_fetch(_batch):  # a fault of our own code, which no real input causes
        raise RuntimeError("broken on purpose")

    trainer = types.SimpleNamespace(config=cfg, total_training_steps=5, _save_checkpoint=lambda: saved.append(1))
    for step in (1, 2):
        step_metrics = {"actor/entropy": 0.5}
        observe_safely(trainer, object(), step_metrics, step, fetch=broken_fetch)
        assert step_metrics == {"actor/entropy": 0.5}
    assert trainer.total_training_steps == 5 and saved == [1]


def test_v1_trainer_storage_format(tiny_qwen_dir, gsm8k_parquet):
    """verl's default (v1) trainer stores each AgentLoopOutput's ``as_dict()`` plus the sample's
    columns in TransferQueue (AgentLoopWorkerTQ); run the loop as its worker does (one instance
    from the registry, ``session_id`` = which of the n samples) and stack the outputs that way."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    cfg = agent_config(tiny_qwen_dir, "+agentic.max_turns=2", "+agentic.max_new_tokens=8", response_length=64)
    worker = make_worker(cfg, tiny_qwen_dir)
    batch = dataset_batch(worker, cfg, gsm8k_parquet, rows=2, n=1)
    rows = [{k: v[i] for k, v in batch.non_tensor_batch.items()} for i in range(len(batch))]

    async def run_all():
        outputs = []
        for row in rows:
            for session_id in range(2):
                loop = registered_task_agent(worker)
                assert isinstance(loop, TaskAgentLoop)
                params = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=False)
                out = await loop.run(params, session_id=session_id, global_steps=1, **row)
                outputs.append((out, dict(row, session_id=session_id, global_steps=1)))
        return outputs

    outputs = asyncio.run(run_all())
    fields = []
    for out, kwargs in outputs:
        assert out.response_logprobs is None  # calculate_log_probs=false: none asked, none returned
        assert len(out.response_ids) == len(out.response_mask) <= 64
        field = out.as_dict()
        field.update(kwargs)
        field["loss_mask"] = field["response_mask"]
        fields.append(field)
    td = list_of_dict_to_tensordict(fields)
    assert len(td) == 4 and "rollout_log_probs" not in td.keys()
    assert [f["extra_fields"][AGENTIC_FIELD]["sample_id"] for f in fields] == [0, 1, 0, 1]


# --------------------------------------------------------------------------------------------
# real text: SmolLM2 answers, gets "Are you sure?", answers again


def test_smollm2_multiturn_feedback_through_verl(smol_dir, gsm8k_parquet):
    cfg = agent_config(smol_dir, "+agentic.task.gsm8k.feedback=verify", "+agentic.max_turns=2",
                       "+agentic.max_new_tokens=64", response_length=256)
    worker = make_worker(cfg, smol_dir)
    batch = dataset_batch(worker, cfg, gsm8k_parquet, rows=3, n=1)
    batch.meta_info["validate"] = True  # verl's validation: greedy (val_kwargs)
    out = generate(worker, batch)
    check_batch_layout(out, cfg, 3)
    stops = model_stop_token_ids(cfg.actor_rollout_ref.model, worker.tokenizer)
    trajs = trajectories_from_batch(out)
    feedback_episodes = 0
    for i, traj in enumerate(trajs):
        agentic = check_masks_against_turns(out, i)
        roles = [t["role"] for t in agentic["turns"]]
        assert out.non_tensor_batch["__num_turns__"][i] == len(roles) + 1
        if "user" in roles:  # a wrong first answer got the verify question and a second turn
            feedback_episodes += 1
            assert roles == ["assistant", "user", "assistant"]
            assert agentic["metrics"]["feedback_turns"] == 1
            u = agentic["turns"][1]
            assert DEFAULT_VERIFY_MESSAGE in worker.tokenizer.decode(traj["response_ids"][u["start"]:u["end"]])
        report = check_drift(traj, worker.tokenizer, stop_token_ids=stops)
        assert report.ok, report.as_dict()
    assert feedback_episodes >= 2  # a 135M model gets most GSM8K problems wrong
    results = reward_scores(cfg, worker.tokenizer, out)
    assert [r["reward_score"] for r in results] == [t["reward"] for t in trajs]


def test_invalid_tool_call_policy_through_verl(smol_dir, tmp_path):
    """``+agentic.max_consecutive_invalid_tool_calls`` (the rollout's default; tests/test_invalid_tool_calls.py
    has main_rollout and main_ppo): SmolLM2, asked for Python code with only the calculator tool and the
    python_code parser, calls the unknown tool ``python`` twice (examples/invalid_tool_calls); the episode
    ends with its own finish reason and error type, is kept for training (not raised), and the reward
    carries the count per sample."""
    import verl_agentic.tasks  # noqa: F401  (registers the preprocessors)
    from verl_agentic.agentic_utils import preprocess

    assert preprocess("tool_agent", REPO / "examples" / "invalid_tool_calls" / "questions.jsonl",
                      tmp_path / "q.parquet") == 2
    cfg = agent_config(smol_dir, "+agentic.task_type=tool_agent", "+agentic.task.tool_agent.tools=[calculator]",
                       "+agentic.task.tool_agent.parser=python_code", "+agentic.max_turns=4",
                       "+agentic.max_new_tokens=96", "+agentic.max_consecutive_invalid_tool_calls=2",
                       prompt_length=512, response_length=512)
    worker = make_worker(cfg, smol_dir)
    batch = dataset_batch(worker, cfg, tmp_path / "q.parquet", rows=2, n=1)
    batch.meta_info["validate"] = True  # greedy (val_kwargs)
    out = generate(worker, batch)
    stops = model_stop_token_ids(cfg.actor_rollout_ref.model, worker.tokenizer)
    for i, traj in enumerate(trajectories_from_batch(out)):
        assert out.non_tensor_batch[AGENTIC_FIELD][i]["turns"], out.non_tensor_batch[AGENTIC_FIELD][i]["error"]
        agentic = check_masks_against_turns(out, i)
        assert agentic["finish_reason"] == "invalid_tool_calls" and agentic["error"]["type"] == "invalid_tool_calls"
        assert agentic["num_assistant_turns"] == 2 and agentic["metrics"]["invalid_tool_calls"] == 2
        assert agentic["turns"][-1]["info"]["tool_calls"] == [{"name": "python", "status": "error"}]
        assert check_drift(traj, worker.tokenizer, stop_token_ids=stops).ok
    for result in reward_scores(cfg, worker.tokenizer, out):
        info = result["reward_extra_info"]
        assert info["invalid_tool_call_stop"] == 1.0 and info["invalid_tool_calls"] == 2.0 and info["episode_error"] == 1.0


def test_task_agent_reads_verls_tool_keys(tiny_qwen_dir, tmp_path):
    """verl's own keys, ``rollout.multi_turn.tool_config_path`` and ``function_tool_path`` (read by verl's
    AgentLoopWorker too): the task_agent loop gives them to the task, which runs verl's tools per episode
    with the row's create_kwargs (tests/va_verl_tools.py; main_rollout's path: tests/test_verl_tools.py)."""
    import pandas as pd

    from va_testing import ScriptedPolicy
    from va_verl_tools import SCRIPT, check_episode, tool_events, verl_rows, verl_tool_files

    events = tool_events()
    verl_rows(tmp_path / "rows.jsonl")
    pd.read_json(tmp_path / "rows.jsonl", lines=True).to_parquet(tmp_path / "rows.parquet")
    cfg = agent_config(tiny_qwen_dir, "+agentic.task_type=tool_agent", "+agentic.max_turns=4",
                       "+agentic.max_new_tokens=96",
                       f"actor_rollout_ref.rollout.multi_turn.tool_config_path={verl_tool_files() / 'tools.yaml'}",
                       f"actor_rollout_ref.rollout.multi_turn.function_tool_path={verl_tool_files() / 'functions.py'}",
                       prompt_length=512, response_length=512)
    tokenizer = tokenizer_of(tiny_qwen_dir)
    worker = AgentLoopWorker(cfg, llm_client=BackendLLMClient(ScriptedPolicy(tokenizer, SCRIPT), 512))
    out = generate(worker, dataset_batch(worker, cfg, tmp_path / "rows.parquet", rows=2, n=1))
    for i, traj in enumerate(trajectories_from_batch(out)):
        agentic = out.non_tensor_batch[AGENTIC_FIELD][i]
        assert agentic["error"] is None and agentic["num_assistant_turns"] == 4, agentic["error"]
        check_episode({**traj, "metrics": agentic["metrics"], "index": int(agentic["extra_info"]["index"])},
                      tokenizer, events)
        assert list(out.non_tensor_batch["tool_rewards"][i]) == [0.25, 1.0, 0.0, 0.0]  # per call, as verl's loop


def test_task_agent_runs_mcp_servers_tools_inside_verl(tiny_qwen_dir, tmp_path):
    """MCP servers' tools (tests/va_mcp_server.py, over stdio and streamable HTTP) in verl's AgentLoopWorker:
    ``+agentic.task.tool_agent.tools`` names a tools YAML with both servers; scripted calls reach them."""
    import json

    import pandas as pd

    from test_mcp_tools import CALL, free_port, start_http_server, stdio_entry
    from va_testing import ScriptedPolicy
    from verl_agentic.tools.mcp_tools import close_sessions

    port, http_events, stdio_events = free_port(), tmp_path / "http.jsonl", tmp_path / "stdio.jsonl"
    server = start_http_server(port, http_events)
    try:
        (tmp_path / "tools.yaml").write_text(json.dumps({"tools": [
            stdio_entry(stdio_events), {"mcp": {"url": f"http://127.0.0.1:{port}/mcp", "tools": ["http_add"]}}]}))
        pd.DataFrame([{"data_source": "va/mcp", "prompt": [{"role": "user", "content": f"Question {i}"}],
                       "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"index": i}}
                      for i in range(2)]).to_parquet(tmp_path / "rows.parquet")
        cfg = agent_config(tiny_qwen_dir, "+agentic.task_type=tool_agent", "+agentic.max_turns=2",
                           "+agentic.max_new_tokens=96", f"+agentic.task.tool_agent.tools={tmp_path / 'tools.yaml'}",
                           prompt_length=1024, response_length=256)
        tokenizer = tokenizer_of(tiny_qwen_dir)
        script = [CALL.format(name="stdio_lookup", args='{"key": "verl"}') + "\n"
                  + CALL.format(name="http_add", args='{"a": 2, "b": 3}'), "The answer is 5."]
        worker = AgentLoopWorker(cfg, llm_client=BackendLLMClient(ScriptedPolicy(tokenizer, script), 256))
        out = generate(worker, dataset_batch(worker, cfg, tmp_path / "rows.parquet", rows=2, n=1))
        for i, traj in enumerate(trajectories_from_batch(out)):
            agentic = out.non_tensor_batch[AGENTIC_FIELD][i]
            assert agentic["error"] is None and agentic["num_assistant_turns"] == 2, agentic["error"]
            assert [m["content"] for m in traj["messages"] if m["role"] == "tool"] == ["stdio:verl=4", "5"]
            assert (agentic["metrics"]["tool_calls"], agentic["metrics"]["tool_ok"]) == (2, 2)
            assert '"name": "http_add"' in tokenizer.decode(traj["prompt_ids"])
        assert [e[1:] for e in map(json.loads, stdio_events.read_text().splitlines())].count(
            ["call", "lookup", "verl"]) == 2
        assert [e[1:] for e in map(json.loads, http_events.read_text().splitlines())].count(["call", "add", [2, 3]]) == 2
    finally:
        close_sessions()
        server.kill()
        server.wait()


# --------------------------------------------------------------------------------------------
# budgets, errors and settings


def test_response_budget_is_exact_and_long_prompts_fail_their_episode(tiny_qwen_dir, gsm8k_parquet):
    # verify after every answer; 24 tokens per turn: the second turn runs into response_length=64
    cfg = agent_config(tiny_qwen_dir, "+agentic.task.gsm8k.feedback=always_verify", "+agentic.max_turns=3",
                       "+agentic.max_new_tokens=24", response_length=64)
    worker = make_worker(cfg, tiny_qwen_dir)
    out = generate(worker, dataset_batch(worker, cfg, gsm8k_parquet, rows=2, n=2))
    check_batch_layout(out, cfg, 4)
    cut = 0
    for i, agentic in enumerate(out.non_tensor_batch[AGENTIC_FIELD]):
        check_masks_against_turns(out, i)
        assert agentic["truncated_tokens"] == 0  # the loop's budget kept it in: nothing cut afterwards
        if agentic["finish_reason"] == "length":
            assert agentic["error"]["type"] == "context_overflow"
            cut += int(out.batch["attention_mask"][i, 256:].sum()) == 64
    assert cut >= 1  # at least one episode used the whole response_length, exactly

    # prompts longer than rollout.prompt_length: the episode ends on its prompt (context_overflow),
    # the prompt is left-truncated as verl does, the response is empty
    cfg = agent_config(tiny_qwen_dir, prompt_length=48, response_length=32)
    worker = make_worker(cfg, tiny_qwen_dir)
    out = generate(worker, dataset_batch(worker, cfg, gsm8k_parquet, rows=1, n=1))
    agentic = out.non_tensor_batch[AGENTIC_FIELD][0]
    assert agentic["error"]["type"] == "context_overflow"
    assert "actor_rollout_ref.rollout.prompt_length=48" in agentic["error"]["message"]
    assert int(out.batch["attention_mask"][0, :48].sum()) == 48 and int(out.batch["attention_mask"][0, 48:].sum()) == 0


@pytest.mark.parametrize("max_user_turns, most_turns", [(0, 1), (1, 2)])
def test_verls_max_user_turns_is_honoured(tiny_qwen_dir, gsm8k_parquet, max_user_turns, most_turns):
    """verl's rollout.multi_turn.max_user_turns bounds the feedback turns: with feedback after every
    answer and 3 assistant turns allowed, 0 user turns means one answer, 1 means two."""
    cfg = agent_config(tiny_qwen_dir, "+agentic.task.gsm8k.feedback=always_verify", "+agentic.max_turns=3",
                       "+agentic.max_new_tokens=8", f"actor_rollout_ref.rollout.multi_turn.max_user_turns={max_user_turns}",
                       response_length=128)
    worker = make_worker(cfg, tiny_qwen_dir)
    trajs = trajectories_from_batch(generate(worker, dataset_batch(worker, cfg, gsm8k_parquet, rows=2, n=2)))
    assert [t["num_turns"] for t in trajs] == [most_turns] * 4
    assert all(sum(m["role"] == "user" for m in t["messages"]) == 1 + max_user_turns for t in trajs)


def test_truncation_guard_cuts_ids_masks_logprobs_and_turns_together(tiny_run):
    cfg, worker, out = tiny_run
    traj = trajectories_from_batch(out)[0]
    second_user = [t for t in traj["turns"] if t["role"] == "user"][1]
    limit = second_user["start"] + 3  # inside the second feedback turn
    cut = truncate_trajectory(traj, limit)
    assert len(cut["response_ids"]) == len(cut["response_mask"]) == len(cut["response_logprobs"]) == limit
    assert cut["response_ids"] == traj["response_ids"][:limit]
    assert [t["role"] for t in cut["turns"]] == ["assistant", "user", "assistant", "user"]
    assert cut["turns"][-1]["end"] == limit and cut["num_turns"] == 2
    assert len(cut["messages"]) == len(traj["messages"]) - 1  # the last answer is gone
    assert cut["finish_reason"] == "length" and cut["error"]["type"] == "context_overflow"
    assert cut["truncated_tokens"] == len(traj["response_ids"]) - limit
    report = check_drift(cut, worker.tokenizer)
    assert not report.structure  # still a consistent trajectory; only the cut span differs
    assert [m.span for m in report.injected] == ["turn 3"]

    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics

    output = to_agent_loop_output(traj, prompt_length=256, response_length=limit, logprobs_expected=True,
                                  metrics=AgentLoopMetrics())
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs) == limit
    assert output.num_turns == 5 and output.extra_fields[AGENTIC_FIELD]["truncated_tokens"] > 0
    traj["response_logprobs"][0] = None  # a generated token without a logprob, while they were asked for
    with pytest.raises(ValueError, match="generated token 0 has no logprob"):
        to_agent_loop_output(traj, prompt_length=256, response_length=256, logprobs_expected=True,
                             metrics=AgentLoopMetrics())


ERROR_AGENTS_YAML = """
- name: with_default
  _target_: verl_agentic.verl_plugin.agent_loop.TaskAgentLoop
  agentic: {task_type: gsm8k, max_turns: 1}
- name: bad_section
  _target_: verl_agentic.verl_plugin.agent_loop.TaskAgentLoop
  agentic: {task: {gsm8k: {feedback: sometimes}}}
- name: keep_errors
  _target_: verl_agentic.verl_plugin.agent_loop.TaskAgentLoop
  agentic: {raise_on_errors: []}
"""


def test_bad_rows_bad_sections_and_server_failures_are_clear_errors(tiny_qwen_dir, gsm8k_parquet, tmp_path):
    (tmp_path / "agents.yaml").write_text(ERROR_AGENTS_YAML)
    cfg = agent_config(tiny_qwen_dir, f"actor_rollout_ref.rollout.agent.agent_loop_config_path={tmp_path}/agents.yaml",
                       "+agentic.max_new_tokens=4")
    worker = make_worker(cfg, tiny_qwen_dir)

    def run(agent_name: str, task_type):
        return generate(worker, dataset_batch(worker, cfg, gsm8k_parquet, rows=1, n=1, agent_name=[agent_name],
                                              task_type=[task_type]))

    with pytest.raises(ConfigError, match=r"uid=.*unknown task_type 'no_such_task'; registered: .*gsm8k.*tool_agent"):
        run("task_agent", "no_such_task")
    with pytest.raises(ConfigError, match=r"has no 'task_type' and agentic.task_type is not set.*registered tasks: "):
        run("task_agent", None)
    # a row without task_type takes agentic.task_type
    assert run("with_default", None).non_tensor_batch[AGENTIC_FIELD][0]["task_type"] == "gsm8k"
    # a bad task section fails on the first sample, naming the section
    with pytest.raises(ConfigError, match=r"agentic.task.gsm8k: task.gsm8k.feedback must be one of"):
        run("bad_section", "gsm8k")

    # a closed backend refuses every request: a real generation failure, which fails the sample...
    asyncio.run(worker.llm_client.backend.close())
    with pytest.raises(TaskAgentError, match=r"generation_error: gen: RuntimeError: HFBackend is closed"):
        run("task_agent", "gsm8k")
    # ... unless raise_on_errors leaves it out: then the sample is kept, typed, with an empty response
    out = run("keep_errors", "gsm8k")
    agentic = out.non_tensor_batch[AGENTIC_FIELD][0]
    assert agentic["error"]["type"] == "generation_error" and int(out.batch["attention_mask"][0, 256:].sum()) == 0


def test_bad_settings_are_clear_errors():
    with pytest.raises(ConfigError, match=r"^agentic: unknown keys \['max_turn'\]; known: .*max_turns"):
        TaskAgentSettings.from_sources({"max_turn": 3})
    with pytest.raises(ConfigError, match="agentic.max_turns must be an integer >= 1"):
        TaskAgentSettings.from_sources({"max_turns": 0})
    with pytest.raises(ConfigError, match=r"raise_on_errors: unknown error types \['oops'\]"):
        TaskAgentSettings.from_sources({"raise_on_errors": ["oops"]})
    with pytest.raises(ConfigError, match=r"agentic \(agent-loop YAML entry\): unknown keys \['turns'\]"):
        TaskAgentSettings.from_sources({}, {"turns": 2})
    merged = TaskAgentSettings.from_sources({"task": {"gsm8k": {"feedback": "verify", "extraction": "strict"}}},
                                            {"task": {"gsm8k": {"feedback": "retry"}}})
    assert merged.task == {"gsm8k": {"feedback": "retry", "extraction": "strict"}}  # deep merge, the YAML wins


def test_agent_loop_yaml_entries_carry_their_settings(tiny_qwen_dir, gsm8k_parquet):
    cfg = agent_config(tiny_qwen_dir, f"actor_rollout_ref.rollout.agent.agent_loop_config_path={AGENT_LOOP_YAML}",
                       "+agentic.max_new_tokens=8", "+agentic.task.gsm8k.feedback=verify",
                       "actor_rollout_ref.rollout.calculate_log_probs=false")
    worker = make_worker(cfg, tiny_qwen_dir)
    batch = dataset_batch(worker, cfg, gsm8k_parquet, rows=2, n=1, agent_name=["gsm8k_retry", "gsm8k_single_turn"])
    out = generate(worker, batch)
    retry, single = out.non_tensor_batch[AGENTIC_FIELD]
    assert [t["role"] for t in retry["turns"]] == ["assistant", "user", "assistant", "user", "assistant"]
    assert DEFAULT_RETRY_MESSAGE in retry["messages"][2]["content"]  # the entry's feedback beat the command line's
    assert [t["role"] for t in single["turns"]] == ["assistant"] and single["finish_reason"] == "stop"
    assert "rollout_log_probs" not in out.batch.keys()  # calculate_log_probs=false: verl gets none


def test_sampling_params_cross_the_boundary_both_ways():
    from verl_agentic.interfaces import SamplingParams

    verl_params = dict(temperature=0.7, top_p=0.9, top_k=20, repetition_penalty=1.0, logprobs=True)
    ours = SamplingParams(max_new_tokens=33, temperature=0.7, top_p=0.9, top_k=20, seed=5, stop_token_ids=[7])
    params = to_verl_sampling(ours, verl_params, stop_token_ids=[2, 7])
    assert params == dict(temperature=0.7, top_p=0.9, top_k=20, repetition_penalty=1.0, logprobs=True,
                          max_tokens=33, stop_token_ids=[2, 7], seed=5)
    back, want_logprobs = from_verl_sampling(params, default_max_tokens=99)
    assert want_logprobs and back == SamplingParams(max_new_tokens=33, temperature=0.7, top_p=0.9, top_k=20, seed=5,
                                                    stop_token_ids=[2, 7])
    assert from_verl_sampling({"temperature": 0}, 99)[0].max_new_tokens == 99
    with pytest.raises(ValueError, match=r"\['min_p'\] are not supported"):
        from_verl_sampling({"min_p": 0.1}, 99)
    with pytest.raises(ValueError, match="repetition_penalty=1.1 is not supported"):
        from_verl_sampling({"repetition_penalty": 1.1}, 99)


# --------------------------------------------------------------------------------------------
# the GPU launch script


def script_overrides() -> list[str]:
    out = subprocess.run(["bash", str(SCRIPT), "--print-overrides"], capture_output=True, text=True, check=True,
                         env={**os.environ, "MODEL_PATH": "Qwen/Qwen2.5-1.5B-Instruct"})
    return [line for line in out.stdout.splitlines() if line]


def test_launch_script_overrides_fit_verls_config():
    """Every override of scripts/run_gsm8k_multiturn.sh applies to verl 0.9.1's ppo_trainer config
    (hydra refuses an unknown or renamed key), passes verl's own validation as main_ppo runs it,
    and gives the settings our loop and reward manager expect."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    from verl_agentic.verl_plugin.reward import settings_from_verl_config

    overrides = script_overrides()
    assert len(overrides) >= 40
    cfg = verl_config(*overrides)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert isinstance(rollout, RolloutConfig) and rollout.name == "vllm" and rollout.calculate_log_probs
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "task_agent"
    assert cfg.actor_rollout_ref.rollout.prompt_length == 512 and cfg.actor_rollout_ref.rollout.response_length == 1024
    settings = TaskAgentSettings.from_sources(cfg.agentic)
    assert settings.task_type == "gsm8k"
    assert settings.task == {"gsm8k": {"feedback": "verify", "extraction": "flexible"}}
    assert cfg.reward.reward_manager.name == "agentic_naive"
    assert settings_from_verl_config(cfg, "naive").reward.scorer_kwargs == {"gsm8k": {"method": "flexible"}}
    OmegaConf.resolve(cfg)  # every interpolation resolves

    # a renamed key fails the compose, with hydra naming it
    with pytest.raises(Exception, match="max_assistant_turn"):
        verl_config(*overrides, "actor_rollout_ref.rollout.multi_turn.max_assistant_turn=3")


def _sees_feedback(solution_str, ground_truth, extra_info=None):
    return {"score": 0.0, "sees_feedback": float("Are you sure?" in solution_str)}


def test_streaming_reward_scores_only_the_last_answer(tiny_qwen_dir, gsm8k_parquet):
    """verl's streaming reward path: the adapter reads agentic_response_mask, so feedback text is not scored."""
    from verl.experimental.reward_loop import RewardLoopWorker

    from verl_agentic.reward import register_scorer
    from verl_agentic.reward.scorers import SCORERS

    if "va_sees_feedback" not in SCORERS:
        register_scorer("va_sees_feedback", _sees_feedback)
    cfg = agent_config(tiny_qwen_dir, "+agentic.task.gsm8k.feedback=always_verify", "+agentic.max_turns=2",
                       "+agentic.max_new_tokens=8", "+reward.agentic.scorer=va_sees_feedback",
                       "+reward.agentic.extra_keys=[sees_feedback]")
    worker = make_worker(cfg, tiny_qwen_dir, reward_loop_worker_handles=[InProcessActor(RewardLoopWorker(cfg))])
    out = generate(worker, dataset_batch(worker, cfg, gsm8k_parquet, rows=2, n=1))
    assert out.non_tensor_batch["sees_feedback"].tolist() == [0.0, 0.0]  # the feedback turn is not scored


def test_preprocess_cli(tmp_path):
    """``python -m verl_agentic.agentic_utils`` (the launch script's data step) finds the built-in tasks."""
    import sys

    out = tmp_path / "gsm8k.parquet"
    r = subprocess.run([sys.executable, "-m", "verl_agentic.agentic_utils", "gsm8k", "data/gsm8k/test.jsonl", str(out),
                        "--max-samples", "3"], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr[-2000:]
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 3 and rows[0]["task_type"] == "gsm8k" and rows[0]["reward_model"]["ground_truth"]


def test_an_agent_task_runs_in_verls_agent_loop_and_a_second_row_is_named(qwen25_tokenizer, tiny_qwen_dir, tmp_path):
    """Issue 39: an agent written with the openai SDK as a task in verl's AgentLoopWorker (the gateway in the
    worker's event loop, verl's server manager behind it): a tool call and an answer, one token-exact sample.
    An agent whose second call changes its history makes a second row, which verl's trainer takes only with
    GRPO (the next test) and turn_loo (tests/test_turn_advantage.py): under verl's default estimator (gae) the sample keeps its last row and says why
    (agentic.raise_on_errors decides whether it fails)."""
    import json

    import pandas as pd

    from va_agents import CALCULATOR, PROBLEMS, ScriptedCalculatorPolicy
    from verl_agentic.tasks import register_task
    from verl_agentic.tasks.agent import agent_task
    from verl_agentic.tools.calculator import evaluate_expression, format_number

    async def verl_calculator_agent(row, client):
        messages = list(row["prompt"])
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        call = reply.choices[0].message.tool_calls[0]
        value = format_number(evaluate_expression(json.loads(call.function.arguments)["expression"]))
        if row["extra_info"].get("summarise"):  # a fresh conversation: a second row
            messages = [{"role": "user", "content": "In short: " + messages[-1]["content"]}]
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": value})
        answer = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        return float(answer.choices[0].message.content.split("####")[-1].strip() == value)

    register_task("va_verl_calculator_agent", agent_task(verl_calculator_agent), replace=True)
    pd.DataFrame([{"data_source": "calc", "task_type": "va_verl_calculator_agent", "ability": "math",
                   "prompt": [{"role": "user", "content": q}], "reward_model": {"style": "rule", "ground_truth": a},
                   "extra_info": {"index": i, "summarise": i == 1}}
                  for i, (q, (_, a)) in enumerate(PROBLEMS.items())]).to_parquet(tmp_path / "rows.parquet")
    cfg = agent_config(tiny_qwen_dir, "+agentic.max_turns=4", "+agentic.max_new_tokens=64",
                       prompt_length=512, response_length=256)
    policy = ScriptedCalculatorPolicy(qwen25_tokenizer)
    worker = AgentLoopWorker(cfg, llm_client=BackendLLMClient(policy, 256))
    out = generate(worker, dataset_batch(worker, cfg, tmp_path / "rows.parquet", rows=2, n=1))
    whole, split = (out.non_tensor_batch[AGENTIC_FIELD][i] for i in range(2))
    assert whole["error"] is None and whole["metrics"]["agent_calls"] == 2 and whole["reward"] == 1.0
    traj = trajectories_from_batch(out)[0]
    assert check_drift(traj, qwen25_tokenizer, stop_token_ids=[policy.end_id]).ok
    assert split["error"]["type"] == "task_error"
    assert ("joins the rows of an episode for algorithm.adv_estimator=grpo and turn_loo only (with gae"
            in split["error"]["message"])
    assert split["metrics"]["agent_rows"] == 2


def test_an_episode_of_two_rows_in_verls_v1_trainer_is_two_samples_with_one_grpo_advantage(
        qwen25_tokenizer, tiny_qwen_dir, tmp_path):
    """Issue 39: with verl's v1 trainer (its default) and GRPO, an agent episode of two rows is two outputs,
    stored as verl's AgentLoopWorkerTQ stores them ({uid}_{session}_{row}), scored once by our reward manager
    through verl's own ``_compute_score``, and verl's ``compute_advantage_for_multi_trajectories`` gives both
    rows their episode's advantage: a GRPO group counts episodes (2 sessions), not rows (3). Each row is
    token-exact on its own."""
    import json

    import pandas as pd
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from va_agents import CALCULATOR, PROBLEMS, ScriptedCalculatorPolicy
    from verl_agentic.tasks import register_task
    from verl_agentic.tasks.agent import agent_task
    from verl_agentic.tools.calculator import evaluate_expression, format_number

    async def rows_agent(row, client):
        """Session 0 is rewarded and session 1 is not (a scripted policy answers both alike), so that
        GRPO has a difference to see; index 1's second call starts a fresh conversation: a second row."""
        messages = list(row["prompt"])
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        call = reply.choices[0].message.tool_calls[0]
        value = format_number(evaluate_expression(json.loads(call.function.arguments)["expression"]))
        if row["extra_info"]["index"] == 1:
            messages = [{"role": "user", "content": "In short: " + messages[-1]["content"]}]
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": value})
        await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        return 1.0 if int(row["session_id"]) == 0 else 0.0

    register_task("va_verl_rows_agent", agent_task(rows_agent), replace=True)
    pd.DataFrame([{"data_source": "calc", "task_type": "va_verl_rows_agent", "ability": "math",
                   "prompt": [{"role": "user", "content": q}], "reward_model": {"style": "rule", "ground_truth": a},
                   "extra_info": {"index": i}}
                  for i, (q, (_, a)) in enumerate(list(PROBLEMS.items())[:2])]).to_parquet(tmp_path / "rows.parquet")
    cfg = agent_config(tiny_qwen_dir, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
                       "+agentic.max_turns=4", "+agentic.max_new_tokens=64", prompt_length=512, response_length=256)
    policy = ScriptedCalculatorPolicy(qwen25_tokenizer)
    worker = AgentLoopWorker(cfg, llm_client=BackendLLMClient(policy, 256),
                             reward_loop_worker_handles=[InProcessActor(RewardLoopWorker(cfg))])
    batch = dataset_batch(worker, cfg, tmp_path / "rows.parquet", rows=2, n=1)
    samples = [{k: v[i] for k, v in batch.non_tensor_batch.items()} for i in range(len(batch))]

    async def run_all():
        stored = []  # (key, output) as AgentLoopWorkerTQ._agent_loop_postprocess puts them into TransferQueue
        for sample in samples:
            for session_id in range(2):
                loop = registered_task_agent(worker)
                kwargs = dict(sample, session_id=session_id, global_steps=1)
                params = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)
                out = await loop.run(params, **kwargs)
                outputs = out if isinstance(out, list) else [out]
                await worker._compute_score(outputs, kwargs=kwargs)  # verl's own: scores the last, once
                for earlier in outputs[:-1]:  # agent_loop_tq.py: the earlier rows get the last one's reward
                    earlier.reward_score = outputs[-1].reward_score
                stored += [(f"{sample['uid']}_{session_id}_{i}", o) for i, o in enumerate(outputs)]
        return stored

    stored = asyncio.run(run_all())
    assert [key.rsplit("_", 2)[1:] for key, _ in stored] == [["0", "0"], ["1", "0"], ["0", "0"], ["0", "1"],
                                                            ["1", "0"], ["1", "1"]]
    for key, out in stored:
        agentic = out.extra_fields[AGENTIC_FIELD]
        assert agentic["error"] is None and agentic["rows"] == (2 if agentic["extra_info"]["index"] == 1 else 1)
        assert agentic["split_reason"] == ("history_changed" if agentic["row"] < agentic["rows"] - 1 else None)
        assert out.reward_score == (1.0 if key.rsplit("_", 2)[1] == "0" else 0.0)
        row = {"prompt_ids": out.prompt_ids, "response_ids": out.response_ids, "response_mask": out.response_mask,
               "response_logprobs": [lp if m else None for lp, m in zip(out.response_logprobs, out.response_mask)],
               "messages": agentic["messages"], "turns": agentic["turns"], "tools": agentic["tools"]}
        assert check_drift(row, qwen25_tokenizer, stop_token_ids=[policy.end_id]).ok, key
    first, second = (out for key, out in stored if key.endswith(("_0_0", "_0_1")) and
                     out.extra_fields[AGENTIC_FIELD]["rows"] == 2)
    assert second.prompt_ids[:len(first.prompt_ids)] != first.prompt_ids + first.response_ids  # history changed
    assert sum(first.response_mask) > 0 and sum(second.response_mask) > 0  # each row trains on its own call

    keys = [key for key, _ in stored]
    fields = [out.as_dict() for _, out in stored]
    pad = torch.nn.utils.rnn.pad_sequence
    data = DataProto.from_single_dict({
        "rm_scores": pad([f["rm_scores"] for f in fields], batch_first=True),
        "response_mask": pad([f["response_mask"] for f in fields], batch_first=True),
        "uid": np.array([key.rsplit("_", 2)[0] for key in keys], dtype=object)})
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data = compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator=AdvantageEstimator.GRPO,
                                                    num_repeat=2, config=OmegaConf.create(OmegaConf.to_container(
                                                        cfg.algorithm)))
    # per prompt: rewards 1 and 0 over its 2 sessions -> +-(0.5 / std([1, 0])) = +-0.7071 on every row of a session,
    # on its generated tokens only; the split episode's extra row does not make a third member of the group
    expected = 0.5 / torch.tensor([1.0, 0.0]).std().item()
    for i, key in enumerate(keys):
        mask = data.batch["response_mask"][i].bool()
        sign = 1.0 if key.rsplit("_", 2)[1] == "0" else -1.0
        assert torch.allclose(data.batch["advantages"][i][mask], torch.full((int(mask.sum()),), sign * expected),
                              atol=1e-4), key
        assert not data.batch["advantages"][i][~mask].any()
    # the monitors count the step's episodes, not its rows: the split episode once, by its last row
    from verl_agentic.verl_plugin.monitors import episodes_from_fields

    episodes, rewards = episodes_from_fields([o.extra_fields for _, o in stored], [o.reward_score for _, o in stored])
    assert len(episodes) == 4 and rewards == [1.0, 0.0, 1.0, 0.0]
    assert [e["rows"] for e in episodes] == [1, 1, 2, 2]


def test_why_verls_trainer_refuses_an_episodes_rows(monkeypatch):
    """The reasons an episode of several rows keeps only its last row in verl's trainer, each named."""
    from omegaconf import OmegaConf

    rows = [{"prompt_ids": [1] * 10}, {"prompt_ids": [1] * 40}]

    def refusal(use_v1: bool, estimator: str, prompt_length: int = 64):
        loop = types.SimpleNamespace(prompt_length=prompt_length, config=OmegaConf.create(
            {"trainer": {"use_v1": use_v1}, "algorithm": {"adv_estimator": estimator}}))
        return TaskAgentLoop._rows_refusal(loop, rows)

    assert refusal(True, "grpo") is None
    assert refusal(False, "grpo") == "verl's legacy trainer (trainer.use_v1=false) takes one row per episode"
    assert "adv_estimator=grpo and turn_loo only (with rloo each row would count as an episode of its own)" in \
        refusal(True, "rloo")
    assert refusal(True, "turn_loo") is None  # joined in the trainer by the turn_loo_rows patch
    monkeypatch.setenv("VERL_AGENTIC_TURN_LOO_ROWS", "0")
    assert refusal(True, "turn_loo") == ("the turn_loo_rows patch that joins them for turn_loo is off: "
                                         "VERL_AGENTIC_TURN_LOO_ROWS=0")
    assert refusal(True, "grpo", prompt_length=32) == (
        "its row 1's prompt has 40 tokens, more than actor_rollout_ref.rollout.prompt_length=32")
