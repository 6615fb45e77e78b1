"""A tokenizer folder read without ``transformers``: the fast tokenizer (``tokenizer.json``, through the
``tokenizers`` library) and the chat template (rendered by jinja2 the way ``transformers`` renders it:
a sandboxed environment with ``trim_blocks``, ``lstrip_blocks``, loop controls, the ``tojson`` filter and
``raise_exception`` / ``strftime_now``; the special tokens passed to the template).

Importing ``transformers`` imports torch: seconds before a replay can start. ``LightTokenizer`` starts
in a fraction of that and serves what a replay asks of a tokenizer (``apply_chat_template`` without
tokenizing, ``__call__`` for ids, ``decode``). ``replay`` uses it only when its fingerprint
(``record/probe.py``) equals the recorded tokenizer's, so a difference between the two can never pass
for a difference in the task.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token_text(value: Any) -> Optional[str]:
    if isinstance(value, dict):  # an AddedToken as saved: {"content": ..., ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


class LightTokenizer:
    """See the module docstring. Raises ``FileNotFoundError`` / ``ValueError`` for a folder it cannot
    serve (no ``tokenizer.json``, no chat template): the caller then loads it with ``transformers``."""

    def __init__(self, path: str | Path):
        # here, not at the top: the fast path of a replay, and nothing else, needs them
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        folder = Path(path)
        self.name_or_path = str(path)
        if not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{folder}: no tokenizer.json")
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = {}
        if (folder / "tokenizer_config.json").exists():
            config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        special = {}
        if (folder / "special_tokens_map.json").exists():
            special = json.loads((folder / "special_tokens_map.json").read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        if isinstance(template, list):  # named templates: the default one
            template = {t.get("name"): t.get("template") for t in template}.get("default")
        if not isinstance(template, str) or not template:
            raise ValueError(f"{folder}: no chat template")
        self.chat_template = template
        self.special_tokens = {k: v for k in _SPECIAL
                               if (v := _token_text(config.get(k, special.get(k)))) is not None}
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))

        class Generation(jinja2.ext.Extension):  # transformers' {% generation %} block, rendered as its body
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

            def _body(self, caller):
                return caller()

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(template)

    def apply_chat_template(self, messages: list[dict], tools: Optional[list[dict]] = None, tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str:
        if tokenize:
            raise ValueError("LightTokenizer.apply_chat_template renders text only (tokenize=False)")
        return self._template.render(messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt, **{**self.special_tokens, **kwargs})

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self._tok.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:  # transformers' clean_up_tokenization
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text
