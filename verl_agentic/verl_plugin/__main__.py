"""``python -m verl_agentic.verl_plugin --patches``: the plugin's patches of verl and vLLM, and what this process did with each.

Run it in the environment (and with the ``VERL_PLATFORM`` / ``VERL_AGENTIC_*`` settings) of the run to
check: importing the plugin applies what applies there (``upstream.install``), then the registry is printed.
"""

from __future__ import annotations

import argparse

from verl_agentic.verl_plugin import upstream


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_agentic.verl_plugin", description=__doc__.splitlines()[0])
    parser.add_argument("--patches", action="store_true", help="list every patch, its mode, versions, switch, "
                        "guarding tests, and whether this process applied it")
    args = parser.parse_args(argv)
    if not args.patches:
        parser.print_help()
        return 2
    print(upstream.listing())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
