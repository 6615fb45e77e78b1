"""scripts/run_tests.sh's split of the suite, as a pytest plugin (tests/conftest.py loads it).

With ``--serial-list=FILE`` (run_tests.sh's first pass), the tests marked ``serial`` that the run's ``-m``
expression selected are left out of the run, and their files and node ids are written to FILE
(``<file path>\\t<node id>``, a line each). The second pass collects just those files (it does not import
the rest of the suite again) and is skipped when the list is empty. Without the option nothing changes.

An option, not an environment variable: xdist's workers get the run's options, and the processes a test
starts (pytest runs of their own among them) do not. The hook runs last, after conftest's marks and
pytest's ``-m`` deselection. Each worker collects the whole selection and writes the same list (written
whole, then renamed, so a reader never sees half a list).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser) -> None:
    parser.addoption("--serial-list", metavar="FILE", default=None,
                     help="leave out the tests marked serial and write them to FILE (scripts/run_tests.sh)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    target = config.getoption("serial_list")
    if not target:
        return
    serial = [item for item in items if item.get_closest_marker("serial")]
    if serial:
        items[:] = [item for item in items if not item.get_closest_marker("serial")]
        config.hook.pytest_deselected(items=serial)
    path = Path(target)
    part = path.with_name(f"{path.name}.{os.getpid()}")
    part.write_text("".join(f"{item.path}\t{item.nodeid}\n" for item in serial))
    os.replace(part, path)
