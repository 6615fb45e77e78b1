#!/usr/bin/env bash
# Multi-turn GSM8K with feedback, trained with GRPO inside verl's distributed trainer (GPUs).
#
#   scripts/run_gsm8k_multiturn.sh [extra hydra overrides...]
#   MODEL_PATH=Qwen/Qwen2.5-1.5B-Instruct N_GPUS=4 scripts/run_gsm8k_multiturn.sh trainer.total_epochs=1
#   scripts/run_gsm8k_multiturn.sh --print-overrides     # print the overrides, one per line, and exit
#
# verl's own main_ppo runs the training; verl_agentic plugs in through the `verl.plugins` entry
# point (loaded by `import verl`): the `task_agent` agent loop runs our gsm8k task (answer,
# feedback, revised answer) with verl's vLLM servers, and the `agentic_naive` reward manager
# scores the last answer. The same experiment on one CPU machine: scripts/run_gsm8k_multiturn_cpu.sh.
#
# Environment (defaults in brackets):
#   MODEL_PATH  [Qwen/Qwen2.5-0.5B-Instruct]  HF id or local folder; Qwen/Qwen2.5-1.5B-Instruct also fits
#               one 80 GB GPU with these settings (raise N_GPUS and TP for larger models)
#   N_GPUS [1]  NNODES [1]  TP [1] (vLLM tensor parallel size per replica)
#   DATA_DIR    [outputs/data/gsm8k]  where the preprocessed parquet files go (made once)
#   LOGGER      ['["console"]']    e.g. '["console","wandb"]'
#   PYTHON      [python]
# Extra arguments are appended to the overrides (later ones win), e.g. trainer.total_training_steps=50.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}"
N_GPUS="${N_GPUS:-1}"
NNODES="${NNODES:-1}"
TP="${TP:-1}"
DATA_DIR="${DATA_DIR:-$ROOT/outputs/data/gsm8k}"
LOGGER="${LOGGER:-[\"console\"]}"
EXPERIMENT="gsm8k_multiturn_$(basename "$MODEL_PATH")"

OVERRIDES=(
  # --- algorithm: GRPO (advantage = reward normalised within the rollout.n samples of a prompt)
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=false               # KL goes into the loss instead (actor.use_kl_loss)

  # --- data: parquet written by our preprocessor (verl's RLHFDataset layout, plus task_type=gsm8k)
  "data.train_files=$DATA_DIR/train.parquet"
  "data.val_files=$DATA_DIR/test.parquet"
  data.train_batch_size=128                      # prompts per step (x rollout.n episodes)
  data.max_prompt_length=512                     # = rollout.prompt_length: GSM8K prompts are < 300 tokens
  data.max_response_length=1024                  # = rollout.response_length: ALL turns of an episode,
                                                 #   generated and injected tokens (the loop keeps within it)
  data.filter_overlong_prompts=true              # drop prompts longer than max_prompt_length up front
  data.truncation=error                          # never cut a prompt silently
  data.return_raw_chat=true                      # the agent loop needs the chat messages (raw_prompt)

  # --- policy model and its optimisation (FSDP)
  "actor_rollout_ref.model.path=$MODEL_PATH"
  actor_rollout_ref.model.use_remove_padding=true          # pack sequences: no compute on padding
  actor_rollout_ref.model.enable_gradient_checkpointing=true
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=64           # prompts per optimizer step (2 steps per batch)
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16  # sequences per forward/backward
  actor_rollout_ref.actor.use_kl_loss=true                 # KL to the reference policy, in the loss
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.loss_agg_mode=token-mean         # loss over tokens with response_mask 1 only
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32

  # --- rollout: vLLM servers, driven token-in/token-out by our agent loop
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.mode=async                     # server mode: what agent loops talk to
  "actor_rollout_ref.rollout.tensor_model_parallel_size=$TP"
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5     # vLLM's share; the rest is for FSDP training
  actor_rollout_ref.rollout.n=4                            # episodes per prompt (the GRPO group)
  actor_rollout_ref.rollout.temperature=1.0                # sampling in training; validation is greedy (val_kwargs)
  actor_rollout_ref.rollout.calculate_log_probs=true       # keep vLLM's token logprobs (rollout vs trainer gap)
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
  actor_rollout_ref.rollout.multi_turn.enable=true         # marks batches as multi-turn (verl passes it on)
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3  # assistant turns per episode (our max_turns)
  actor_rollout_ref.rollout.agent.default_agent_loop=task_agent  # every row runs through verl_agentic
  actor_rollout_ref.rollout.agent.num_workers=8            # agent-loop worker actors (CPU), episodes are async

  # --- verl_agentic's task_agent loop (+ because these keys are new to verl's config)
  +agentic.task_type=gsm8k                       # task of rows without a task_type (ours all have gsm8k)
  +agentic.task.gsm8k.feedback=verify            # wrong answer -> "Are you sure? ..." and another turn
                                                 #   (none | retry | verify | always_verify)
  +agentic.task.gsm8k.extraction=flexible        # the task's per-turn check: "#### N", else the last number
  +agentic.max_new_tokens=384                    # tokens per assistant turn (the response budget caps the rest)

  # --- reward: verl_agentic's naive manager (registered scorer gsm8k by data_source openai/gsm8k)
  reward.reward_manager.name=agentic_naive       # scores the LAST assistant turn (not the feedback text)
  "+reward.agentic.scorer_kwargs={gsm8k: {method: flexible}}"  # same answer rule as the task
  # (reward.reward_manager.name=prime: a process pool that kills hanging scorers)

  # --- trainer
  "trainer.logger=$LOGGER"
  trainer.project_name=verl_agentic
  "trainer.experiment_name=$EXPERIMENT"
  "trainer.n_gpus_per_node=$N_GPUS"
  "trainer.nnodes=$NNODES"
  trainer.critic_warmup=0                        # GRPO has no critic
  trainer.val_before_train=true                  # a baseline accuracy before the first update
  trainer.test_freq=10                           # validate every 10 steps
  trainer.save_freq=50                           # checkpoint every 50 steps
  trainer.total_epochs=2
)

if [[ "${1:-}" == "--print-overrides" ]]; then
  printf '%s\n' "${OVERRIDES[@]}"
  exit 0
fi

# data: our preprocessor, once (verl's RLHFDataset reads the parquet as is)
mkdir -p "$DATA_DIR"
for split in train test; do
  if [[ ! -f "$DATA_DIR/$split.parquet" ]]; then
    "$PY" -m verl_agentic.agentic_utils gsm8k "$ROOT/data/gsm8k/$split.jsonl" "$DATA_DIR/$split.parquet"
  fi
done

exec "$PY" -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"
