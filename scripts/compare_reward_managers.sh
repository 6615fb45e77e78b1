#!/usr/bin/env bash
# Score the same trajectories with the naive, prime and swedev (remote) reward managers, check
# that they give identical scores, and write a table and a bar chart.
#
#   scripts/compare_reward_managers.sh TRAJECTORIES.jsonl [OUT_DIR] [extra flags]
#
# TRAJECTORIES.jsonl: written by `python -m verl_agentic.main_rollout` (e.g. `make demo` ->
# outputs/demo/trajectories.jsonl). OUT_DIR defaults to outputs/compare-rewards. The swedev
# manager talks to a reward server this script starts on a free loopback port and stops.
# Extra flags go to `python -m verl_agentic.reward.compare` (see its --help), e.g.
#   --repeat 100            score every trajectory 100 times (throughput)
#   --scorer gsm8k_symbolic a CPU-heavier scorer
#   --workers 2 --timeout-s 10
# Exit code: 0 all managers agree, 1 they disagree, 2 bad input.
set -euo pipefail
if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,16p' "$0"; exit 2
fi
TRAJ="$1"; shift
OUT="${1:-outputs/compare-rewards}"; [[ $# -gt 0 ]] && shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python
exec "$PY" -m verl_agentic.reward.compare "$TRAJ" --out "$OUT" --managers naive,prime,swedev "$@"
