"""``python -m verl_agentic.inspect OUTPUT_DIR [--compare OTHER_DIR] [--out REPORT_DIR] [--serve] [--port N]
[--tokenizer PATH] [--no-drift]``.

See :mod:`verl_agentic.inspect` for what the report shows.
"""

from __future__ import annotations

import argparse
import sys
import time

from verl_agentic.inspect.report import serve, write_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_agentic.inspect",
                                description="Write a self-contained HTML report of a rollout or training output dir.")
    p.add_argument("output_dir", help="a main_rollout dir (trajectories.jsonl) or a main_ppo dir (metrics.jsonl, "
                                      "rollouts/)")
    p.add_argument("--compare", default=None, metavar="OTHER_DIR",
                   help="a second output dir: both runs, their metric deltas and the same prompts side by side")
    p.add_argument("--out", default=None,
                   help="report dir (default: OUTPUT_DIR/report, or OUTPUT_DIR/compare-<other> with --compare)")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer/model folder (default: config.model.path)")
    p.add_argument("--no-drift", action="store_true", help="skip the per-episode token-exactness check")
    p.add_argument("--serve", action="store_true", help="serve the report on 127.0.0.1 after writing it")
    p.add_argument("--port", type=int, default=8000, help="port for --serve (0: any free port)")
    args = p.parse_args(argv)


    t0 = time.perf_counter()
    try:
        index = write_report(args.output_dir, args.out, tokenizer_path=args.tokenizer, drift=not args.no_drift,
                             compare=args.compare)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = index.stat().st_size
    print(f"report written in {time.perf_counter() - t0:.1f}s ({size / 1e6:.2f} MB): {index.resolve()}", flush=True)
    if args.serve:
        serve(index.parent, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
