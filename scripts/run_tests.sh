#!/usr/bin/env bash
# make test / test-fast / test-vllm / test-all (their marks: Makefile): the suite in two passes.
#   1. every test not marked serial, on VA_TEST_WORKERS worker processes (pytest-xdist; default 2, one a core
#      here). A module's tests stay on one worker (--dist loadfile), so its fixtures are built once. This pass
#      also writes down the serial tests the mark expression selects (tests/va_serial_split.py).
#   2. those serial tests, one at a time, collected from their files only: they start Ray, verl's trainer or
#      vLLM (their own cluster, and most of the machine's memory). tests/conftest.py says which. Skipped when
#      pass 1 found none; when pass 1 wrote no list (it stopped before collecting), it selects by mark from
#      the whole suite as before.
# Usage: scripts/run_tests.sh PYTHON MARK_EXPRESSION [pytest arguments...]
#   MARK_EXPRESSION selects the tests of both passes ("" for all; "not slow" for make test-fast).
# Exit status: 0 if both passes passed (a pass that selects no test counts as passed), else the first failure's.
set -uo pipefail
py=$1; marks=$2; shift 2
workers=${VA_TEST_WORKERS:-2}
scope() { if [ -n "$marks" ]; then echo "($marks) and $1"; else echo "$1"; fi; }
list=$(mktemp)
rm -f "$list"  # written by pass 1 (its absence: pass 1 never got to collect)
trap 'rm -f "$list"' EXIT

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
# pass 1 selects by the mark expression alone; --serial-list (va_serial_split) leaves the serial tests out (one
# word: pytest looks for its rootdir and conftest before it knows the option, and would take a separate FILE
# for a test path)
run_pass "pass 1 of 2: the tests not marked serial, on $workers workers" \
    ${marks:+-m "$marks"} --serial-list="$list" -n "$workers" --dist loadfile "$@"
name="pass 2 of 2: the tests marked serial, one at a time"
if [ ! -e "$list" ]; then
    run_pass "$name (pass 1 wrote no list: selecting from the whole suite)" -m "$(scope 'serial')" "$@"
elif [ ! -s "$list" ]; then
    echo "== $name: none selected, skipped"
else
    mapfile -t files < <(cut -f1 "$list" | awk '!seen[$0]++')
    run_pass "$name ($(wc -l < "$list") tests, from ${#files[@]} of the suite's files)" -m "$(scope 'serial')" "$@" "${files[@]}"
fi
echo "== both passes: $(( (SECONDS - total) / 60 )) min $(( (SECONDS - total) % 60 )) s, exit $status"
exit "$status"
