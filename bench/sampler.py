"""The hf backend's per-row sampler: Gumbel-max vs ``torch.multinomial`` over the softmax, same logits.

    .venv/bin/python bench/sampler.py            # --vocab 49152 --rows 32 --repeats 50

Both draw one token per row from ``softmax(logits / T)`` with the row's own seeded generator (what the
backend does for every sampled row at every decode step), without and with top-p filtering. Prints
microseconds per row for each and the ratio multinomial / Gumbel-max, and checks that both samplers
follow the same distribution (the empirical frequencies of 20,000 draws over a small vocabulary).
"""

from __future__ import annotations

import argparse
import time

import torch

from verl_agentic.backends.sampling import filter_logits, gumbel_max


def multinomial(logits: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(logits.softmax(-1), 1, generator=generator)[0])


def per_row_us(sampler, logits: torch.Tensor, top_p: float, repeats: int) -> float:
    generators = [torch.Generator().manual_seed(i) for i in range(logits.shape[0])]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i, g in enumerate(generators):
            sampler(filter_logits(logits[i], -1, top_p), g)
        best = min(best, time.perf_counter() - t0)
    return 1e6 * best / logits.shape[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=49152)  # SmolLM2's
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--repeats", type=int, default=50)
    a = p.parse_args()
    logits = torch.randn(a.rows, a.vocab) * 3
    print(f"vocab {a.vocab}, {a.rows} rows, torch threads {torch.get_num_threads()}")
    print("top_p | multinomial us/row | gumbel-max us/row | multinomial / gumbel-max")
    for top_p in (1.0, 0.95):
        m = per_row_us(multinomial, logits, top_p, a.repeats)
        g = per_row_us(gumbel_max, logits, top_p, a.repeats)
        print(f"{top_p} | {m:.1f} | {g:.1f} | {m / g:.2f}")
    small = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])
    gen_m, gen_g = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    draws = 20_000
    freq_m = torch.bincount(torch.tensor([multinomial(small, gen_m) for _ in range(draws)]), minlength=5) / draws
    freq_g = torch.bincount(torch.tensor([gumbel_max(small, gen_g) for _ in range(draws)]), minlength=5) / draws
    print(f"softmax {[round(x, 3) for x in small.softmax(-1).tolist()]}")
    print(f"multinomial frequencies {[round(x, 3) for x in freq_m.tolist()]}")
    print(f"gumbel-max frequencies  {[round(x, 3) for x in freq_g.tolist()]}")


if __name__ == "__main__":
    main()
