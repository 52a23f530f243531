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
# A set of packages in a folder of its own (not the venv's), made again when its list changes; a test puts it ahead of
# the venv's packages: the newest transformers and its `kernels` (one test server, as a ComfyUI with them has them),
# and an older transformers, the GPU image's (the text encoders' tests run under it).
packages_folder() {  # folder, requirements file
    local hash
    hash=$(sha256sum "$2" | cut -d' ' -f1)
    if [ "$(cat "$1/.stamp" 2>/dev/null || true)" != "$hash" ]; then
        rm -rf "$1"
        "${PIP[@]}" --no-deps --target "$1" -r "$2"
        echo "$hash" > "$1/.stamp"
    fi
}
packages_folder "$VENV/newest-transformers" "$ROOT/tests/newest_transformers.txt"
packages_folder "$VENV/older-transformers" "$ROOT/tests/older_transformers.txt"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"
