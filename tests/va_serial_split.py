"""scripts/run_tests.sh's split of the suite, as a pytest plugin (tests/conftest.py loads it).

With ``VA_SERIAL_LIST=<file>`` in the environment (run_tests.sh's first pass), the tests marked ``serial``
that the run's ``-m`` expression selected are left out of this run, and their node ids and files are
written to the file (``<file path>\t<node id>``, a line each). The second pass collects just those files (it
does not import the rest of the suite again) and is skipped when the list is empty. Without the variable
nothing changes.

The hook runs last, after conftest's marks and pytest's ``-m`` deselection. Each xdist worker collects the
whole selection and writes the same list (written whole, then renamed, so a reader never sees half a list).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LIST_ENV = "VA_SERIAL_LIST"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    target = os.environ.get(LIST_ENV)
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
