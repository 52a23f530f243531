#!/usr/bin/env bash
# The README's test command: host/install.sh makes the venv (pinned CPU torch, ComfyUI's runtime, the
# ComfyUI v0.3.75 tree: oracle for noise, sigmas, samplers and the tokenizer), then the test oracles go in
# and pytest runs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SWIFTDIT_VENV:-$ROOT/.venv}
bash "$ROOT/host/install.sh" "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# host/install.sh wrote the torch/torchvision pins: the oracles must not replace the host's CPU torch.
"${PIP[@]}" -c "$VENV/.swiftdit-constraints.txt" -r "$ROOT/tests/requirements.txt"
# comfy-kitchen's wheel declares a CUDA torch; its eager backend (our oracle) needs none of it.
"${PIP[@]}" --no-deps comfy-kitchen==0.2.40
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"
