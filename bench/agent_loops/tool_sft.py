"""A SmolLM2-135M that calls the calculator: a short supervised fine-tune, for the agent-loop bench.

    .venv/bin/python bench/agent_loops/tool_sft.py --out /tmp/smollm2_calls        # ~10 min on 2 cores
    .venv/bin/python bench/agent_loops_vllm.py series --model /tmp/smollm2_calls

SmolLM2-135M calls no tool from a prompt (bench/agent_loops_vllm.py's docstring), so the head-to-head of
``task_agent`` and verl's ``tool_agent`` would compare single-turn episodes. This makes a model that does:
GSM8K *train* problems (never the bench's test problems) written as tool episodes from their own worked
solutions, whose ``<<48/2=24>>`` annotations are the calculator's calls: the assistant calls the
calculator with the first ``--calls`` annotated expressions, one per turn, each answered by its value, then
says ``#### <answer>``. Rendered with the bench's template and tools, trained on the assistant tokens only
(mask 0 on the prompt and the tool replies), AdamW, ``--epochs`` over ``--examples`` problems. Then a greedy
probe on ``--probe`` GSM8K test problems prints how many answers start with a tool call.

The weights are the bench's to use, not a model to learn from: they are tuned to a format, on few
examples, and say nothing about GSM8K.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
TEMPLATE = REPO / "bench" / "agent_loops" / "smollm2_tools.jinja"
ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")


def episode(question: str, solution: str, calls: int) -> list[dict] | None:
    """A GSM8K train row as a tool episode, or None when its solution has no annotated calculation."""
    from agent_loops_vllm import calculator_episode

    from verl_agentic.tasks.gsm8k.answer import ground_truth_from_solution

    found = ANNOTATION.findall(solution)[:calls]
    if not found:
        return None
    answer = ground_truth_from_solution(solution)
    return calculator_episode(question, [(e.strip(), v.strip()) for e, v in found],
                              f"The answer is {answer}.\n#### {answer}")


def tokens_and_mask(tokenizer, messages: list[dict], tools: list[dict]) -> tuple[list[int], list[int]]:
    """The conversation's ids (the template's text tokenized once), and 1 on the tokens of each assistant
    message's own text and its end-of-turn (the template is append-only: each prefix renders as a prefix)."""
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            head = tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
            upto = tokenizer.apply_chat_template(messages[:i + 1], tools=tools, tokenize=False)
            assert text.startswith(upto) and upto.startswith(head), "the template is not append-only"
            spans.append((len(head), len(upto.rstrip("\n"))))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in enc["offset_mapping"]]
    return enc["input_ids"], mask


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--examples", type=int, default=96)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--calls", type=int, default=2, help="calculator calls per episode, at most")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--probe", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_agentic.models.embedded import embedded_model_dir
    from verl_agentic.tasks.gsm8k.texts import INSTRUCTION
    from verl_agentic.tools.calculator import CalculatorTool

    torch.manual_seed(args.seed)
    source = embedded_model_dir(quiet=True)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = TEMPLATE.read_text()
    tools = [CalculatorTool.DEFAULT_SCHEMA]
    model = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32)
    rows = [json.loads(line) for line in (REPO / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()]
    random.Random(args.seed).shuffle(rows)
    data = []
    for row in rows:
        messages = episode(row["question"], row["answer"], args.calls)
        if messages:
            data.append(tokens_and_mask(tokenizer, messages, tools))
        if len(data) == args.examples:
            break
    ids, mask = data[0]
    print(f"{len(data)} episodes, {sum(len(i) for i, _ in data)} tokens, {sum(sum(m) for _, m in data)} trained; "
          f"the first one's trained text: {tokenizer.decode([t for t, m in zip(ids, mask) if m])!r}", flush=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    start = time.time()
    for epoch in range(args.epochs):
        order = list(range(len(data)))
        random.Random(args.seed + epoch).shuffle(order)
        total = 0.0
        for k, i in enumerate(order):
            ids, mask = data[i]
            x = torch.tensor([ids])
            labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask)]])
            loss = model(input_ids=x, labels=labels).loss
            (loss / 8).backward()
            total += loss.item()
            if (k + 1) % 8 == 0 or k + 1 == len(order):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
        print(f"epoch {epoch + 1}: mean loss {total / len(order):.3f} ({time.time() - start:.0f} s)", flush=True)
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)

    test = [json.loads(line) for line in (REPO / "data" / "gsm8k" / "test.jsonl").read_text().splitlines()]
    calls = 0
    for row in test[:args.probe]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"{row['question']}\n{INSTRUCTION}"}],
                                               tools=tools, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
        with torch.no_grad():
            out = model.generate(**prompt, max_new_tokens=48, do_sample=False)
        text = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=False)
        calls += text.lstrip().startswith("<tool_call>")
    print(f"probe: {calls} of {args.probe} greedy answers to GSM8K test problems start with a tool call; "
          f"model in {args.out}", flush=True)


if __name__ == "__main__":
    main()
