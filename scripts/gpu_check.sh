#!/usr/bin/env bash
# One command for one GPU (H100/H200 class): install verl 0.9.1 with its vLLM stack and this package into a
# fresh environment, train multi-turn GSM8K for 2 GRPO steps in verl's `sync` mode and 2 in `colocate_async`
# (verl's vLLM rollout in bf16; SGLang with --rollout sglang), and judge the result.
#
#   scripts/gpu_check.sh                       # -> outputs/gpu-check/report.md and report.json; exit 0: passed
#   scripts/gpu_check.sh --rollout sglang      # verl's SGLang rollout instead (verl[sglang]==0.9.1)
#   scripts/gpu_check.sh --dry-run             # no GPU, no install: compose each run's exact configuration,
#                                              #   validate it with verl's own config validation (our plugin
#                                              #   loaded), print the commands, exit 0 when valid,
#                                              #   1 with verl's message when not
#   GPU_CHECK_VENV=/opt/va-gpu scripts/gpu_check.sh   # an environment you made: skips the install
#   scripts/gpu_check.sh [--dry-run] [extra hydra overrides...]   # appended to both runs (later ones win)
#
# Builds on scripts/run_gsm8k_multiturn.sh (DEVICE=gpu: its overrides are the configuration) and adds only
# what a check needs (CHECK_OVERRIDES below): the mode, the rollout, bf16, 2 steps of 16 prompts x 4,
# no validation or checkpoints, verl's file logger and our trajectory dump into the run's folder.
#
# The install (not measured: no GPU machine with network has run it): `pip install "verl[vllm]==0.9.1"` plus
# this package's own dependencies resolves to 263 packages (pip --dry-run, 2026-11-27), among them torch 2.11.0
# with its CUDA libraries, vllm 0.24.0 (279 MB) and transformers 5.9.0: expect several GB of downloads, about
# 10 GB on disk under OUT/venv, and 5-15 minutes. This package goes in editable with --no-deps: its own torch
# pin is the CPU build's (2.13.0), verl's extra pins 2.11.0. The model (MODEL_PATH, default
# Qwen/Qwen2.5-0.5B-Instruct, ~1 GB) comes from the Hugging Face hub on first use.
#
# Checks (exit 1 when one fails; the report says which):
# - every step finished: verl's file logger has timing_s/step for steps 1 and 2 of each run;
# - no drift: every dumped episode is token-exact against the chat template (verl_agentic's check_drift,
#   as `python -m verl_agentic.inspect` shows it);
# - the rollout-vs-trainer gap, verl's `training/rollout_probs_diff_mean` (verl/utils/debug/metrics.py: the mean
#   over response tokens of |p_trainer - p_rollout|, probabilities), is at most GAP_BOUND (0.02) at each step.
#   Why 0.02: healthy bf16 vLLM + FSDP runs report 0.004 (verl-omni issue 637) and 0.0064 (verl PR 7749); bf16
#   rounding alone moved our engine's logprobs 0.033 nats/token on an H200 (bench/gpu/engine_check_h200.md),
#   and |dp| <= |dlogp| for p <= 1. A trainer scoring other tokens than the rollout sampled, or other weights,
#   gives tenths. In colocate_async the gap also holds staleness (an episode spanning a weight update): 0.0085
#   on the CPU test at lr 1e-5 (tests/test_verl_cpu.py); this check trains at 1e-6. Not yet seen on a GPU.
# Bad input, one line each, exit 2: no GPU (nvidia-smi missing or failing), too little GPU memory (under
# GPU_CHECK_MIN_GIB, default 40: a guess, not measured; vLLM takes half the GPU and FSDP trains the 0.5B model
# in the rest), no network for the install (the index URL, PIP_INDEX_URL or https://pypi.org/simple/, does not
# answer: pass GPU_CHECK_VENV, and a local MODEL_PATH).
#
# Environment (defaults in brackets):
#   OUT             [outputs/gpu-check]   the runs (OUT/sync, OUT/colocate_async), the report, OUT/venv
#   GPU_CHECK_VENV  [OUT/venv, installed]  an environment with verl[vllm]==0.9.1 (or [sglang]) and this package
#   MODEL_PATH      [Qwen/Qwen2.5-0.5B-Instruct]   GPU_CHECK_MIN_GIB [40]   PIP_INDEX_URL [https://pypi.org/simple]
#   PYTHON          [.venv/bin/python if present, else python3]  runs --dry-run (verl and this package needed)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPORT_PY="$ROOT/scripts/gpu_check_report.py"
MODES=(sync colocate_async)
STEPS=2
GAP_BOUND=0.02
DRY_RUN=false
ROLLOUT=vllm
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=true ;;
    --rollout) ROLLOUT="${2:-}"; shift ;;
    --rollout=*) ROLLOUT="${1#--rollout=}" ;;
    -*) echo "gpu_check.sh: unknown option '$1' (--dry-run, --rollout vllm|sglang)" >&2; exit 2 ;;
    *) EXTRA+=("$1") ;;
  esac
  shift
