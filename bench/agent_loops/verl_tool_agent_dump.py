"""verl's side of the head-to-head bench, loaded into verl's processes (``VERL_USE_EXTERNAL_MODULES``):
``tool_agent_dump``, verl's own ``ToolAgentLoop`` unchanged, that also appends each episode to
``$BENCH_DUMP`` in verl_agentic's trajectory schema (token ids, mask, logprobs, messages, turns), so
the same drift check reads both loops' episodes."""

from __future__ import annotations

import json
import os
from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@register("tool_agent_dump")
class DumpingToolAgentLoop(ToolAgentLoop):
    async def _handle_pending_state(self, agent_data, sampling_params):
        self._bench_agent_data = agent_data  # one loop object per episode
        self._bench_requests_s = []
        return await super()._handle_pending_state(agent_data, sampling_params)

    async def _handle_generating_state(self, agent_data, sampling_params, ignore_termination=False):
        # each request's latency as verl's loop times it (its ``generate_sequences`` timer, summed per episode)
        before = agent_data.metrics.get("generate_sequences", 0.0)
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        self._bench_requests_s.append(agent_data.metrics.get("generate_sequences", 0.0) - before)
        return state

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        output = await super().run(sampling_params, **kwargs)
        data = self._bench_agent_data
        mask = list(output.response_mask)
        stops = set(sampling_params.get("stop_token_ids") or []) | {self.tokenizer.eos_token_id}
        turns, start = [], 0
        messages = _plain(data.messages)
        n_prompt = len(_plain(kwargs["raw_prompt"]))
        after = messages[n_prompt:]
        cursor = 0
        while start < len(mask):
            end = start
            while end < len(mask) and mask[end] == mask[start]:
                end += 1
            if mask[start] == 1:
                ids = output.response_ids[start:end]
                turns.append({"role": "assistant", "start": start, "end": end,
                              "finish_reason": "stop" if ids and ids[-1] in stops else "length"})
                cursor += 1
            else:
                k = 0
                while cursor + k < len(after) and after[cursor + k]["role"] == "tool":
                    k += 1
                turns.append({"role": "tool", "start": start, "end": end, "num_messages": max(k, 1)})
                cursor += k
            start = end
        logprobs = list(output.response_logprobs or [None] * len(mask))
        record = {
            "uid": str(kwargs.get("uid", "")), "task_type": "gsm8k", "agent_name": "tool_agent",
            "index": int(_plain(kwargs.get("extra_info") or {}).get("index", -1)), "sample_id": 0,
            "prompt_ids": list(output.prompt_ids), "response_ids": list(output.response_ids), "response_mask": mask,
            "response_logprobs": [lp if m == 1 else None for lp, m in zip(logprobs, mask)],
            "messages": messages, "num_prompt_messages": n_prompt, "turns": turns,
            "tools": _plain(getattr(data, "_active_tool_schemas", None)),
            "num_turns": output.num_turns, "finish_reason": turns[-1].get("finish_reason") if turns else None,
            "error": None, "metrics": {"tool_calls": sum(1 for t in turns if t["role"] == "tool")},
            "timing": {"generate_s": round(sum(self._bench_requests_s), 3),
                       "requests_s": [round(x, 4) for x in self._bench_requests_s]},
        }
        with open(os.environ["BENCH_DUMP"], "a") as f:
            f.write(json.dumps(record) + "\n")
        return output
