"""What the in-place weight sync keeps: vLLM's packed CPU kernels, against the plain ``F.linear`` path.

    .venv/bin/python bench/vllm_weight_sync.py            # both variants, in vLLM's environment
    .venv/bin/python bench/vllm_weight_sync.py --dtype bfloat16 --bucket-mb 256

verl's weight sync cannot reload vLLM's packed CPU layers (they keep no weight). Two ways past it:

- ``packed`` (what ships, ``verl_plugin/cpu/vllm_worker.py``): vLLM keeps its packed kernels, and
  each sync goes through vLLM's in-place reload, which repacks every layer;
- ``plain``: every linear layer keeps its weight and runs ``torch.nn.functional.linear`` (vLLM's
  ``dispatch_cpu_unquantized_gemm`` replaced before the model loads), so a sync is a plain
  ``load_weights``.

Each variant runs in its own process (vLLM's offline engine, in-process, on the embedded SmolLM2):
decode tok/s of 16 requests x 64 new tokens (greedy, EOS ignored) before and after a sync of the
model's own weights in buckets of --bucket-mb, and the sync's time. Prints a table with the ratio
packed / plain; ``--variant`` runs one variant and prints its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(variant: str, model_dir: str, dtype: str, bucket_mb: int, repeats: int) -> dict:
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_TARGET_DEVICE="cpu",
                      VERL_PLATFORM="cpu")
    import torch
    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams

    if variant == "plain":
        import vllm.model_executor.layers.utils as layer_utils

        def plain_linear(layer, remove_weight):  # keep the weight, no packing
            layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

        layer_utils.dispatch_cpu_unquantized_gemm = plain_linear

    llm = LLM(model=model_dir, dtype=dtype, enforce_eager=True, max_model_len=1024, seed=0)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    prompts = [{"prompt_token_ids": [1 + i, 2, 3, 4]} for i in range(16)]

    def tokens_per_s() -> float:
        llm.generate(prompts, params, use_tqdm=False)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
        return 16 * 64 / best

    state = {k: v.float() for k, v in load_file(str(Path(model_dir) / "model.safetensors")).items()
             if k != "lm_head.weight"}
    sys.path.insert(0, str(REPO / "tests"))  # va_vllm_reload: the buckets the offline reload test pushes
    from va_vllm_reload import buckets

    parts = buckets(state, bucket_mb)

    def sync(worker) -> float:
        start = time.perf_counter()
        model = worker.model_runner.model
        if variant == "packed":
            from verl_agentic.verl_plugin.cpu.vllm_worker import InPlaceReload

            reload = InPlaceReload(model, worker.model_runner.vllm_config.model_config)
            reload.begin()
            for part in parts:
                reload.load(part)
            reload.finish()
        else:
            for part in parts:
                model.load_weights(part)
        return time.perf_counter() - start

    before = tokens_per_s()
    sync_s = llm.collective_rpc(sync)[0]
    return {"variant": variant, "tok_s_before": round(before, 1), "tok_s_after_sync": round(tokens_per_s(), 1),
            "sync_s": round(sync_s, 2), "buckets": len(parts)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="float32", help="vLLM's dtype (default float32, as the CPU launch script)")
    p.add_argument("--bucket-mb", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="timed generations per measurement (the fastest counts)")
    p.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2)")
    p.add_argument("--variant", choices=("packed", "plain"), help="run one variant here and print its JSON")
    args = p.parse_args()
    if args.model is None:
        sys.path.insert(0, str(REPO))
        from verl_agentic.models.embedded import embedded_model_dir

        args.model = str(embedded_model_dir(quiet=True))
    if args.variant:
        print(json.dumps(measure(args.variant, args.model, args.dtype, args.bucket_mb, args.repeats)))
        return
    setup = subprocess.run(["bash", str(REPO / "scripts" / "setup_vllm.sh")], capture_output=True, text=True, check=True)
    python = setup.stdout.strip().splitlines()[-1]
    rows = []
    for variant in ("packed", "plain"):
        out = subprocess.run([python, __file__, "--variant", variant, "--model", args.model, "--dtype", args.dtype,
                              "--bucket-mb", str(args.bucket_mb), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if out.returncode != 0:
            sys.exit(f"{variant} failed:\n{out.stderr[-4000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"vLLM {args.dtype}, {Path(args.model).name}, 16 x 64 tokens, sync in {rows[0]['buckets']} buckets "
          f"of {args.bucket_mb} MB")
    print("| variant | tok/s before | tok/s after sync | sync s |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['variant']} | {r['tok_s_before']} | {r['tok_s_after_sync']} | {r['sync_s']} |")
    packed, plain = rows
    print(f"packed / plain after a sync: {packed['tok_s_after_sync'] / plain['tok_s_after_sync']:.2f}x tok/s")


if __name__ == "__main__":
    main()
