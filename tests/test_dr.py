"""The dr task: search (BM25 over the GSM8K train solutions), read, answer; rewarded by the row's scorer.

SmolLM2-135M never calls the search tool (0 of 6 episodes with the task's prompt and 0 of 8 with a
one-shot demonstration of a search call, measured), so the search -> read -> answer path is driven by
``FakeSearchingPolicy``: a scripted policy whose replies are encoded with the real Qwen2.5 tokenizer
and go through the real loop, template, parser, search tool, index and scorer. The real model runs
the README example end to end through ``main_rollout``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from verl_agentic.agentic_utils import DatasetError, load_rows
from verl_agentic.backends.base import GenerationBackend
from verl_agentic.backends.hf import HFBackend
from verl_agentic.envserver import EnvService, serve
from verl_agentic.interfaces import ConfigError, GenOutput
from verl_agentic.main_rollout import load_config, run
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift
from verl_agentic.tasks.dr import check_config, dr_preprocess
from verl_agentic.tasks.gen_chat import as_gen_chat_row
from verl_agentic.tools.search import build_index, serve as serve_search

from va_testing import GSM8K_TEST, REPO

GSM8K_TRAIN = REPO / "data" / "gsm8k" / "train.jsonl"
BUILD = ["build", str(GSM8K_TRAIN), None, "--text-field", "answer", "--title-field", "question", "--id-field", ""]


class FakeSearchingPolicy(GenerationBackend):
    """A scripted policy: first a search for the question, then the ``#### N`` of the first result it read.

    Its replies are real token ids of the tokenizer (ending with ``<|im_end|>``), without logprobs.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.stop_token_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    async def generate(self, prompt_ids, sampling):
        prompt = self.tokenizer.decode(prompt_ids)
        turn = prompt[prompt.rfind("<|im_start|>user"):]
        read = re.search(r"<tool_response>\n\[1\] .*?#### (\S+)", turn, re.S)
        if read:
            text = f"The most similar solved problem gives the answer.\n#### {read.group(1)}"
        else:
            question = turn.split("\n", 1)[1].split("\nYou can call the search tool")[0]
            call = json.dumps({"name": "search", "arguments": {"query": question}}, ensure_ascii=False)
            text = f"Let me search.\n<tool_call>\n{call}\n</tool_call>"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: sampling.max_new_tokens - 1]
        ids = ids + self.stop_token_ids
        return GenOutput(ids, None, self.tokenizer.decode(ids), "stop")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    path = tmp_path_factory.mktemp("dr") / "gsm8k_train.db"
    build_index(GSM8K_TRAIN, path, text_field="answer", title_field="question", id_field=None, progress=False)
    return path


def _rollout(backend, task_configs, **kw):
    cfg = dict(max_turns=3, max_new_tokens=400, max_total_tokens=4096, temperature=0.0, concurrency=8)
    return AsyncRollout(backend, RolloutConfig(**{**cfg, **kw}), task_configs=task_configs, seed=0)


