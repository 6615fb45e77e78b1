"""Tokens/s of the same multi-turn GSM8K rollout through the ``hf`` backend and through vLLM.

    .venv/bin/python bench/backends.py                       # starts a vLLM server (scripts/setup_vllm.sh)
    .venv/bin/python bench/backends.py --vllm-url http://127.0.0.1:8000 --concurrency 1,8,32

For each concurrency c (episodes in flight; also the hf batch size and the HTTP requests in flight)
both backends roll out the same max(c, --min-rows) GSM8K test problems: greedy, a verify question
after the first answer (--turns assistant turns of at most --max-new-tokens tokens). Greedy keeps
the work equal: both generate the same tokens (the table shows the share of identical episodes).
tok/s = generated tokens / rollout wall time (model loading and server start excluded). The vLLM
server serves the embedded SmolLM2 in float32, like the hf backend. vLLM on CPU binds its compute
threads itself: by default it keeps one core for its API process (``VLLM_CPU_OMP_THREADS_BIND``,
``--threads-bind`` here).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # va_vllm: the vLLM environment and server process

from va_vllm import add_bench_args, bench_server  # noqa: E402

from verl_agentic.main_rollout import load_config, run  # noqa: E402
from verl_agentic.models.embedded import embedded_model_dir  # noqa: E402


def rollout(backend_args: list[str], rows: int, concurrency: int, args: argparse.Namespace,
            out: Path) -> tuple[float, int, list[list[int]]]:
    """(wall seconds, generated tokens, response ids per episode) of one rollout."""
    cfg = load_config([
        f"model.path={args.model}", f"data.max_samples={rows}", "rollout.n=1", f"rollout.max_turns={args.turns}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=0", "task.gsm8k.feedback=always_verify",
        f"rollout.concurrency={concurrency}", f"rollout.max_batch_size={concurrency}",
        f"rollout.openai.concurrency={concurrency}", "reward.manager=none", "output.quiet=true",
        "output.check_drift=false", f"output.dir={out}", *backend_args])
    t0 = time.perf_counter()
    trajs, summary = run(cfg)
    wall = summary["tasks"]["gsm8k"].get("wall_s") or time.perf_counter() - t0
    errors = [t["error"] for t in trajs if t["error"]]
    if errors:
        raise RuntimeError(f"{len(errors)} episodes failed, e.g. {errors[0]}")
    tokens = sum(t["metrics"].get("generated_tokens", 0) for t in trajs)
    return wall, int(tokens), [t["response_ids"] for t in trajs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated levels (default 1,8,32)")
    p.add_argument("--min-rows", type=int, default=8, help="episodes per level at least (default 8)")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2)")
    add_bench_args(p)
    args = p.parse_args()
    args.model = args.model or str(embedded_model_dir(quiet=True))
    levels = [int(c) for c in args.concurrency.split(",")]

    work = Path(tempfile.mkdtemp(prefix="bench-backends-"))
    server, url = bench_server(args.model, args, work)
    rows_out = []
    try:
        for c in levels:
            rows = max(c, args.min_rows)
            hf_wall, hf_tokens, hf_ids = rollout(["rollout.backend=hf"], rows, c, args, work / f"hf-{c}")
            vl_wall, vl_tokens, vl_ids = rollout(["rollout.backend=openai", f"rollout.openai.base_url={url}"],
                                                 rows, c, args, work / f"vllm-{c}")
            same = sum(a == b for a, b in zip(hf_ids, vl_ids)) / rows
            rows_out.append((c, rows, hf_tokens / hf_wall, vl_tokens / vl_wall, hf_tokens, vl_tokens, same))
            print(f"c={c}: hf {hf_tokens} tok in {hf_wall:.1f} s, vLLM {vl_tokens} tok in {vl_wall:.1f} s",
                  file=sys.stderr)
    finally:
        if server is not None:
            server.stop()

    print(f"multi-turn GSM8K, greedy, {args.turns} turns x {args.max_new_tokens} tokens, model {Path(args.model).name}")
    header = ("concurrency", "episodes", "hf tok/s", "vLLM tok/s", "vLLM/hf", "hf tokens", "vLLM tokens",
              "same episodes")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for c, rows, hf_tps, vl_tps, hf_tokens, vl_tokens, same in rows_out:
        print(f"{c} | {rows} | {hf_tps:.1f} | {vl_tps:.1f} | {vl_tps / hf_tps:.2f} | {hf_tokens} | {vl_tokens} | "
              f"{same:.2f}")


if __name__ == "__main__":
    main()
