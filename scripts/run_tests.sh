#!/usr/bin/env bash
# make test / test-fast / test-vllm / test-all (their marks: Makefile): the suite in two passes, both always run.
#   1. every test not marked serial, on VA_TEST_WORKERS worker processes (pytest-xdist; default 2, one a core
#      here). A module's tests stay on one worker (--dist loadfile), so its fixtures are built once.
#   2. the tests marked serial, one at a time: they start Ray, verl's trainer or vLLM (their own cluster, and
#      most of the machine's memory). tests/conftest.py says which.
# Usage: scripts/run_tests.sh PYTHON MARK_EXPRESSION [pytest arguments...]
#   MARK_EXPRESSION selects the tests of both passes ("" for all; "not slow" for make test-fast).
# Exit status: 0 if both passes passed (a pass that selects no test counts as passed), else the first failure's.
set -uo pipefail
py=$1; marks=$2; shift 2
workers=${VA_TEST_WORKERS:-2}
scope() { if [ -n "$marks" ]; then echo "($marks) and $1"; else echo "$1"; fi; }

status=0
run_pass() {
    local name=$1; shift
    local start=$SECONDS
    echo "== $name"
    "$py" -m pytest -q "$@"
    local rc=$?
    echo "== $name: exit $rc after $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$status" -eq 0 ]; then status=$rc; fi  # 5: no test selected
}

total=$SECONDS
run_pass "pass 1 of 2: the tests not marked serial, on $workers workers" \
    -m "$(scope 'not serial')" -n "$workers" --dist loadfile "$@"
run_pass "pass 2 of 2: the tests marked serial, one at a time" -m "$(scope 'serial')" "$@"
echo "== both passes: $(( (SECONDS - total) / 60 )) min $(( (SECONDS - total) % 60 )) s, exit $status"
exit "$status"
