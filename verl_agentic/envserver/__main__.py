"""``python -m verl_agentic.envserver``: serve registered tasks' environments over HTTP.

    python -m verl_agentic.envserver --host 127.0.0.1 --port 8100 [--task-config tasks.yaml]
        [--task-module my_pkg.tasks] [--tokenizer MODEL_DIR] [--session-ttl-s 600]
        [--hook-timeout-s 300] [--max-sessions 10000]

It prints ``environment service listening on http://HOST:PORT`` when ready (``--port 0`` picks a
free port) and ends every live session on SIGTERM / SIGINT. ``--task-config`` is a YAML mapping
``{task_type: {key: value}}``: the defaults each task's config starts from (a client's
``task_config`` overrides them key by key).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from verl_agentic.envserver.server import (
    DEFAULT_HOOK_TIMEOUT_S,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_TTL_S,
    EnvService,
    serve,
)
from verl_agentic.interfaces import ConfigError
from verl_agentic.serving import run_service


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m verl_agentic.envserver", description=(
        "Serve registered tasks' environments (start / obs / end) over HTTP for the gen_chat task."))
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8100, help="0 = a free port (printed)")
    p.add_argument("--task-config", default=None, help="YAML {task_type: {key: value}} of config defaults")
    p.add_argument("--task-module", action="extend", nargs="+", default=[], metavar="MODULE",
                   help="import these modules so their tasks register (repeatable)")
    p.add_argument("--tokenizer", default=None, help="a Hugging Face folder whose tokenizer tasks get as ctx.tokenizer")
    p.add_argument("--session-ttl-s", type=float, default=DEFAULT_SESSION_TTL_S,
                   help="end sessions idle this long (their end() runs)")
    p.add_argument("--hook-timeout-s", type=float, default=DEFAULT_HOOK_TIMEOUT_S,
                   help="limit per start / obs / end call (<= 0: none)")
    p.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS, help="429 above this many live sessions")
    return p.parse_args(argv)


def build_service(args: argparse.Namespace) -> EnvService:
    for module in args.task_module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"--task-module {module!r} cannot be imported: {e}") from None
    task_configs = {}
    if args.task_config:
        import yaml

        try:
            with open(args.task_config, encoding="utf-8") as f:
                task_configs = yaml.safe_load(f) or {}
        except OSError as e:
            raise ConfigError(f"--task-config {args.task_config!r}: {e}") from None
        if not isinstance(task_configs, dict) or not all(isinstance(v, dict) for v in task_configs.values()):
            raise ConfigError(f"--task-config {args.task_config!r} must map task types to mappings of keys")
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.session_ttl_s <= 0 or args.max_sessions < 1:
        raise ConfigError("--session-ttl-s must be > 0 and --max-sessions >= 1")
    return EnvService(task_configs=task_configs, tokenizer=tokenizer, session_ttl_s=args.session_ttl_s,
                      hook_timeout_s=args.hook_timeout_s if args.hook_timeout_s > 0 else None,
                      max_sessions=args.max_sessions)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    service: Optional[EnvService] = None

    def start():
        nonlocal service
        service = build_service(args)
        return serve(service, args.host, args.port)

    return run_service("environment service", start,
                       lambda: f"environment service stopped ({service.counts['sessions_ended']} sessions ended)")


if __name__ == "__main__":
    sys.exit(main())
