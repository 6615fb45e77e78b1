"""The test run's time limit (pytest-timeout, configured in pyproject.toml): a test that hangs fails,
named, and the run goes on. Runs pytest on two small test files of its own, in a subprocess (~3 s)."""

import subprocess
import sys
import tomllib

from va_testing import REPO

HANGS = '''
import asyncio
import threading
import time

import pytest


@pytest.mark.timeout(2)
def test_hangs_in_an_event_loop():
    asyncio.run(asyncio.Event().wait())


@pytest.mark.timeout(2)
def test_hangs_on_a_lock():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def test_after_them():
    time.sleep(0.1)
'''


def test_a_hung_test_fails_by_name_and_the_run_goes_on(tmp_path):
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert options["timeout"] >= 1200 and options["timeout_method"] == "signal"
    (tmp_path / "test_hangs.py").write_text(HANGS)
    # the repository's pytest settings (-c pyproject.toml), the markers above in place of the 1200 s
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
                        "-p", "no:cacheprovider", "-q", str(tmp_path / "test_hangs.py")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    for name in ("test_hangs_in_an_event_loop", "test_hangs_on_a_lock"):
        assert f"FAILED test_hangs.py::{name} - Failed: Timeout" in r.stdout, r.stdout
    # each hang's own failure report (the "E" lines; the summary lines above are cut to the terminal's width)
    reports = [line for line in r.stdout.splitlines()
               if line.startswith("E") and "Failed: Timeout (>2.0s) from pytest-timeout." in line]
    assert len(reports) == 2 and "2 failed, 1 passed" in r.stdout, r.stdout
