#!/usr/bin/env bash
# The README's test command: makes a venv with pinned CPU torch and the test oracles, unpacks the
# ComfyUI v0.3.75 tree (oracle for noise, sigmas, samplers and the tokenizer), then runs pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SWIFTDIT_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==2.13.0\n' > "$CONSTRAINTS"
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -c "$CONSTRAINTS" -r "$ROOT/tests/requirements.txt"
# comfy-kitchen's wheel declares a CUDA torch; its eager backend (our oracle) needs none of it.
"${PIP[@]}" --no-deps comfy-kitchen==0.2.40
# The ComfyUI test host's runtime (tests/host; reference/comfyui_host.md section 2), in the same venv. torchvision
# is a constraint too: unpinned spandrel/kornia otherwise pull a newer one that replaces our CPU torch. A stamp of
# the requirement files skips pip when nothing changed (a no-op pip run still costs about 10 s).
printf 'torchvision==0.28.0\n' >> "$CONSTRAINTS"
HOST_STAMP="$VENV/.swiftdit-host-requirements"
HOST_HASH=$(cat "$ROOT/host/requirements.txt" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$HOST_STAMP" 2>/dev/null || true)" != "$HOST_HASH" ]; then
    "${PIP[@]}" -c "$CONSTRAINTS" -r "$ROOT/host/requirements.txt"
    echo "$HOST_HASH" > "$HOST_STAMP"
fi
"$VENV/bin/python" "$ROOT/tests/comfyui_tree.py" "$ROOT/.cache/comfyui-0.3.75"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"
