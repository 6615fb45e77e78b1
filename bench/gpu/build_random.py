"""SmolLM2-135M's architecture with random weights: python bench/gpu/build_random.py CONFIG_AND_TOKENIZER_DIR OUT_DIR

The same work per step as the real model, with nothing to carry but the config and the tokenizer (the device
machine has no network). Its text is gibberish; token exactness and speed do not depend on the weights.
"""
import shutil, sys, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src)).save_pretrained(dst)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
print("built", dst)
