#!/usr/bin/env bash
# The learning run: GRPO on easy word problems with multi-turn retry feedback, embedded SmolLM2-135M,
# on a 2-core CPU. Usage: bash examples/learning_run/run.sh SEED [extra hydra overrides]
# A turn cut at the 24-token cap has no answer (task and scorer: answer_in_cut_turn=false): with the flexible
# extraction its unfinished working's last number used to count, and runs drifted to answers cut at the cap
# (examples/learning_run/PREREG.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED=${1:-0}; shift || true
PYTHON=${PYTHON:-.venv/bin/python}
[ -f examples/learning_run/easy_arith.jsonl ] || "$PYTHON" examples/learning_run/make_data.py
exec "$PYTHON" -m verl_agentic.main_ppo \
  task_type=gsm8k model.path=embedded seed="$SEED" \
  data.path=examples/learning_run/easy_arith.jsonl \
  task.gsm8k.feedback=retry task.gsm8k.extraction=flexible task.gsm8k.answer_in_cut_turn=false \
  "task.gsm8k.retry_message='That is not right. Try again. Answer with the number only.'" \
  rollout.n=8 rollout.max_turns=2 rollout.max_new_tokens=24 rollout.max_total_tokens=512 rollout.temperature=1.0 \
  reward.manager=naive "reward.scorer_kwargs={gsm8k: {answer_in_cut_turn: false}}" \
  algorithm.adv_estimator=grpo actor.policy_loss=vanilla actor.loss_agg_mode=token-mean \
  actor.optim.lr=2e-5 actor.grad_clip=1.0 \
  actor.ppo_mini_batch_size=32 actor.ppo_micro_batch_size=16 \
  trainer.batch_size=4 trainer.total_steps=20 trainer.save_freq=0 trainer.save_hf_model=false \
  trainer.logger='[jsonl]' \
  output.dir="outputs/learning_run/seed$SEED" "$@"
