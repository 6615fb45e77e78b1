"""A tokenizer's fingerprint: what it renders, encodes and decodes for a fixed set of inputs.

A recording's header keeps the fingerprint of the tokenizer the run used (``tokenizer_probe``). A replay
may then load the same tokenizer folder without ``transformers`` (``replay/tokenizer.py``: the fast
tokenizer and the chat template alone, a second faster to start than ``transformers`` and torch) only when
that light tokenizer gives the very same fingerprint; otherwise it loads it with ``transformers``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

_TOOLS = [{"type": "function", "function": {"name": "python", "description": "Run code.", "parameters": {
    "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
_CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3? Answer after \"####\"."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi ünïcödé 😀  two  spaces"},
     {"role": "assistant", "content": "Hello.\n#### 5"}, {"role": "user", "content": "Are you sure?"}],
    [{"role": "user", "content": "Compute 6*7."},
     {"role": "assistant", "content": "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(6*7)\"}}\n"
                                      "</tool_call>"},
     {"role": "tool", "name": "python", "content": "42"}],
]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()[:16]


def tokenizer_probe(tokenizer: Any, stop_token_ids: list[int] = ()) -> dict:
    """The fingerprint of ``tokenizer`` (a ``transformers`` tokenizer or anything with the same
    ``apply_chat_template`` / ``__call__`` / ``decode``): a digest per probe, an error's type where one
    fails (a template without a tool role)."""
    out: dict[str, str] = {}
    for i, conv in enumerate(_CONVERSATIONS):
        for tools in (None, _TOOLS):
            for gen in (False, True):
                key = f"render{i}{'t' if tools else ''}{'g' if gen else ''}"
                try:
                    text = tokenizer.apply_chat_template(conv, tools=tools, tokenize=False, add_generation_prompt=gen)
                    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
                    out[key] = _digest([text, ids, tokenizer.decode(ids, skip_special_tokens=False)])
                except Exception as e:  # noqa: BLE001 - the same failure is part of the fingerprint
                    out[key] = f"error:{type(e).__name__}"
    ids = list(range(0, 4000, 37)) + list(stop_token_ids)
    out["decode"] = _digest([tokenizer.decode([i], skip_special_tokens=False) for i in ids])
    return out
