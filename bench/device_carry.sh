#!/usr/bin/env bash
# What a device call must carry for the `server` part of bench/device_session.sh, made here (the device reaches no
# registry): ComfyUI v0.3.75's tree as .devcarry/comfyui-0.3.75.tgz and the packages of ComfyUI's requirements that
# the device's image lacks as .whl/ (CPython 3.12 wheels, about 49 MB). Both folders are kept out of git; the call
# names them in `carry` (64 MiB in all with the working tree).
#   bash bench/device_carry.sh [server|peers|fa3 ...]   (several sets: their wheels together in .whl/)
#     server (the default, after tests/run.sh has unpacked the tree into .cache/): the tree and ComfyUI's wheels;
#     peers: the tree and diffusers 0.42.1 in .whl/, for the step benchmarks' peers (both sets pass 64 MiB);
#     fa3: the tree and FlashAttention-3's forward (fa3_fwd) in .whl/, for bench_attention.py --fa3 and the
#     fa3_attention choice; `peers fa3` (about 60 MB) fits a call without .devcarry.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
mkdir -p .devcarry .whl .git/info
for ignored in /.whl/ /.devcarry/; do
    grep -qxF "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
rm -f .whl/*.whl
TREE=.cache/comfyui-0.3.75
[ -f "$TREE/main.py" ] || { echo "device_carry.sh: no $TREE: run tests/run.sh first" >&2; exit 1; }
tar czf .devcarry/comfyui-0.3.75.tgz -C .cache comfyui-0.3.75  # both sets: the text encoders' tokenizer is in it
WHEELS=""
for MODE in "${@:-server}"; do
case $MODE in
    # The versions host/constraints.txt pins where it names them; the rest as the device's Python 3.12 needs.
    server) WHEELS+=" torchsde==0.2.6 trampoline==0.1.2 alembic==1.20.1 Mako==1.4.3 SQLAlchemy==2.1.9 greenlet==3.5.6
                av==19.0.2 kornia==0.9.0 kornia_rs==0.2.0 spandrel==0.4.2 pydantic==2.14.4 pydantic-core==2.50.5
                annotated-types==0.8.0 typing-inspection==0.4.5 pydantic-settings==2.16.3 python-dotenv==1.2.4" ;;
    # diffusers for the step benchmarks; transformers 5.24 and its tokenizers for bench_graph's pipelines (and the
    # text encoders' GPU tests; the device's image has 5.17); the omnivoice package (bench_omnivoice's peer). Not
    # importlib_metadata: with 10.2 beside them, transformers' lazy imports failed on the device (2026-12-05).
    # transformers 5.24 needs a newer huggingface_hub, safetensors and regex than the image's (its lazy imports
    # failed with AutoImageProcessor and HiggsAudioV2TokenizerModel, 2026-12-05); soundfile needs cffi, which the
    # image lacks (transformers imports soundfile where it is installed). torchsde: the tests' in-process ComfyUI
    # oracle imports its samplers.
    peers) WHEELS+=" diffusers==0.42.1 transformers==5.24.0 tokenizers==0.23.3 torchsde==0.2.6 trampoline==0.1.2
                huggingface_hub==1.31.0 hf-xet==1.8.0 click==8.4.2 safetensors==0.8.0 regex==2026.11.19
                omnivoice==0.2.1 pydub==0.25.1 soundfile==0.14.0 cffi==2.0.0 pycparser==2.23" ;;
    # FlashAttention-3's forward for bench_attention.py --fa3 (27 MB: beside the peers' set it passes 64 MiB); its
    # kernels call torch through the stable C shim (aoti_torch_*), built against torch 2.10.
    fa3) WHEELS+=" fa3-fwd==0.0.3" ;;
    *) echo "device_carry.sh: unknown set $MODE (server, peers or fa3)" >&2; exit 2 ;;
esac
done
for wheel in $WHEELS; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$wheel"
done
du -sh .whl .devcarry
