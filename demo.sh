#!/usr/bin/env bash
# The README's main command: installs what the demo needs into .venv (host/install.sh), then runs
# host/demo.py: our Z-Image workflow and the stock ComfyUI graph on a real server, on random weights.
#   ./demo.sh [--help]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")" && pwd)
VENV=${SWIFTDIT_VENV:-$ROOT/.venv}
bash "$ROOT/host/install.sh" "$VENV"
# No cd: a relative --output-dir means the caller's folder; the repo root goes on the module path instead.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$VENV/bin/python" -m host.demo "$@"
