"""``scripts/run_tests.sh`` (what ``make test`` runs): two passes over a small real suite, the tests not
marked serial on two xdist workers, then the serial ones alone; both passes always run, and the exit
status is the first failing pass's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "run_tests.sh"

SUITE = '''
import os, pytest

def _log(name):
    with open(os.environ["VA_ORDER_LOG"], "a") as f:
        f.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")

def test_parallel_a():
    _log("parallel_a")

def test_parallel_b():
    _log("parallel_b")
    assert os.environ.get("VA_FAIL") != "parallel"

@pytest.mark.serial
def test_alone():
    _log("alone")
    assert os.environ.get("VA_FAIL") != "serial"

@pytest.mark.slow
@pytest.mark.serial
def test_alone_and_slow():
    _log("alone_and_slow")
'''


def _run(tmp_path: Path, marks: str, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / "test_small.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n    slow: slow\n")
    log = tmp_path / "order.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # this test's own worker's
    env.update(VA_ORDER_LOG=str(log), VA_FAIL=fail, VA_TEST_WORKERS="2")
    proc = subprocess.run(["bash", str(SCRIPT), sys.executable, marks, "-p", "no:cacheprovider"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_the_parallel_pass_runs_on_workers_then_the_serial_tests_run_alone(tmp_path):
    proc, order = _run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = order[:2], order[2:]
    assert sorted(x.split()[0] for x in first) == ["parallel_a", "parallel_b"]
    assert all(x.split()[1].startswith("gw") for x in first)  # xdist workers
    assert second == ["alone main", "alone_and_slow main"]  # in the pytest process itself, after the others
    assert "pass 1 of 2" in proc.stdout and "pass 2 of 2" in proc.stdout and "both passes" in proc.stdout


def test_a_mark_expression_narrows_both_passes(tmp_path):
    proc, order = _run(tmp_path, "not slow")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(x.split()[0] for x in order) == ["alone", "parallel_a", "parallel_b"]


def test_a_failure_in_the_first_pass_still_runs_the_second_and_fails_the_run(tmp_path):
    proc, order = _run(tmp_path, "", fail="parallel")
    assert proc.returncode == 1
    assert "alone main" in order  # the serial pass ran anyway
    proc, order = _run(tmp_path, "", fail="serial")
    assert proc.returncode == 1 and "exit 1" in proc.stdout


def test_a_pass_that_selects_nothing_is_not_a_failure(tmp_path):
    proc, order = _run(tmp_path, "serial")  # the first pass selects nothing (pytest's exit 5)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(x.split()[0] for x in order) == ["alone", "alone_and_slow"]
