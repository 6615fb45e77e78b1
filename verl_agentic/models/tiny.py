"""A tiny, randomly initialised Qwen2 (or Llama) model for tests and smoke runs.

The weights are random (nothing is downloaded): the model speaks the real tokenizer's ids
and chat template, so every code path that handles token ids is exercised, but its text is
gibberish. Building takes a few seconds; the result is cached on disk.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from verl_agentic.models.embedded import cache_root

# architecture -> (config class, model class): Qwen2 (biases on q/k/v) and Llama (none: SmolLM2's family)
ARCHITECTURES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}


def _tokenizer_fingerprint(tokenizer_dir: str) -> str:
    """A short hash of the tokenizer folder's files, so that cached models of different
    vocabularies (e.g. Qwen2.5 and Qwen3, which share the folder layout) never collide."""
    digest = hashlib.sha256()
    for path in sorted(Path(tokenizer_dir).iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def make_tiny_model(
    tokenizer_dir: str,
    out_dir: str | None = None,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    architecture: str = "qwen2",
) -> str:
    """Build (or reuse) a tiny random ``Qwen2ForCausalLM`` (or, with ``architecture="llama"``, a
    ``LlamaForCausalLM``) for the tokenizer at ``tokenizer_dir``.

    The model has ``hidden_size`` hidden units, ``num_layers`` layers, 4 attention heads,
    2 key/value heads, an MLP of ``2 * hidden_size``, tied embeddings and a vocabulary of
    ``len(tokenizer)``, initialised with a large std (0.2) so that its greedy output depends
    on the prompt and varies from step to step. Its EOS is ``<|im_end|>`` and its pad token
    ``<|endoftext|>``. Weights are drawn after ``torch.manual_seed(seed)``, so a build is
    reproducible.

    The folder holds the model, the tokenizer and a generation config (so that it loads with
    ``from_pretrained`` like any Hugging Face checkpoint). When ``out_dir`` is None it lives
    in the cache: ``<cache>/tiny-<architecture>-<seed>-<hidden>-<layers>-<tokenizer hash>`` (see
    :func:`verl_agentic.models.embedded.cache_root`).

    A folder that already has a ``config.json`` is reused as is. A build is written to a
    temporary sibling folder and renamed into place, so a concurrent or aborted build never
    leaves a half-written folder behind.

    Returns:
        The model folder's path.
    """
    if architecture not in ARCHITECTURES:
        raise ValueError(f"make_tiny_model: unknown architecture {architecture!r}; known: {sorted(ARCHITECTURES)}")
    config_class, model_class = ARCHITECTURES[architecture]
    if out_dir is None:
        fingerprint = _tokenizer_fingerprint(tokenizer_dir)
        name = f"tiny-{architecture}-{seed}-{hidden_size}-{num_layers}-{fingerprint}"
        out_dir = str(cache_root() / name)
    target = Path(out_dir)
    if (target / "config.json").is_file():
        return out_dir

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        # Ten times the usual 0.02, with which a random model emits the same token whatever
        # the prompt (hiding bugs in padding, positions or caching).
        initializer_range=0.2,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)  # atomic; also replaces an empty folder
        except OSError:
            # Someone else finished first: keep theirs. Anything else is a real conflict.
            if not (target / "config.json").is_file():
                raise FileExistsError(f"{out_dir} exists and is not a model folder") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
