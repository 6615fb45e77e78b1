#!/usr/bin/env bash
# Where the learning run's resident memory goes (issue 37): short runs of examples/learning_run/run.sh, one
# setting changed per variant, the trainer process's peak RSS from /usr/bin/time -v. Seed 100 (not one of the
# pre-registered seeds). Results: DEVLOG, 2026-11-27 (fifteenth session). Usage: bash bench/learning_run_memory.sh
set -uo pipefail
cd "$(dirname "$0")/.."
run() {  # label, env assignment, overrides...
  local label=$1 envs=$2; shift 2
  rm -rf "/tmp/mem_$label"
  env $envs /usr/bin/time -v bash examples/learning_run/run.sh 100 output.dir="/tmp/mem_$label" "$@" \
    > "/tmp/mem_$label.log" 2>&1
  echo "$label exit=$? peak_rss_gb=$(awk '/Maximum resident/ {printf "%.2f", $NF/1048576}' "/tmp/mem_$label.log")" \
       "wall=$(awk '/Elapsed/ {print $NF}' "/tmp/mem_$label.log")"
}
STEPS2="trainer.total_steps=2"
VAL4="trainer.total_steps=4 data.val_path=examples/learning_run/heldout.jsonl trainer.test_freq=2"
run base X=1 $STEPS2
run arena2 MALLOC_ARENA_MAX=2 $STEPS2
run kv05 X=1 $STEPS2 rollout.hf.kv_cache_gb=0.5
run nopack X=1 $STEPS2 rollout.hf.packed_linear=false rollout.hf.fused_forward=false
run micro4 X=1 $STEPS2 actor.ppo_micro_batch_size=4
run val_base X=1 $VAL4
run val_kv05 X=1 $VAL4 rollout.hf.kv_cache_gb=0.5