def test_preprocess_and_config_errors(tmp_path, index, qwen25_tokenizer):
    row = dr_preprocess({"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}, 7)
    assert row["task_type"] == "dr" and row["data_source"] == "openai/gsm8k"
    assert row["reward_model"]["ground_truth"] == "4" and "search tool" in row["prompt"][0]["content"]
    other = dr_preprocess({"question": "Capital of France?", "answer": " Paris ", "data_source": "my_qa"}, 0)
    assert other["reward_model"]["ground_truth"] == "Paris" and other["data_source"] == "my_qa"
    with pytest.raises(DatasetError, match="field 'question'"):
        dr_preprocess({"answer": "#### 1"}, 0)
    missing = tmp_path / "none.db"
    with pytest.raises(ConfigError) as e:
        check_config({"index": str(missing)})
    assert f"build it with: python -m verl_agentic.tools.search build CORPUS.jsonl {missing}" in str(e.value)
    with pytest.raises(ConfigError, match="needs exactly one of 'index'.*build one with: python -m verl_agentic"):
        check_config({})
    with pytest.raises(ConfigError, match=r"unknown task.dr keys \['indx'\]"):
        check_config({"indx": str(index)})
    assert check_config({"index": str(index)}).top_k == 3
    # a rollout with a missing index fails before any generation, naming the build command
    with pytest.raises(ConfigError, match="python -m verl_agentic.tools.search build CORPUS.jsonl"):
        _rollout(FakeSearchingPolicy(qwen25_tokenizer), {"dr": {"index": str(missing)}}).run_sync(
            load_rows(GSM8K_TEST, "dr", 1))


def _train_rows(n):
    rows = load_rows(GSM8K_TRAIN, "dr", 300)[::60][:n]  # train questions: their own solutions are in the corpus
    assert all(r["task_type"] == "dr" for r in rows)
    return rows


async def test_search_read_answer_episodes_over_a_local_index_and_a_search_service(qwen25_tokenizer, index):
    policy = FakeSearchingPolicy(qwen25_tokenizer)
    rows = _train_rows(4)
    local = await _rollout(policy, {"dr": {"index": str(index), "top_k": 2}}).run(rows)
    async with serve_search(index) as url:
        remote = await _rollout(policy, {"dr": {"url": url, "top_k": 2}}).run(rows)
    for t, r, row in zip(local, remote, rows):
        assert t["error"] is None and t["num_turns"] == 2 and t["finish_reason"] == "stop"
        assert [m["role"] for m in t["messages"]] == ["user", "assistant", "tool", "assistant"]
        tool = t["messages"][2]
        assert tool["name"] == "search" and tool["content"].startswith(f"[1] {row['extra_info']['question']}")
        assert "\n\n[2] " in tool["content"] and "[3]" not in tool["content"]  # top_k
        assert t["reward"] == 1.0 and t["metrics"]["acc"] == 1.0 and t["metrics"]["searches"] == 1.0
        assert t["metrics"]["tool_calls"] == 1.0 and t["metrics"]["parse_errors"] == 0.0
        assert t["tools"][0]["function"]["name"] == "search"
        assert "<tools>" in qwen25_tokenizer.decode(t["prompt_ids"])  # Qwen2.5 renders the tools itself
        report = check_drift(t, qwen25_tokenizer, stop_token_ids=policy.stop_token_ids)
        assert report.ok, report.as_dict()
        assert r["messages"] == t["messages"] and r["response_ids"] == t["response_ids"]
    # a test question: the retrieved problem is a different one, so the copied answer is scored wrong
    test_row = load_rows(GSM8K_TEST, "dr", 1)
    wrong = (await _rollout(policy, {"dr": {"index": str(index)}}).run(test_row))[0]
    assert wrong["error"] is None and wrong["reward"] == 0.0 and wrong["metrics"]["acc"] == 0.0


async def test_dr_through_gen_chat_gives_the_in_process_episodes(qwen25_tokenizer, index):
    """The chat policy gets structured tool calls (ChatAdapter parses them); the service's dr reads them back."""
    policy = FakeSearchingPolicy(qwen25_tokenizer)
    rows = _train_rows(2)
    local = await _rollout(policy, {"dr": {"index": str(index)}}).run(rows)
    async with serve(EnvService(task_configs={"dr": {"index": str(index)}})) as url:
        remote = await _rollout(policy, {"gen_chat": {"url": url}}).run([as_gen_chat_row(r, "dr") for r in rows])
    for t, r in zip(local, remote):
        assert r["error"] is None and r["reward"] == t["reward"] == 1.0
        call = r["messages"][1]["tool_calls"][0]
        assert r["messages"][1]["content"] == "Let me search." and call["function"]["name"] == "search"
        assert json.loads(call["function"]["arguments"]) == {"query": t["messages"][0]["content"].split(
            "\nYou can call the search tool")[0]}
        assert r["messages"][2] == {**t["messages"][2], "tool_call_id": call["id"]}
        assert r["response_ids"] == t["response_ids"] and r["metrics"]["chat_rerender_tokens"] == 0
        report = check_drift(r, qwen25_tokenizer, stop_token_ids=policy.stop_token_ids)
        assert report.ok, report.as_dict()


def test_the_readme_example_runs_offline_on_the_embedded_model(smol_dir, tmp_path):
    index = tmp_path / "gsm8k_train.db"
    build = subprocess.run([sys.executable, "-m", "verl_agentic.tools.search",
                            *[str(index) if a is None else a for a in BUILD]], capture_output=True, text=True,
                           cwd=REPO, timeout=300)
    assert build.returncode == 0 and "indexed 7473 docs" in build.stderr, build.stderr
    readme = (REPO / "examples" / "dr" / "README.md").read_text()
    assert "python -m verl_agentic.tools.search build data/gsm8k/train.jsonl" in readme
    assert "python -m verl_agentic.main_rollout task_type=dr" in readme
    backend = HFBackend.from_pretrained(smol_dir, max_batch_size=8, seed=0)
    cfg = load_config(["task_type=dr", f"task.dr.index={index}", "data.max_samples=2", "rollout.max_turns=2",
                       "rollout.max_new_tokens=48", "rollout.temperature=0", f"output.dir={tmp_path / 'out'}",
                       "output.quiet=true"])
    trajs, summary = run(cfg, backend)
    assert len(trajs) == 2 and summary["drift"]["episodes_ok"] == 2
    for t in trajs:
        assert t["error"] is None and t["task_type"] == "dr" and t["tools"][0]["function"]["name"] == "search"
        assert "<tools>" in backend.tokenizer.decode(t["prompt_ids"])  # SmolLM2: the hermes system block
        assert t["score"] == t["reward"] and t["score_error"] is None  # the reward manager agrees
    assert (tmp_path / "out" / "trajectories.jsonl").exists()
