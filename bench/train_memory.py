"""Where the learning run's memory goes: resident memory (RSS) after, and its peak during, each phase of
``main_ppo``'s steps, beside the sizes of what the trainer holds.

    .venv/bin/python bench/train_memory.py [--steps 3] [extra hydra overrides ...]

Runs the trainer in this process with the settings of ``examples/learning_run/run.sh`` (read from that
file, seed 0; overrides given here come after them) and wraps its phases: the rollout, the old-logprob
pass, the update and the validation. Before each phase the kernel's peak counter is reset
(``/proc/self/clear_refs``), so each phase's peak is its own. Then prints per step and phase the RSS
before and after and the peak, and what is held: the weights, Adam's state, the KV cache the engine
allocated, the engine's copies of the linear weights (packed or fused), the reference model.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GB = 2 ** 30


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024 / GB
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def learning_run_overrides() -> list[str]:
    """The hydra overrides of ``examples/learning_run/run.sh`` (seed 0), without ``output.dir``."""
    text = (ROOT / "examples" / "learning_run" / "run.sh").read_text()
    command = text[text.index("-m verl_agentic.main_ppo") + len("-m verl_agentic.main_ppo"):]
    args = shlex.split(command.replace("\\\n", " ").replace('"$SEED"', "0"), comments=True)
    return [a for a in args if not a.startswith("output.dir=") and a != "$@"]


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is not None and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def held(trainer) -> dict[str, float]:
    """GB of what the trainer holds: weights, Adam's state, KV cache, the engine's weight copies, the reference."""
    import torch

    from verl_agentic.backends.packed_linear import weight_dtype_of

    b = trainer.backend
    adam = [v for s in trainer.actor.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    # the engine's copies of the linear weights (lm_head included): the fused forward's always, the packed
    # ones' unless they are nn.Linear's own (fp32 without oneDNN); oneDNN tensors report no sizes of their own
    linears = sum(m.weight.numel() for m in b.model.modules() if isinstance(m, torch.nn.Linear))
    copies = 0
    if b._fused is not None:
        copies = linears * weight_dtype_of(b._fused.weight_dtype).itemsize
    elif b._packed is not None and any(f is not None for f in b._packed._forwards):
        copies = b._packed.nbytes
    return {"weights": _tensor_bytes(trainer.model.parameters()) / GB, "adam": _tensor_bytes(adam) / GB,
            "kv_cache": b._cache.nbytes / GB, "engine_weight_copies": copies / GB,
            "ref_model": _tensor_bytes(trainer.ref_model.parameters()) / GB if trainer.ref_model is not None else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="/tmp/va-train-memory")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from verl_agentic.main_rollout import load_config
    from verl_agentic.trainer import PPOTrainer

    rows: list[dict] = []
    step = {"n": 0}

    def watch(name, fn):
        def phase(*a, **kw):
            before = _status("VmRSS")
            _reset_peak()
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                rows.append({"step": step["n"], "phase": name, "rss_before": before, "peak": _status("VmHWM"),
                             "rss_after": _status("VmRSS"), "s": time.perf_counter() - t0})
        return phase

    base = _status("VmRSS")
    overrides = [*learning_run_overrides(), f"trainer.total_steps={args.steps}", f"output.dir={args.out}",
                 "output.quiet=true", *args.overrides]
    trainer = PPOTrainer(load_config(overrides, config_name="ppo"))
    built = _status("VmRSS")
    trainer._rollout = watch("rollout", trainer._rollout)
    trainer._old_logprobs = watch("old_logprobs", trainer._old_logprobs)
    trainer.actor.update = watch("update", trainer.actor.update)
    try:
        for _ in range(args.steps):
            step["n"] += 1
            _reset_peak()
            trainer.train_step()
            peak = max([_status("VmHWM")] + [r["peak"] for r in rows if r["step"] == step["n"]])
            rows.append({"step": step["n"], "phase": "step (after its release)", "rss_before": None,
                         "peak": peak, "rss_after": _status("VmRSS"), "s": None})
            print(json.dumps({"step": step["n"], **{k: round(v, 3) for k, v in held(trainer).items()}}), flush=True)
    finally:
        trainer.close()
    print(f"python + imports: {base:.2f} GB RSS; trainer built (model, engine, optimizer): {built:.2f} GB")
    print(f"{'step':>4} {'phase':<26}{'RSS before':>11}{'peak':>8}{'after':>8}{'s':>7}")
    for r in rows:
        fmt = lambda v, w, p=2: f"{v:>{w}.{p}f}" if v is not None else " " * w  # noqa: E731
        print(f"{r['step']:>4} {r['phase']:<26}{fmt(r['rss_before'], 11)}{fmt(r['peak'], 8)}{fmt(r['rss_after'], 8)}"
              f"{fmt(r['s'], 7, 1)}")


if __name__ == "__main__":
    main()
