"""``scripts/run_tests.sh`` (what ``make test`` runs): two passes over a small real suite, the tests not
marked serial on two xdist workers, then the serial ones alone, collected from their files only
(tests/va_serial_split.py, loaded as tests/conftest.py loads it); both passes run whenever the first
finds serial tests, and the exit status is the first failing pass's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS.parent / "scripts" / "run_tests.sh"

SUITE = '''
import os, pytest

with open(os.environ["VA_IMPORT_LOG"], "a") as f:  # which processes import (collect) this file
    f.write(f"small {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")

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

OTHER = '''
import os

with open(os.environ["VA_IMPORT_LOG"], "a") as f:
    f.write(f"other {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")

def test_other():
    with open(os.environ["VA_ORDER_LOG"], "a") as f:
        f.write(f"test_other {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")
'''


def _run(tmp_path: Path, marks: str, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / "test_small.py").write_text(SUITE)
    (tmp_path / "test_other.py").write_text(OTHER)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["va_serial_split"]\n')
    (tmp_path / "pytest.ini").write_text(f"[pytest]\npythonpath = {TESTS}\nmarkers =\n    serial: alone\n"
                                         "    slow: slow\n")
    log = tmp_path / "order.log"
    log.unlink(missing_ok=True)
    (tmp_path / "import.log").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # this test's own worker's
    env.update(VA_ORDER_LOG=str(log), VA_IMPORT_LOG=str(tmp_path / "import.log"), VA_FAIL=fail, VA_TEST_WORKERS="2")
    proc = subprocess.run(["bash", str(SCRIPT), sys.executable, marks, "-p", "no:cacheprovider"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_the_parallel_pass_runs_on_workers_then_the_serial_tests_run_alone(tmp_path):
    proc, order = _run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = order[:3], order[3:]
    assert sorted(x.split()[0] for x in first) == ["parallel_a", "parallel_b", "test_other"]
    assert all(x.split()[1].startswith("gw") for x in first)  # xdist workers
    assert second == ["alone main", "alone_and_slow main"]  # in the pytest process itself, after the others
    assert "pass 1 of 2" in proc.stdout and "pass 2 of 2" in proc.stdout and "both passes" in proc.stdout


def test_a_mark_expression_narrows_both_passes(tmp_path):
    proc, order = _run(tmp_path, "not slow")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(x.split()[0] for x in order) == ["alone", "parallel_a", "parallel_b", "test_other"]


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


def test_the_serial_pass_collects_only_the_files_of_its_tests_and_is_skipped_when_there_are_none(tmp_path):
    proc, order = _run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    imports = (tmp_path / "import.log").read_text().split("\n")
    assert "small main" in imports and "other main" not in imports  # pass 2 did not import test_other.py
    assert {"other gw0", "other gw1"} <= set(imports)  # pass 1's workers did
    assert "pass 2 of 2: the tests marked serial, one at a time (2 tests, from 1 of the suite's files)" in proc.stdout
    proc, order = _run(tmp_path, "not serial")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pass 2 of 2: the tests marked serial, one at a time: none selected, skipped" in proc.stdout
    assert not [x for x in (tmp_path / "import.log").read_text().split("\n") if x.endswith(" main")]
    assert sorted(x.split()[0] for x in order) == ["parallel_a", "parallel_b", "test_other"]
