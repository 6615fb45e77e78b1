#!/usr/bin/env bash
# The invalid-tool-call policy on real invalid calls: SmolLM2 (greedy) is asked for Python code but has
# only the calculator tool; with the python_code parser each ```python block it writes is a call to the
# unknown tool "python". rollout.max_consecutive_invalid_tool_calls=2 ends each episode at its second.
#
#   bash examples/invalid_tool_calls/run.sh [extra main_rollout overrides]   # -> outputs/invalid_tool_calls
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" -m verl_agentic.main_rollout task_type=tool_agent data.path=examples/invalid_tool_calls/questions.jsonl \
  "task.tool_agent.tools=[calculator]" task.tool_agent.parser=python_code \
  rollout.max_consecutive_invalid_tool_calls=2 rollout.max_turns=4 rollout.max_new_tokens=96 rollout.temperature=0 \
  reward.manager=none output.dir=outputs/invalid_tool_calls "$@"
