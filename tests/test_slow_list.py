"""``make test-fast``'s list of slow tests: written by ``scripts/slow_tests.py`` from real pytest
``--durations=0`` output, read by conftest."""

from __future__ import annotations

import subprocess
import sys

from conftest import slow_test_ids
from va_testing import REPO


def _durations(tmp_path, log: str, body: str) -> str:
    (tmp_path / "test_a.py").write_text(body)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
                           "-o", "addopts=", "test_a.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    (tmp_path / log).write_text(proc.stdout)
    return str(tmp_path / log)


def test_the_list_holds_the_tests_over_the_threshold_and_a_later_log_wins(tmp_path, monkeypatch):
    body = "import time\n\ndef test_slow():\n    time.sleep({})\n\ndef test_quick():\n    pass\n"
    first = _durations(tmp_path, "full.log", body.format(0.6))
    out = tmp_path / "slow.txt"
    cmd = [sys.executable, str(REPO / "scripts" / "slow_tests.py"), "--threshold-s", "0.4", "--out", str(out),
           "--root", str(tmp_path)]
    subprocess.run([*cmd, first], check=True, capture_output=True)
    import conftest

    monkeypatch.setattr(conftest, "SLOW_LIST", out)
    assert slow_test_ids() == {"test_a.py::test_slow"}
    # the same test faster in a later log (a fast-suite run): the later time counts
    second = _durations(tmp_path, "fast.log", body.format(0.1))
    subprocess.run([*cmd, first, second], check=True, capture_output=True)
    assert slow_test_ids() == set()
    proc = subprocess.run([*cmd, str(tmp_path / "nothing.log")], capture_output=True, text=True)
    assert proc.returncode != 0
    # a test that no longer exists (renamed or removed since the log) is left out, and counted
    (tmp_path / "test_a.py").write_text(body.format(0.6).replace("def test_slow", "def test_renamed"))
    proc = subprocess.run([*cmd, first], capture_output=True, text=True, check=True)
    assert slow_test_ids() == set() and "1 tests of the logs no longer exist" in proc.stdout


def test_every_listed_test_exists():
    """A test renamed after the list was made would silently join the fast suite: each listed id must name a
    test function in its module."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from slow_tests import names_a_test
    finally:
        sys.path.remove(str(REPO / "scripts"))
    missing = [node for node in slow_test_ids() if not names_a_test(node)]
    assert not missing, missing
