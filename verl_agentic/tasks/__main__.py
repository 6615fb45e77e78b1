"""``python -m verl_agentic.tasks``: list the registered tasks, where they come from, and their data helpers.

``python -m verl_agentic.tasks new NAME [--dir DIR]``: write a new task's folder (``tasks/scaffold.py``).
``--imports MODULE`` (repeatable) lists the tasks your modules register too.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.registry import import_modules
from verl_agentic.tasks import TASKS
from verl_agentic.tasks.data import PREPROCESS_DATASET, PROMPT_GENERATOR
from verl_agentic.tasks.scaffold import new_task, next_steps


def list_tasks() -> None:
    names = TASKS.names()
    print(f"{len(names)} registered task(s):")
    for name in names:
        spec = TASKS.get(name)
        extras = [label for label, reg in (("prompt", PROMPT_GENERATOR), ("preprocess", PREPROCESS_DATASET))
                  if name in reg]
        print(f"  {name:<16} loop={spec.loop.__name__:<16} data=[{', '.join(extras) or '-'}]  {TASKS.source(name)}")


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_agentic.tasks",
                                 description="List the registered tasks, or write a new task's folder.")
    ap.add_argument("--imports", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (its tasks are listed too); repeatable")
    sub = ap.add_subparsers(dest="command")
    new = sub.add_parser("new", help="write NAME/: a task, its scorer, its data preprocessing and a test")
    new.add_argument("name", help="the task's name, also its package's: lowercase letters, digits and _")
    new.add_argument("--dir", default=".", help="the folder to write NAME/ in (default: here)")
    args = ap.parse_args(argv)
    try:
        import_modules(args.imports, "--imports")
        if args.command == "new":
            folder = new_task(args.name, Path(args.dir))
            print(f"wrote {folder}/: {', '.join(sorted(p.name for p in folder.iterdir()))}")
            print(f"next, from {Path(args.dir).resolve()}:\n{next_steps(args.name)}")
        else:
            list_tasks()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
