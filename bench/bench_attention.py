"""Attention at the joint blocks' shapes: the INT8-score kernel and the 8-bit one against cuDNN's bf16 SDPA.

kernels/int8/attention.py (INT8 q k^T, bf16 p v; Gluon) and kernels/attention_8bit.py (INT8 q k^T, e4m3 p v; Triton)
beside the cuDNN bf16 SDPA the blocks call: time (CUDA graph), TFLOP/s, joules a call under sustained load, and the
error against f32 attention. q and k are head-RMS-normed rows with random gains (as kernels/head_norm_rope.py makes
them), v plain rows; all are rows [M, heads x 128] (the QKV's layout), which SDPA reads as strided [1, heads, M, 128]
views. Shapes: FLUX.3 Klein's joint rows (24 heads, 4608 rows), MiniMax H3's (56 heads, 15911 rows; issue 35),
Z-Image's (30, 4608), LTX-2.5's video self-attention (32, 14080 at stage 2; 3520 at stage 1). The 8-bit kernel's
rows: codes included (torch's smoothing reductions and the three code passes, then the kernel), the kernel alone at
each --tiles tile (BLOCK_M x BLOCK_N x warps x stages), its codes alone. --fa3: also FlashAttention-3's forward
(the `fa3_fwd` package, where installed: `bash bench/device_carry.sh fa3` carries its wheel) on the same bf16 views,
and on e4m3 q, k, v with a scale a head (codes included, and its kernel alone).

    python bench/bench_attention.py [--shapes 24x4608 56x15911] [--stages 3 4] [--tiles 128x64x8x3 64x64x4x3]
    python bench/bench_attention.py --shapes 48x4608x12     # Krea 2's grouped-query heads: copied or SDPA's own
    python bench/bench_attention.py --fa3 --shapes 32x14080 32x3520 56x15911 --tiles 128x64x8x3
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests" / "kernels")]

from bench_int8_linear import median_ms  # noqa: E402
from energy_by_kernel import sustained  # noqa: E402
from gpu_energy import energy_reader  # noqa: E402
from kernels import attention_8bit as k8  # noqa: E402
from kernels.int8 import attention as ka  # noqa: E402

TILES = ["128x64x8x3", "64x64x4x3", "128x128x8x2", "64x128x4x2"]  # BLOCK_M x BLOCK_N x warps x stages


def rows(m: int, heads: int, seed: int, normed: bool) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, heads, ka.HEAD, device="cuda", generator=g)
    if normed:
        x = x * (1 + torch.rand(1, heads, ka.HEAD, device="cuda", generator=g))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))
    return x.reshape(m, heads * ka.HEAD).to(torch.bfloat16)


def first_calls(heads: int = 30, image_rows: int = 4096) -> None:
    """What a new prompt's length costs SDPA: each back end's first call at a row count it has not seen (cuDNN builds
    and caches an execution plan per shape) against its next call, for the caption alone (the context refiner) and
    the joint rows."""
    import time
    from torch.nn.attention import SDPBackend, sdpa_kernel
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {heads} heads x 128, bf16\n")
    print("| back end | rows | first call ms | next call ms |\n|---|---|---|---|")
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        for caption in (64, 96, 160, 288):
            for m in (caption, image_rows + caption):
                q = torch.randn(1, heads, m, 128, device="cuda", dtype=torch.bfloat16)
                times = []
                for _ in range(2):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    with sdpa_kernel([backend]):
                        F.scaled_dot_product_attention(q, q, q)
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - t0) * 1e3)
                print(f"| {backend.name} | {m} | {times[0]:.2f} | {times[1]:.2f} |", flush=True)


def grouped_query(heads: int, m: int, kv: int, seconds: float, energy) -> None:
    """Grouped-query attention (Krea 2: 48 query heads, 12 key heads) in cuDNN's bf16 SDPA: the key and value heads
    copied for each query head they serve, as the blocks' head_norm_rope writes them (rows [m, heads x 128]; the
    copy alone, then the attention on them), against SDPA's grouped mode reading the 12 heads (enable_gqa)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = rows(m, heads, 1, True), rows(m, kv, 2, True), rows(m, kv, 3, False)
    view = lambda t: t.reshape(m, -1, ka.HEAD).transpose(0, 1).unsqueeze(0)  # noqa: E731  rows -> [1, h, m, D]
    copied = lambda t: t.reshape(m, kv, 1, ka.HEAD).expand(m, kv, heads // kv, ka.HEAD).reshape(m, -1)  # noqa: E731
    ke, ve = copied(k), copied(v)
    truth = F.scaled_dot_product_attention(view(q).float(), view(ke).float(), view(ve).float())
    truth = truth[0].transpose(0, 1).reshape(m, -1)

    def sdpa(backend, kk, vv, **kw):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(view(q), view(kk), view(vv), **kw)[0].transpose(0, 1).reshape(m, -1)
    cases = [("cuDNN bf16, key heads copied (the blocks' call), the attention alone",
              lambda: sdpa(SDPBackend.CUDNN_ATTENTION, ke, ve)),
             ("the key and value heads' copies alone", lambda: (copied(k), copied(v)) and None),
             ("cuDNN bf16, grouped mode (enable_gqa)", lambda: sdpa(SDPBackend.CUDNN_ATTENTION, k, v, enable_gqa=True)),
             ("flash bf16, grouped mode (enable_gqa)", lambda: sdpa(SDPBackend.FLASH_ATTENTION, k, v, enable_gqa=True))]
    # (a back end that does not take the grouped mode here says why in its row)
    print_cases(f"{heads} / {kv}", m, 4 * m * m * ka.HEAD * heads, cases, truth, seconds, energy,
                refusals=(RuntimeError,))


def e4m3_heads(t: torch.Tensor, m: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [m, heads x 128] bf16 as FA3's e4m3 operand [1, m, heads, 128] and its descale [1, heads] f32: each
    head's values over its absmax / 448 (e4m3's largest), rounded to nearest by the cast."""
    x = t.reshape(1, m, heads, ka.HEAD).float()
    scale = x.abs().amax(dim=(1, 3)).clamp(min=1e-30) / 448.0
    return (x / scale[:, None, :, None]).to(torch.float8_e4m3fn), scale.contiguous()


def fa3_cases(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: int, heads: int) -> list:
    """FlashAttention-3's forward on the rows' BSHD views (no copies): bf16, and e4m3 with a descale a head (codes
    included; the kernel alone). None of it where fa3_fwd is not installed (a line says why)."""
    try:
        from fa3_fwd_interface import flash_attn_func
    except ImportError as e:
        print(f"(FA3: fa3_fwd_interface does not import here: {e})")
        return []
    bshd = lambda t: t.reshape(1, m, heads, ka.HEAD)  # noqa: E731
    rows_of = lambda o: (o[0] if isinstance(o, tuple) else o).reshape(m, heads * ka.HEAD)  # noqa: E731

    def eight_bit():
        (q8, sq), (k8_, sk), (v8, sv) = (e4m3_heads(t, m, heads) for t in (q, k, v))
        return rows_of(flash_attn_func(q8, k8_, v8, q_descale=sq, k_descale=sk, v_descale=sv))
    made = [e4m3_heads(t, m, heads) for t in (q, k, v)]
    return [("FA3 bf16", lambda: rows_of(flash_attn_func(bshd(q), bshd(k), bshd(v)))),
            ("FA3 e4m3, a scale a head, codes included", eight_bit),
            ("FA3 e4m3, the kernel alone", lambda: rows_of(flash_attn_func(
                made[0][0], made[1][0], made[2][0], q_descale=made[0][1], k_descale=made[1][1],
                v_descale=made[2][1])))]


def print_cases(heads: str, m: int, flop: int, cases: list, truth: torch.Tensor, seconds: float, energy,
                refusals: tuple[type[Exception], ...] = ()) -> None:
    """A table row for each (name, call) of cases: graph ms, TFLOP/s of flop, joules a call under seconds of
    sustained load, the error of its output (None: none) against truth; a call that raises one of refusals (or
    whose capture does) gets a row with the first line of its error."""
    for name, call in cases:
        try:
            o = call()
            err = float("nan") if o is None else ((o.float() - truth).norm() / truth.norm()).item()
            ms = median_ms(call, 20, graph=True)
        except refusals as e:
            print(f"| {heads} | {m} | {name} | - | - | - | {str(e).splitlines()[0][:80]} |", flush=True)
            continue
        joules = sustained(call, seconds, energy)[1] if energy is not None else float("nan")
        print(f"| {heads} | {m} | {name} | {ms:.4f} | {flop / ms / 1e9:.0f} | {joules:.4f} | "
              f"{'-' if math.isnan(err) else f'{err:.2e}'} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["24x4608", "56x15911"],
                   help="HEADSxROWS[xKEY_HEADS]: 24x4608 FLUX.3 Klein, 56x15911 MiniMax H3, 30x4608 Z-Image, "
                        "48x4608x12 Krea 2 (grouped query: cuDNN with copied key heads against its grouped mode)")
    p.add_argument("--stages", type=int, nargs="*", default=[ka.STAGES], help="attention_int8's ring slots")
    p.add_argument("--tiles", nargs="*", default=TILES, help="attention_8bit's tiles: BLOCK_MxBLOCK_NxWARPSxSTAGES")
    p.add_argument("--seconds", type=float, default=1.0, help="sustained load a case, after as long a warm-up")
    p.add_argument("--fa3", action="store_true", help="also FlashAttention-3's forward, bf16 and e4m3 (fa3_fwd)")
    p.add_argument("--first-calls", action="store_true",
                   help="instead: the first and a later call of cuDNN and flash SDPA at each new row count of a new "
                        "prompt's length (Z-Image: 30 heads, 4096 image rows + captions padded to 32)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention needs a CUDA GPU")
    if args.first_calls:
        return first_calls()
    energy = energy_reader(torch.device("cuda", torch.cuda.current_device()))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; heads x 128\n")
    print("| heads | rows | attention | graph ms | TFLOP/s | J a call (sustained) | error vs f32 |\n"
          + "|---" * 7 + "|")
    for shape in args.shapes:
        heads, m, *kv = (int(x) for x in shape.split("x"))
        if kv and kv[0] != heads:
            grouped_query(heads, m, kv[0], args.seconds, energy)
            continue
        q, k, v = rows(m, heads, 1, True), rows(m, heads, 2, True), rows(m, heads, 3, False)
        view = lambda t: t.reshape(m, heads, ka.HEAD).transpose(0, 1).unsqueeze(0)  # noqa: E731
        qh, kh, vh = view(q), view(k), view(v)
        truth = F.scaled_dot_product_attention(qh.float(), kh.float(), vh.float())
        truth = truth[0].transpose(0, 1).reshape(m, -1)

        def cudnn():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qh, kh, vh)[0].transpose(0, 1).reshape(m, -1)
        cases = [("cuDNN bf16 SDPA (the blocks' call)", cudnn)] + (fa3_cases(q, k, v, m, heads) if args.fa3 else [])
        if ka.unusable(q, heads):
            print(f"(attention_int8 cannot run here: {ka.unusable(q, heads)})")
        else:
            cq, ck = ka.codes(q, heads, True), ka.codes(k, heads, False)
            for stages in args.stages:
                def ours(stages=stages):
                    return ka.attention_int8(q, k, v, heads, stages)
                cases.append((f"INT8 scores, {stages} slots, codes included", ours))
            made = ka.operands(q, k, v, heads)
            cases.append((f"INT8 scores, the kernel alone ({ka.STAGES} slots)", lambda: ka.launch(*made, heads)))
            cases.append(("INT8 scores: q and k codes alone", lambda: (ka.codes(q, heads, True, out=cq),
                                                                      ka.codes(k, heads, False, out=ck)) and None))
        if k8.unusable(qh):
            sys.exit(f"attention_8bit cannot run here: {k8.unusable(qh)}")
        cases.append(("8-bit q k^T and p v, codes included", lambda: k8.attention_8bit(q, k, v, heads)))
        for tile in args.tiles:
            bm, bn, warps, stages = (int(x) for x in tile.split("x"))
            made8 = k8.operands(q, k, v, heads, bn)
            def alone(made8=made8, bm=bm, bn=bn, warps=warps, stages=stages):
                return k8.launch(*made8, block_n=bn, block_m=bm, num_warps=warps, num_stages=stages)
            cases.append((f"8-bit, the kernel alone ({tile})", alone))
        cases.append(("8-bit: smoothing and codes alone", lambda: k8.operands(q, k, v, heads) and None))
        print_cases(str(heads), m, 4 * m * m * ka.HEAD * heads, cases, truth, args.seconds, energy,
                    refusals=(RuntimeError,) if args.fa3 else ())


if __name__ == "__main__":
    main()
