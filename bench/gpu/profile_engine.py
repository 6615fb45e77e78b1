"""Where a decode step's time goes on a GPU: our engine vs transformers' own generate, fp32 vs bf16.

    PYTHONPATH=. python bench/gpu/profile_engine.py TOKENIZER_AND_CONFIG_DIR [cuda|cpu] [NEW_TOKENS]

Builds SmolLM2-135M's architecture (the config in the folder) with random weights (the same work per step as
the real model, no weights to carry), decodes one request at a time, prints tokens/s, the engine's counters and
torch.profiler's top ops, then times transformers' generate on the same model. Results: bench/RESULTS.md.
"""
import asyncio, sys, time, torch
from torch.profiler import profile, ProfilerActivity
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl_agentic.backends.hf import HFBackend
from verl_agentic.interfaces import SamplingParams

from transformers import AutoConfig
src, dev = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "cuda")
path = "/tmp/smolrand"  # SmolLM2-135M's architecture (its config), random weights: the same work per step
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src)).save_pretrained(path)
tok = AutoTokenizer.from_pretrained(src); tok.save_pretrained(path)
import shutil; shutil.copy(f"{src}/generation_config.json", path)
ids = tok.apply_chat_template([{"role": "user", "content": "Count to twenty."}], add_generation_prompt=True,
                              tokenize=True, return_dict=True)["input_ids"]
for dtype in ("float32", "bfloat16"):
    eng = HFBackend.from_pretrained(path, dtype=dtype, device=dev, seed=0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=int(sys.argv[3]) if len(sys.argv) > 3 else 64, seed=1, stop_token_ids=None)
    async def one():
        return await eng.generate(ids, sp)
    async def go(n):
        outs = []
        for _ in range(n):
            outs.append(await eng.generate(ids, sp))
        return outs
    asyncio.run(go(1))
    t0 = time.perf_counter(); outs = asyncio.run(go(3)); dt = time.perf_counter() - t0
    n = sum(len(o.token_ids) for o in outs)
    print(f"{dtype} engine one-at-a-time: {n/dt:.1f} tok/s; busy {eng.stats()}")
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])) as prof:
        asyncio.run(go(1))
    ka = prof.key_averages()
    print(ka.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=45))
    if dev == "cuda":
        print(ka.table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=45))
    asyncio.run(eng.close())
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(dev).eval()
    x = torch.tensor([ids], device=dev)
    m.generate(x, max_new_tokens=8, do_sample=False)
    (torch.cuda.synchronize() if dev == "cuda" else None); t0 = time.perf_counter()
    out = m.generate(x, max_new_tokens=64, min_new_tokens=64, do_sample=True)
    (torch.cuda.synchronize() if dev == "cuda" else None); dt = time.perf_counter() - t0
    print(f"{dtype} transformers generate: {(out.shape[1]-x.shape[1])/dt:.1f} tok/s")
    del m, eng
