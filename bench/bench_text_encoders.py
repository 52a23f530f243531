"""The text encoder on the card, as the loaders place it (issue 34): Qwen3-VL-4B (FLUX.3 Klein's and Krea 2's; the
same linear shapes as Z-Image's Qwen3-4B) from a real-size random INT8 ConvRot file, loaded on CUDA two ways: its
linears dequantized to BF16 (the nodes' path) and kept INT8 on the INT8 kernels (dit_core/gpu/text_linear.py), each
run through transformers' layers and through the fused ones (dit_core/gpu/text_decoder.py, the nodes' path). For
each: load seconds, weights on the card, peak host RSS, the time to encode a short and a long prompt and a new short
prompt each time (a user's next prompt: its length new; median of CUDA-event timings), and the features against the
BF16 load's through transformers' layers (relative Frobenius; the tiny models' bound for INT8 is 8e-2). Prints a
markdown table.

    python bench/bench_text_encoders.py [--root DIR] [--runs 5] [--profile]

--profile: only the BF16 load's fused layers, the short and long prompts encoded eagerly and replayed from CUDA graphs,
each call's kernels (bench/gpu_profile.py; the short prompt's host functions too): where an encode's time goes.

The file is written once under --root (tests/real_size.py's writer, quantized on the GPU)."""
from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import real_size  # noqa: E402
from dit_core.text.qwen3_vl import Qwen3VLTextEncoder  # noqa: E402

FILE = "qwen3vl_4b_int8_convrot.safetensors"
TOKENIZER_DIR = ROOT / ".cache" / "comfyui-0.3.75" / "comfy" / "text_encoders" / "qwen25_tokenizer"
PROMPTS = {"short (a sentence)": "a red fox in the snow at dawn, soft light, shallow depth of field",
           "long (about 500 tokens)": " ".join(["a lighthouse on a cliff above a stormy sea, gulls, rain;"] * 40),
           # a new sentence each run, each a word longer than the last
           "new short prompts": [" ".join(["a red fox in the snow at dawn"] + ["soft"] * i) for i in range(12)]}


def host_peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def timed_encode(encoder, prompt: str | list[str], runs: int) -> float:
    """Median ms of encoder.encode(prompt) over runs, after one warm-up call (kernel builds); a list: a new prompt
    each run (as a user's next prompt, its length new: what a first call at a length costs)."""
    prompts = prompt if isinstance(prompt, list) else [prompt] * (runs + 1)
    encoder.encode(prompts[0])
    times = []
    for text in prompts[1:runs + 1]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        encoder.encode(text)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=str(ROOT / ".cache" / "real_models"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="the kernels of one eager and one replayed BF16 encode")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_text_encoders: needs a CUDA GPU")
        return 2
    shapes = json.loads(real_size.SHAPES.read_text())
    t0 = time.monotonic()
    real_size.write(args.root, "cuda", {FILE: shapes[FILE]})
    path = Path(args.root) / real_size.FILES[FILE][0] / FILE
    print(f"# {FILE} ({path.stat().st_size / 1e9:.2f} GB) ready in {time.monotonic() - t0:.0f} s; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    if args.profile:
        return profile_encodes(path)
    features, rows = {}, []
    for label, int8_linears in (("BF16 (linears dequantized)", False), ("INT8 ConvRot kernels", None)):
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        t0 = time.monotonic()
        encoder = Qwen3VLTextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, device="cuda",
                                          int8_linears=int8_linears)
        torch.cuda.synchronize()
        load_s = time.monotonic() - t0
        card_gb = (torch.cuda.memory_allocated() - base) / 1e9
        fixed = {name: prompt for name, prompt in PROMPTS.items() if isinstance(prompt, str)}
        tokens = {name: len(encoder.tokenizer(prompt if isinstance(prompt, str) else prompt[0]))
                  for name, prompt in PROMPTS.items()}
        for layers, fused, replayed in (("transformers' layers", False, False), ("fused layers", True, False),
                                        ("fused layers, replayed from CUDA graphs", True, True)):
            encoder.fused_layers, encoder.replayed_encodes = fused, replayed
            times = {name: timed_encode(encoder, prompt, args.runs) for name, prompt in PROMPTS.items()}
            features[f"{label}, {layers}"] = {name: encoder.encode(prompt).float().cpu() for name, prompt in
                                              fixed.items()}
            rows.append((f"{label}, {layers}", load_s, card_gb, host_peak_gb(), times))
        del encoder
    names = list(PROMPTS)
    print("| text encoder on the card | load s | weights GB | host peak RSS GB (process so far) | "
          + " | ".join(f"encode {n}, {tokens[n]} tokens, ms" for n in names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for label, load_s, card_gb, rss, times in rows:
        print(f"| {label} | {load_s:.1f} | {card_gb:.2f} | {rss:.1f} | "
              + " | ".join(f"{times[n]:.1f}" for n in names) + " |")
    base_label, *others = features
    base = features[base_label]
    print(f"\nRelative Frobenius of the features from the {base_label}'s:")
    for label in others:
        got = features[label]
        print(f"- {label}: " + ", ".join(f"{n}: {torch.linalg.norm(got[n] - base[n]) / torch.linalg.norm(base[n]):.4f}"
                                         for n in base))
    return 0


def profile_encodes(path: Path) -> int:
    from gpu_profile import print_profile
    encoder = Qwen3VLTextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, device="cuda", int8_linears=False)
    for name in ("short (a sentence)", "long (about 500 tokens)"):
        prompt = PROMPTS[name]
        for replayed in (False, True):
            encoder.fused_layers, encoder.replayed_encodes = True, replayed
            for _ in range(3):  # builds, the capture
                encoder.encode(prompt)
            print(f"\n## BF16, fused layers, the {name} prompt, "
                  f"{'replayed from its CUDA graph' if replayed else 'eager'}: "
                  f"{timed_encode(encoder, prompt, 5):.1f} ms an encode", flush=True)
            print_profile(lambda: encoder.encode(prompt), rows=20, host=name.startswith("short"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
