"""Write tests/slow_tests.txt: the tests left out of ``make test-fast``, from a ``--durations=0`` log.

    .venv/bin/python -m pytest -q -p no:cacheprovider --durations=0 > full.log   # the whole suite
    .venv/bin/python scripts/slow_tests.py full.log [--threshold-s 3]
    .venv/bin/python scripts/slow_tests.py full.log fast.log   # several logs: a test's time from the last that has it

A test is slow when its setup, call and teardown together took at least the threshold (a module's
shared fixture counts for the test that set it up). Tests marked ``slow`` in their module (verl's trainer,
vLLM) are slow whatever the log says. ``make test-fast`` runs the rest: the edit-test loop.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)$")
REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "slow_tests.txt"


def names_a_test(node: str, root: Path = REPO) -> bool:
    """Whether ``path::test[param]`` still names a test function in its module (an old log has removed ones)."""
    path, _, name = node.partition("::")
    name = name.split("[")[0].split("::")[-1]
    file = root / path
    return file.is_file() and any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                                  for n in ast.walk(ast.parse(file.read_text())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="pytest output with --durations=0; a later log's times replace an "
                                           "earlier's for the tests it has (e.g. a full run, then make test-fast)")
    ap.add_argument("--threshold-s", type=float, default=3.0)
    ap.add_argument("--root", type=Path, default=REPO, help="the folder the test ids are relative to")
    ap.add_argument("--out", type=Path, default=OUT, help=f"default: {OUT.relative_to(OUT.parent.parent)}")
    a = ap.parse_args()
    seconds: dict[str, float] = {}
    for log in a.logs:
        this: dict[str, float] = defaultdict(float)
        for line in Path(log).read_text().splitlines():
            m = LINE.match(line.strip())
            if m:
                this[m.group(3)] += float(m.group(1))
        if not this:
            raise SystemExit(f"{log}: no durations (run pytest with --durations=0)")
        seconds.update(this)
    gone = [node for node in seconds if not names_a_test(node, a.root)]
    for node in gone:
        del seconds[node]
    slow = sorted((s, node) for node, s in seconds.items() if s >= a.threshold_s)
    fast_s = sum(s for s in seconds.values() if s < a.threshold_s)
    a.out.write_text(
        f"# Left out of `make test-fast` (tests/conftest.py marks them slow): setup + call + teardown >= "
        f"{a.threshold_s:g} s\n# in a full run; regenerate with scripts/slow_tests.py (its docstring). The rest "
        f"took {fast_s:.0f} s there.\n" + "".join(f"{s:7.1f} {node}\n" for s, node in reversed(slow)))
    print(f"{a.out}: {len(slow)} slow tests; the other {len(seconds) - len(slow)} took {fast_s:.0f} s; "
          f"{len(gone)} tests of the logs no longer exist (left out)")


if __name__ == "__main__":
    main()
