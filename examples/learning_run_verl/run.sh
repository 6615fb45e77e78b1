#!/usr/bin/env bash
# examples/learning_run through verl's own trainer on the CPU: the same data, task, feedback, reward,
# algorithm and batch (GRPO, 4 prompts x 8 samples, 2 turns of 24 tokens, lr 5e-5, 20 steps, embedded
# SmolLM2-135M), run by `python -m verl.trainer.main_ppo` (Ray, FSDP2 over gloo, the hf rollout) via
# DEVICE=cpu scripts/run_gsm8k_multiturn.sh.
#
#   bash examples/learning_run_verl/run.sh [SEED] [extra hydra overrides]   # -> outputs/learning_run_verl/seed<SEED>
#   .venv/bin/python examples/learning_run_verl/summarize.py outputs/learning_run_verl/seed0 --out examples/learning_run_verl
#
# What differs from examples/learning_run/run.sh, because verl does it differently: verl samples the
# prompts with its own shuffled sampler (data.seed), counts ppo_mini_batch_size in prompts (4 = our 32
# episodes) and recomputes old log-probs with the trainer's FSDP model (ours reuses the rollout's).
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED=${1:-0}; shift || true
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-outputs/learning_run_verl/seed$SEED}
DATA_DIR=outputs/learning_run_verl/data
[ -f examples/learning_run/easy_arith.jsonl ] || "$PYTHON" examples/learning_run/make_data.py
if [ ! -f "$DATA_DIR/train.parquet" ]; then   # the rows are already preprocessed gsm8k rows: only the format changes
  mkdir -p "$DATA_DIR"
  "$PYTHON" -c "import pandas as pd, sys; df = pd.read_json(sys.argv[1], lines=True); df.to_parquet(sys.argv[2] + '/train.parquet'); df.head(8).to_parquet(sys.argv[2] + '/test.parquet')" \
    examples/learning_run/easy_arith.jsonl "$DATA_DIR"
fi
DEVICE=cpu OUT="$OUT" DATA_DIR="$DATA_DIR" PYTHON="$PYTHON" exec bash scripts/run_gsm8k_multiturn.sh \
  data.seed="$SEED" actor_rollout_ref.rollout.seed="$SEED" \
  agentic.task.gsm8k.feedback=retry agentic.task.gsm8k.extraction=flexible \
  "+agentic.task.gsm8k.retry_message='That is not right. Try again. Answer with the number only.'" \
  actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2 \
  agentic.max_new_tokens=24 data.max_response_length=128 data.max_prompt_length=256 \
  actor_rollout_ref.actor.use_kl_loss=false actor_rollout_ref.actor.optim.lr=5e-5 actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  data.train_batch_size=4 trainer.total_training_steps=20 \
  trainer.save_freq=-1 trainer.test_freq=-1 trainer.val_before_train=false "$@"
