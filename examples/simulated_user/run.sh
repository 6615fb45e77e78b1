#!/usr/bin/env bash
# Underspecified word problems: the policy has to ask for the missing number, a simulated user
# (a language model with a persona and the hidden fact) answers. The embedded SmolLM2 plays both.
#
#   bash examples/simulated_user/run.sh [extra main_rollout overrides]   # -> outputs/simulated_user
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" -m verl_agentic.main_rollout task_type=tool_agent \
  data.path=examples/simulated_user/problems.jsonl data.max_samples=-1 \
  task.tool_agent.interaction=examples/simulated_user/simulated_user.yaml \
  rollout.max_turns=4 rollout.max_new_tokens=48 rollout.temperature=0 \
  reward.manager=naive output.dir=outputs/simulated_user "$@"
