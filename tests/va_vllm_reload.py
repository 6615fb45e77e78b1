"""Run in vLLM's environment (``.venv-vllm``): the in-place weight sync on a live vLLM CPU engine.

``python tests/va_vllm_reload.py MODEL_DIR BUCKET_MB`` loads MODEL_DIR in vLLM's offline engine
(float32, in-process), then pushes weights through ``verl_plugin/cpu/vllm_worker.InPlaceReload``
in buckets of BUCKET_MB, as verl's sync does, and prints one JSON object:

- ``perturbed``: greedy logprobs after a push of randomly perturbed weights, minus a Hugging Face
  forward of the same perturbed model (``max_abs_dlogprob``); whether the tokens changed;
- ``restored``: after pushing the original weights back, whether the greedy tokens and logprobs
  are the original ones;
- ``missing``: the error of a push that lacks one parameter;
- ``packed``: the linear layers that compute with vLLM's packed CPU kernel (their ``cpu_linear`` is not
  ``F.linear`` and their ``weight`` was released), before and after a push: the reload keeps them (the
  speed of the two paths: ``bench/vllm_weight_sync.py``; a timing here failed on a loaded machine);
- the records ``finish()`` returned;
- two negative controls, each a push of the perturbed weights that leaves out one of the sync's two
  tied-weight rules (the originals are pushed back, with both rules, after each):
  ``control_no_repack``: the tied ``lm_head`` is not repacked after the push (``InPlaceReload`` without
  its last step): the greedy logprobs' largest distance from the Hugging Face forward of the perturbed
  model; ``control_alias_sent``: the tied alias ``lm_head.weight`` is sent too, in its own last bucket,
  as verl's own adapter sends the state dict (the embedding arrives in the first): the push's record or
  error, and the same distance.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: collective_rpc runs here
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VERL_PLATFORM", "cpu")  # verl_agentic's CPU mode: verl finds vllm-cpu as "vllm"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9707, 11, 1879, 0, 374], [504, 1132, 2831, 28], [42, 43, 44]]


def buckets(state: dict, bucket_mb: int) -> list[list]:
    out, current, size = [], [], 0
    for name, tensor in state.items():
        if current and size + tensor.nbytes > bucket_mb << 20:
            out.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += tensor.nbytes
    out.append(current)
    return out


def main(model_dir: str, bucket_mb: int) -> dict:
    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=1024, seed=0)
    greedy = SamplingParams(temperature=0, max_tokens=32, logprobs=0)

    def generate():
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), [next(iter(d.values())).logprob for d in o.outputs[0].logprobs])
                for o in outs]

    def packed() -> dict:
        def probe(worker):
            layers = [(name, m) for name, m in worker.model_runner.model.named_modules() if hasattr(m, "cpu_linear")]
            fast = [name for name, m in layers
                    if m.cpu_linear is not torch.nn.functional.linear and m.weight.numel() == 0]
            return {"layers": len(layers), "packed": sorted(fast)}

        return llm.collective_rpc(probe)[0]

    def push(state: dict, send_alias: bool = False, repack_tied: bool = True) -> dict:
        """``state`` into the live engine in ``bucket_mb`` buckets, as the plugin's sync does; the two flags
        leave out one of its tied-weight rules (the negative controls)."""
        sent = state if send_alias else {k: v for k, v in state.items() if k != "lm_head.weight"}  # the tied alias
        parts = buckets(sent, bucket_mb)

        def load(worker):
            from verl_agentic.verl_plugin.cpu.vllm_worker import InPlaceReload

            class NoRepack(InPlaceReload):  # the reload without its repack of the tied layers
                def repack_tied(self) -> None:
                    pass

            runner = worker.model_runner
            reload = (InPlaceReload if repack_tied else NoRepack)(runner.model, runner.vllm_config.model_config)
            reload.begin()
            try:
                for part in parts:
                    reload.load(part)
            except BaseException:
                reload.abort()
                raise
            try:
                return reload.finish()
            except Exception as e:  # the record of the failure
                return {"error": f"{type(e).__name__}: {e}"}

        return llm.collective_rpc(load)[0]

    result: dict = {"packed": {"before": packed()}}
    base = generate()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in hf.state_dict().items()}
    torch.manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    perturbed = {k: v.clone() for k, v in hf.state_dict().items()}

    def gap_to_hf(outputs) -> float:
        """The largest |logprob| distance of vLLM's greedy tokens from the perturbed model's HF forward."""
        worst = 0.0
        for prompt, (tokens, logprobs) in zip(PROMPTS, outputs):
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
            ref = logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
            worst = max(worst, float((ref - torch.tensor(logprobs)).abs().max()))
        return worst

    result["push_perturbed"] = push(perturbed)
    after = generate()
    result["perturbed"] = {"max_abs_dlogprob": gap_to_hf(after),
                           "tokens_changed": [t for t, _ in after] != [t for t, _ in base]}
    result["packed"]["after_push"] = packed()
    result["push_restored"] = push(original)
    back = generate()
    result["restored"] = {"same_tokens": [t for t, _ in back] == [t for t, _ in base],
                          "max_abs_dlogprob": max(abs(a - b) for x, y in zip(back, base) for a, b in zip(x[1], y[1]))}
    result["missing"] = push({k: v for k, v in original.items() if k != "model.norm.weight"})

    # negative controls: the perturbed push without one tied-weight rule, from the original weights
    for name, flags in (("control_no_repack", {"repack_tied": False}), ("control_alias_sent", {"send_alias": True})):
        push(original)
        try:
            record = push(perturbed, **flags)
        except Exception as e:  # the sync itself failed: that is the control's reading
            record = {"error": f"{type(e).__name__}: {e}"[:500]}
        result[name] = {"push": record, "max_abs_dlogprob": gap_to_hf(generate())}
    push(original)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
