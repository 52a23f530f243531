#!/usr/bin/env bash
# The README's test command: host/install.sh makes the venv (pinned CPU torch, ComfyUI's runtime, the
# ComfyUI v0.3.75 tree: oracle for noise, sigmas, samplers and the tokenizer), then the test oracles go in
# and pytest runs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SWIFTDIT_VENV:-$ROOT/.venv}
bash "$ROOT/host/install.sh" "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# The host's tested versions (host/constraints.txt) hold for the oracles too: one transformers for the demo and
# the tests, and the host's CPU torch stays.
"${PIP[@]}" -c "$ROOT/host/constraints.txt" -r "$ROOT/tests/requirements.txt"
# comfy-kitchen's wheel declares a CUDA torch; its eager backend (our oracle) needs none of it.
"${PIP[@]}" --no-deps comfy-kitchen==0.2.40
# OmniVoice's package (the oracle of tests/families/test_omnivoice.py): its torchaudio has no build for our torch,
# and the test stands a module in for it (used only to resample reference audio).
"${PIP[@]}" -c "$ROOT/host/constraints.txt" --no-deps omnivoice==0.2.1
# The newest transformers and its `kernels`, in a folder of their own (not the venv's): one test server puts it
# ahead of the venv's packages, as a ComfyUI with the newest transformers has them.
NEWEST="$VENV/newest-transformers"
NEWEST_HASH=$(sha256sum "$ROOT/tests/newest_transformers.txt" | cut -d' ' -f1)
if [ "$(cat "$NEWEST/.stamp" 2>/dev/null || true)" != "$NEWEST_HASH" ]; then
    rm -rf "$NEWEST"
    "${PIP[@]}" --no-deps --target "$NEWEST" -r "$ROOT/tests/newest_transformers.txt"
    echo "$NEWEST_HASH" > "$NEWEST/.stamp"
fi
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"
