#!/usr/bin/env bash
# The README's main command: installs what the demo needs into .venv (host/install.sh), then runs
# host/demo.py: our Z-Image workflow and the stock ComfyUI graph on a real server, on random weights.
#   ./demo.sh [--help]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")" && pwd)
VENV=${SWIFTDIT_VENV:-$ROOT/.venv}
bash "$ROOT/host/install.sh" "$VENV"
# No cd: a relative --output-dir means the caller's folder. -I: neither that folder nor PYTHONPATH goes ahead of the
# venv's packages; the repo root goes after them (its kernels/ must never stand for Hugging Face's `kernels`).
exec "$VENV/bin/python" -I -c 'import sys; sys.path.append(sys.argv.pop(1)); from host.demo import main; sys.exit(main())' \
    "$ROOT" "$@"
