"""End to end on the embedded model: GSM8K with CodeVerifyInteraction and the sandboxed Python tool."""

from collections import Counter

from verl_agentic.agentic_utils import load_rows
from verl_agentic.backends.hf import HFBackend
from verl_agentic.tasks.gsm8k.interactions import DEFAULT_VERIFY
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift

from va_testing import GSM8K_TEST


def test_code_verify_with_the_python_tool_on_smollm2(smol_dir):
    backend = HFBackend.from_pretrained(smol_dir, max_batch_size=16, seed=0)
    rows = load_rows(GSM8K_TEST, "gsm8k", 6)
    task_cfg = {"gsm8k": {"interaction": "code_verify", "tools": ["python"], "parser": "python_code",
                          "call_timeout_s": 30}}
    rollout = AsyncRollout(backend, RolloutConfig(max_turns=4, max_new_tokens=160, max_total_tokens=2048,
                                                  temperature=0.7, concurrency=8),
                           task_configs=task_cfg, seed=0, progress=False)
    trajs = rollout.run_sync(rows)
    assert len(trajs) == 6
    roles = Counter(turn["role"] for t in trajs for turn in t["turns"])
    assert sum(t["metrics"]["tool_calls"] for t in trajs) >= 1 and roles["tool"] >= 1, roles
    assert any(m["content"] == DEFAULT_VERIFY for t in trajs for m in t["messages"] if m["role"] == "user")
    for t in trajs:
        assert t["error"] is None or t["error"]["type"] == "context_overflow", t["error"]
        assert t["tools"][0]["function"]["name"] == "python"
        report = check_drift(t, backend.tokenizer, stop_token_ids=backend.stop_token_ids)
        assert report.ok, report.as_dict()
        for turn in t["turns"]:
            span = t["response_mask"][turn["start"]:turn["end"]]
            assert span == ([1] * len(span) if turn["role"] == "assistant" else [0] * len(span))
        tool_msgs = [m for m in t["messages"] if m["role"] == "tool"]
        turns = t["turns"]
        calls = [len((turn.get("info") or {}).get("tool_calls", [])) for turn in turns]
        # a call in the episode's last turn is run and counted, but no observation turn is left to show its
        # result (an observation turn may also carry a parse-error message: its role is then "user")
        answered = sum(n for i, n in enumerate(calls) if i + 1 < len(turns))
        assert len(tool_msgs) == answered and t["metrics"]["tool_calls"] == sum(calls)
        assert all(m["name"] == "python" and m["content"] for m in tool_msgs)
