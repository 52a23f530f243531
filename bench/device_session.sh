#!/usr/bin/env bash
# One device call does a whole session's GPU work (the device is lent by the minute and each start costs minutes):
# GPU tests, then the benchmarks, each with its own time cap, logs to $OUT (or ./device_out).
# Usage on the device: bash bench/device_session.sh [part ...]
#   parts: tests stream_tests quant_tests z_step streaming stream_trace linears quantizers quantizer_shapes gemm_sweep
#          klein qkv hopper_tests hopper_only linears_triton shapes ncu energy carry_tests one_pass turned hidden
#          attention_fp8 attention server node_path krea2 graph h3
#          text_encoders omnivoice ltx25 first_step attention_first_calls parallel fp8_products gate_kernels load
#          video_decode pick ltx25_clip h3_clip save_image image_decode krea2_lengths rows_norm_rope
#          gated text_replay attention_fa3
#   parallel (a kind with several GPUs, the peers' carry for diffusers' random models): the NCCL tests, then H3's and
#     LTX-2.5's steps on 1, 2 and 4 GPUs (bench_sequence_parallel.py; LAYERS cuts the models, 12 by default)
#   The step benchmarks' peers (z_step, klein, krea2, h3) need diffusers: `bash bench/device_carry.sh peers` puts its wheel
#     alone in .whl/ (the server's wheels and diffusers' together pass the call's 64 MiB).
#   server: a real ComfyUI v0.3.75 server on the GPU with ComfyUI's defaults (tests/host/test_gpu_server.py). The
#     device has no ComfyUI: `bash bench/device_carry.sh` makes its tree (.devcarry/) and the wheels of what it lacks
#     of ComfyUI's requirements (.whl/); the call carries both.
#   VARIANTS: extra step_variants switches for z_step and klein (e.g. VARIANTS="--variant-group-m 16")
set -u -o pipefail
export OUT=${OUT:-device_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  rm -rf /tmp/site  # a warm machine keeps the last call's packages
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
  # diffusers imports peft where it is installed, and the image's peft failed importing the carried transformers'
  # models; the peers use no LoRA.
  if ls .whl/diffusers-*.whl >/dev/null 2>&1; then python3 -m pip uninstall -q -y peft 2>/dev/null; fi
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
# What the image has beside the carried wheels, and whether the peers import (their lazy imports hide the cause).
{ python3 -m pip list 2>/dev/null; if [ -d /tmp/site/transformers ]; then
    python3 -c "import transformers, diffusers; from transformers import AutoImageProcessor" 2>&1 | tail -n 30; fi
} > "$OUT/packages.log"
parts=${*:-tests z_step streaming}
stamped() { python3 -u -c "import sys, time; [print(f'{time.time():.2f}', l, end='', flush=True) for l in sys.stdin]"; }
# ComfyUI's tree (the server parts; the text encoders' GPU tests read its tokenizer), where the call carried it.
if [ -f .devcarry/comfyui-0.3.75.tgz ] && [ ! -d .cache/comfyui-0.3.75 ]; then
  mkdir -p .cache && tar xzf .devcarry/comfyui-0.3.75.tgz -C .cache
fi
# The real-size files of the server parts and of the whole-graph bench do not fit the device's disk together
# (64 GB): each part drops the other's before it writes its own.
make_room_for() {
  case $1 in
    server|node_path) rm -rf .cache/bench_graph ;;
    graph) rm -rf .cache/models
           # The peers' diffusers copies (Krea 2's about 34 GB) need the room of the files only ours read.
           if [ "${SIDE:-ours}" = peers ]; then rm -rf .cache/bench_graph; fi ;;
  esac
}
# A part's time cap: CAP_<part> where set (e.g. CAP_ltx25=200), else the part's own.
cap() { local name="CAP_$part"; echo "${!name:-$1}"; }
for part in $parts; do
  start=$(date +%s)
  make_room_for "$part"
  # The card's power, clocks and throttle reasons every 250 ms (a graphed step runs at its power limit: clocks drop).
  nvidia-smi --query-gpu=timestamp,power.draw,power.limit,clocks.sm,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader -lms 250 > "$OUT/power_$part.csv" 2>/dev/null & sampler=$!
  case $part in
    # Two parts, each with its own cap: the streaming and family tests build and compile several small models.
    # tests: five pytest processes side by side (building the Hopper kernels one process at a time takes over 300 s).
    tests) gpu_tests() { timeout 290 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --durations=5 \
                           --continue-on-collection-errors "$@"; }
           hopper=tests/kernels/test_int8_linear_hopper.py
           gpu_tests $hopper -k "not turned and not hidden" > "$OUT/tests_hopper.log" 2>&1 &
           gpu_tests $hopper -k "turned or hidden" > "$OUT/tests_hopper_turned.log" 2>&1 &
           gpu_tests tests/kernels --ignore=$hopper -k "quant or rounding or qkv" > "$OUT/tests_quant.log" 2>&1 &
           gpu_tests tests/kernels --ignore=$hopper -k "not (quant or rounding or qkv)" > "$OUT/tests_kernels.log" 2>&1 &
           gpu_tests tests/dit_core --ignore=tests/dit_core/test_streaming.py --ignore=tests/dit_core/test_builds.py \
             > "$OUT/tests_dit_core.log" 2>&1 &  # test_builds: part first_step (fresh processes that build all)
           wait; tail -n 2 "$OUT"/tests_*.log ;;
    stream_tests) timeout 300 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --durations=10 \
             --continue-on-collection-errors \
             tests/dit_core/test_streaming.py tests/families ;;
    z_step) timeout 260 python3 bench/bench_z_image_step.py --profile --variant-triton-gemm ${VARIANTS:-} ;;
    quant_tests) timeout 240 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_int8_quant.py tests/kernels/test_int8_linear.py tests/dit_core/test_block_gpu.py ;;
    streaming) timeout 240 python3 bench/bench_streaming.py --steps 3 ;;
    stream_trace) timeout 240 sh -c 'for p in 0 25; do python3 bench/bench_streaming.py --only z_image --trace $p --steps 3; done' ;;
    linears) timeout 150 python3 tests/kernels/bench_int8_linear.py --runs 30 ;;
    shapes) timeout 200 python3 bench/bench_linear_shapes.py ;;
    linears_triton) timeout 150 python3 tests/kernels/bench_int8_linear.py --runs 30 --triton-gemm ;;
    hopper_only) timeout 150 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_int8_linear_hopper.py ;;
    hopper_tests) timeout 320 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_int8_linear_hopper.py \
           tests/kernels/test_int8_linear.py tests/kernels/test_qkv_rope_linear.py tests/dit_core/test_block_gpu.py ;;
    qkv) timeout 240 sh -c 'python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_qkv_rope_linear.py &&
           python3 tests/kernels/bench_int8_linear.py --runs 30 --qkv' ;;
    quantizers) timeout 200 python3 tests/kernels/bench_int8_linear.py --runs 30 --quantizers ;;
    quantizer_shapes) timeout 200 python3 bench/bench_quantizer_shapes.py ;;
    one_pass) timeout 150 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_int8_quant.py \
                tests/kernels/test_int8_quant_hopper.py -k "one_pass or plain"
              timeout 150 python3 bench/bench_quantizer_shapes.py --one-pass ;;
    turned) timeout 240 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_int8_quant_turned.py \
              tests/kernels/test_int8_linear_hopper.py tests/dit_core/test_block_gpu.py -k "turned or attention_output \
              or fused_qkv or block or step"
            timeout 120 python3 bench/bench_quantizer_shapes.py --turned ;;
    gated) timeout 150 python3 bench/bench_quantizer_shapes.py --gated ;;
    hidden) timeout 240 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_int8_quant_turned.py \
              tests/kernels/test_int8_linear_hopper.py tests/dit_core/test_block_gpu.py -k "hidden or swiglu or \
              bf16_rows or block or step"
            timeout 120 python3 bench/bench_quantizer_shapes.py --hidden ;;
    gemm_sweep) timeout 420 python3 tests/kernels/bench_int8_linear.py --runs 20 --gemm-sweep ;;
    energy) timeout 200 python3 bench/energy_by_kernel.py ;;
    attention_fp8) XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python3 bench/bench_attention_fp8_cudnn.py ;;
    attention_first_calls) timeout 120 python3 bench/bench_attention.py --first-calls ;;
    # FlashAttention-3's forward (the fa3 carry) beside cuDNN at LTX-2.5's, H3's and Klein's shapes
    attention_fa3) timeout $(cap 300) python3 bench/bench_attention.py --fa3 --seconds 0.5 --tiles 128x64x8x3 \
                     --shapes 32x14080 32x3520 56x15911 24x4608 ;;
    attention) timeout 200 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_attention_int8.py
               timeout 200 python3 bench/bench_attention.py ${ATTENTION_ARGS:---stages 3 4} ;;
    krea2) timeout $(cap 200) python3 bench/bench_krea2_step.py ${KREA2_ARGS:---steps 5} ;;
    # Krea 2's step and its first step at new prompt lengths, by cuDNN's dense attention path and by its ragged one
    # (plans keyed on lengths rounded up to powers of two; the variable is read once a process), then under
    # cudaMallocAsync (ComfyUI's default allocator: what a capture at a new prompt length costs in a server)
    krea2_lengths) for env in TORCH_CUDNN_SDPA_AVOID_RECOMPILE=0 TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 \
                              PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; do echo "## $env"
                     env $env timeout $(cap 150) python3 bench/bench_krea2_step.py --steps 5 --new-lengths \
                       --no-peer; done ;;
    fp8_products) timeout 200 python3 bench/bench_fp8_products.py --runs 30 ;;
    load) timeout 400 sh -c 'python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/families/test_z_image.py \
            -k arithmetic; python3 bench/bench_load.py --layers ${LAYERS:-4} ${LOAD_ARGS:-}' ;;
    # The attention gates in OUT's quantizer (Krea 2, LTX-2.5) and LTX-2.5's q/k rows kernel: their GPU tests, then
    # their timings against the torch passes they replace (the gated pass's warps and stages are chosen from these).
    gate_kernels) timeout 590 sh -c 'python3 -m pytest -q -rs -p no:cacheprovider -m "gpu or not gpu" \
                    tests/kernels/test_int8_quant_gate.py tests/kernels/test_rows_norm_rope.py &&
                  python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/families/test_krea2.py \
                    tests/families/test_ltx25_gpu.py tests/families/test_ltx25_guide_bias.py;
                  python3 tests/kernels/bench_int8_quant_gate.py; python3 tests/kernels/bench_rows_norm_rope.py' ;;
    # MiniMax H3's 33 B step at the t2v template's size: diffusers BF16, ours INT8 resident and streamed in 16 GiB.
    h3) timeout 590 python3 -u bench/bench_h3_step.py --steps 3 2>&1 | stamped ;;
    parallel) timeout 590 sh -c 'python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/dit_core/test_sequence_parallel.py;
              for f in h3 ltx25; do python3 -u bench/bench_sequence_parallel.py --family $f --layers ${LAYERS:-12}; done' \
                2>&1 | stamped ;;
    # Whole graphs in a real ComfyUI server (carry the server's set): cold, a new prompt, the same prompt; GRAPHS
    # picks the graphs of this call (z_image by default; flux3_klein krea2 in another: each call has 600 s);
    # SIDE=peers runs Klein's and Krea 2's diffusers pipelines instead (carry the peers' set); GRAPH_ARGS=--prebuild
    # adds ours cold after `swiftdit prebuild`.
    graph) timeout $(cap 590) python3 bench/bench_graph.py --only ${GRAPHS:-z_image} --side ${SIDE:-ours} \
             ${GRAPH_ARGS:-} --report $OUT/graph.md ;;
    # LTX-2.5's 22 B step at the t2v template's two stages: diffusers BF16, ours INT8 resident and streamed in 16 GiB
    # (carry the peers' set; building diffusers' model peaks near 120 GB of host memory).
    ltx25) timeout $(cap 590) python3 -u bench/bench_ltx25_step.py ${LTX25_ARGS:---steps 3 --profile} 2>&1 | stamped ;;
    # H3's t2v template clip end to end (20 steps, decodes) against diffusers' models (peers' set)
    h3_clip) timeout $(cap 590) python3 -u bench/bench_h3_clip.py ${H3_CLIP_ARGS:---fidelity} 2>&1 | stamped ;;
    # LTX-2.5's template clip end to end (both stages, upsampler, decodes) against diffusers' models (peers' set)
    ltx25_clip) timeout $(cap 590) python3 -u bench/bench_ltx25_clip.py ${LTX25_CLIP_ARGS:---fidelity} 2>&1 | stamped ;;
    # H3's and LTX-2.5's video decode at the templates' sizes against diffusers' (carry the peers' set)
    video_decode) timeout $(cap 590) python3 -u bench/bench_video_decode.py ${VIDEO_DECODE_ARGS:-} ;;
    # Z-Image's VAE decode at 1024x1024: stock ComfyUI's VAE against ours, NCHW and channels-last (either carry)
    image_decode) timeout $(cap 200) python3 -u bench/bench_image_decode.py ${IMAGE_DECODE_ARGS:-} ;;
    save_image) timeout $(cap 120) python3 -u bench/bench_save_image.py ;;
    # The first Z-Image step on a machine that built nothing: kernels built as it runs against built ahead.
    first_step) timeout 150 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/dit_core/test_builds.py
                timeout 200 python3 bench/bench_first_step.py ;;
    # The text encoder on the card (issue 34): Qwen3-VL-4B loaded BF16 and on the INT8 kernels (carry the peers' set).
    text_encoders) timeout 240 python3 bench/bench_text_encoders.py ;;
    # The text encoder's kernels and host time, an encode eager and one replayed from its CUDA graph, short and long.
    text_replay) timeout $(cap 240) python3 bench/bench_text_encoders.py --profile ;;
    # OmniVoice against the omnivoice package (carry the peers' set): RTF at 10 s and 30 s, 32 and 12 steps.
    omnivoice) timeout $(cap 540) python3 bench/bench_omnivoice.py ${OMNIVOICE_ARGS:---repeats 5 --eager --int8 --agreement} ;;
    # LTX-2.5's row passes at stage 2: q/k rows by every row's angle tables or by axis; modulated norms
    rows_norm_rope) timeout 200 sh -c "python3 tests/kernels/bench_rows_norm_rope.py --runs 50; python3 tests/kernels/bench_modulated_norm.py" ;;
    # GPU tests named in TESTS (paths or node ids), those PICK_K selects (pytest's -k) where it is set
    pick) timeout $(cap 300) python3 -m pytest -q -rs -m "gpu or not gpu" -p no:cacheprovider --durations=5 $TESTS \
            ${PICK_K:+-k "$PICK_K"} ;;
    klein) timeout 330 python3 -u bench/bench_flux3_klein.py --runs 2 --profile --variant-triton-gemm ${VARIANTS:-} \
             2>&1 | stamped ;;
    carry_tests) timeout 240 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_int8_linear_hopper.py \
             tests/dit_core/test_block_gpu.py -k "gated or parallel or builds" ;;
    # Nsight Compute on one call of each (the third: the first builds): Klein's QKV and UP products, plain rows'
    # quantizer; its details page and a summary of its per-instruction stall samples (bench/ncu_stalls.py) as text.
    ncu) timeout 280 sh -c 'for c in "qkv 4608 3072 9216 hopper" "swiglu 4608 3072 18432 hopper" \
           "quantize 4608 3072 0 rotate" "quantize 4608 3072 0 codes"; do set -- $c; r=/tmp/ncu_$1_$5
           ncu --clock-control none --set full --import-source yes -k regex:$5 --launch-skip 2 --launch-count 1 \
             -f -o $r python3 bench/bench_linear_shapes.py --once $1 $2 $3 $4 &&
           ncu -i $r.ncu-rep --page details > $OUT/ncu_$1_$5.txt && ncu -i $r.ncu-rep --page source --csv \
             --print-source sass > $r.csv && python3 bench/ncu_stalls.py $r.csv > $OUT/ncu_$1_$5.stalls.txt; done' ;;
    server) SWIFTDIT_REPORT=$OUT/server_report.md timeout $(cap 590) python3 -m pytest -q -rs -s -m gpu -p no:cacheprovider \
              --durations=10 tests/host/test_gpu_server.py ;;
    # The engine's step against the sampler node's (tests/host/test_gpu_server.py's checkpoints), under PyTorch's
    # allocator and under ComfyUI's default one.
    node_path) timeout 300 sh -c 'python3 bench/bench_node_path.py &&
                 PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 bench/bench_node_path.py' ;;
    *) echo "unknown part $part" ;;
  esac > "$OUT/$part.log" 2>&1
  rc=$?
  kill $sampler 2>/dev/null
  echo "$part: rc $rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
done
# At most 8 files come back from a call: the logs and power traces go in one archive beside the reports.
(cd "$OUT" && ls *.log *.csv >/dev/null 2>&1 && tar czf logs.tgz --remove-files $(ls *.log *.csv 2>/dev/null))