done
if [[ "$ROLLOUT" != vllm && "$ROLLOUT" != sglang ]]; then
  echo "gpu_check.sh: --rollout must be vllm or sglang, got '$ROLLOUT'" >&2
  exit 2
fi
OUT="$(realpath -m "${OUT:-$ROOT/outputs/gpu-check}")"
MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}"

# what the check adds to run_gsm8k_multiturn.sh's GPU overrides, for one mode
check_overrides() {
  local mode="$1"
  printf '%s\n' \
    "trainer.v1.trainer_mode=$mode" \
    "actor_rollout_ref.rollout.name=$ROLLOUT" \
    actor_rollout_ref.rollout.dtype=bfloat16 \
    "trainer.total_training_steps=$STEPS" \
    data.train_batch_size=16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    trainer.val_before_train=false \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    "trainer.rollout_data_dir=$OUT/$mode" \
    "trainer.experiment_name=gpu_check_${mode}_${ROLLOUT}" \
    "${EXTRA[@]}"
}

# the exact override list a run gets: the launch script's (DEVICE=gpu) followed by the check's
compose_overrides() {
  DEVICE=gpu MODEL_PATH="$MODEL_PATH" LOGGER='["console","file"]' bash "$ROOT/scripts/run_gsm8k_multiturn.sh" --print-overrides
  check_overrides "$1"
}

if $DRY_RUN; then
  if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"; elif [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  named=()
  for mode in "${MODES[@]}"; do
    compose_overrides "$mode" > "$tmp/$mode.txt"
    named+=("$mode/$ROLLOUT=$tmp/$mode.txt")
    echo "gpu_check: would run ($mode, $ROLLOUT): DEVICE=gpu MODEL_PATH=$MODEL_PATH LOGGER='[\"console\",\"file\"]' VERL_FILE_LOGGER_PATH=$OUT/$mode/metrics.jsonl scripts/run_gsm8k_multiturn.sh $(check_overrides "$mode" | tr '\n' ' ')"
  done
  "$PY" "$REPORT_PY" validate "${named[@]}"   # exit status 1 (set -e) with verl's message when one is invalid
  exit 0
fi

# --- the machine: one GPU with enough memory
GPU="$(python3 "$REPORT_PY" gpu "${GPU_CHECK_MIN_GIB:-40}")" || exit $?
echo "gpu_check: $GPU"
mkdir -p "$OUT"

# --- the environment: GPU_CHECK_VENV as given, or OUT/venv installed once (a stamp marks it done)
if [[ -n "${GPU_CHECK_VENV:-}" ]]; then
  VENV="$GPU_CHECK_VENV"
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "gpu_check.sh: GPU_CHECK_VENV=$VENV has no bin/python" >&2
    exit 2
  fi
else
  VENV="$OUT/venv"
  STAMP="$VENV/.gpu-check-installed-$ROLLOUT"
  if [[ ! -f "$STAMP" ]]; then
    INDEX="${PIP_INDEX_URL:-https://pypi.org/simple}"
    python3 "$REPORT_PY" probe "${INDEX%/}/verl/" || exit $?
    echo "gpu_check: installing verl[$ROLLOUT]==0.9.1 and this package into $VENV (several GB, 5-15 minutes)"
    python3 -m venv "$VENV"
    PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
    mapfile -t OUR_DEPS < <(python3 "$REPORT_PY" requirements "$ROOT/pyproject.toml")
    "${PIP[@]}" install "verl[$ROLLOUT]==0.9.1" "${OUR_DEPS[@]}"
    "${PIP[@]}" install --no-deps -e "$ROOT"
    "$VENV/bin/python" -c "import verl, verl_agentic.verl_plugin"
    touch "$STAMP"
  fi
fi
PY="$VENV/bin/python"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
"$PY" "$REPORT_PY" environment "$OUT/environment.json" --commit "$COMMIT"

# --- the runs: one after another, each with nvidia-smi sampling the GPU's memory once a second
for mode in "${MODES[@]}"; do
  run="$OUT/$mode"
  rm -rf "$run" && mkdir -p "$run"
  mapfile -t CHECK < <(check_overrides "$mode")
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 1 > "$run/gpu_memory.csv" &
  sampler=$!
  echo "gpu_check: running $mode ($ROLLOUT), log: $run/train.log"
  rc=0
  DEVICE=gpu PYTHON="$PY" MODEL_PATH="$MODEL_PATH" LOGGER='["console","file"]' \
    VERL_FILE_LOGGER_PATH="$run/metrics.jsonl" VERL_AGENTIC_WEIGHT_PUSH_LOG="$run/weight_pushes.jsonl" \
    bash "$ROOT/scripts/run_gsm8k_multiturn.sh" "${CHECK[@]}" > "$run/train.log" 2>&1 || rc=$?
  echo "$rc" > "$run/exit_code"
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  echo "gpu_check: $mode exited $rc"
done

# --- the report (OUT/report.md, OUT/report.json); its exit status is the check's
RUNS="$(IFS=,; echo "${MODES[*]}")"
exec "$PY" "$REPORT_PY" report "$OUT" --model "$MODEL_PATH" --steps "$STEPS" --gap-bound "$GAP_BOUND" --runs "$RUNS"
