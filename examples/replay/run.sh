#!/usr/bin/env bash
# Record and replay on the embedded SmolLM2: record 4 gsm8k episodes with feedback, replay them with no
# model (the same), replay them against a changed task (caught at turn 1), replay one episode, re-score.
#
#   bash examples/replay/run.sh          # -> outputs/replay_example (about 15 s on 2 cores, model cached)
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
RUN=${RUN:-outputs/replay_example}
rm -rf "$RUN"
set -x
"$PYTHON" -m verl_agentic.main_rollout data.max_samples=2 rollout.n=2 rollout.max_turns=3 rollout.max_new_tokens=48 \
  task.gsm8k.feedback=always_verify reward.manager=naive output.record=true output.quiet=true output.dir="$RUN" || exit 1
"$PYTHON" -m verl_agentic.replay "$RUN" --score                     # exit 0: every episode (and score) as recorded
"$PYTHON" -m verl_agentic.replay "$RUN" --task-config \
  '{"gsm8k": {"feedback": "always_verify", "verify_message": "Check your answer once more."}}'  # exit 1: turn 1
"$PYTHON" -m verl_agentic.replay "$RUN" --episode 1/0 --json "$RUN/replay_1_0.jsonl"   # one episode
"$PYTHON" -m verl_agentic.replay "$RUN" --scorer gsm8k --scorer-kwargs '{"method": "strict"}'  # re-scored
true
