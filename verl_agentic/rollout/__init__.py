"""Multi-turn rollouts: AsyncRollout, the episode loop, trajectories and the drift check."""

from verl_agentic.rollout.async_rollout import AsyncRollout, RolloutConfig
from verl_agentic.rollout.loops import LoopLimits, default_gen, ids_agent_loop
from verl_agentic.rollout.metrics import format_table, summarize
from verl_agentic.rollout.template import ChatTemplate
from verl_agentic.rollout.trajectory import DriftReport, check_drift, read_jsonl, write_jsonl

__all__ = [
    "AsyncRollout", "RolloutConfig", "LoopLimits", "default_gen", "ids_agent_loop", "format_table",
    "summarize", "ChatTemplate", "DriftReport", "check_drift", "read_jsonl", "write_jsonl",
]
