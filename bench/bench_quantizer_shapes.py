"""Times the quantizer and the gated GEMM at the call shapes FLUX.3 Klein and Z-Image run (M 4608 rows), by kernel.

Three tables (CUDA graphs, median of 30 replays; kernels' own times from the profiler over 20 eager calls):
1. quantize_rows per call shape: the modulated norm with one modulation row or two in runs (FLUX.3's joint blocks:
   512 text rows, then the image's), plain rows, the text-mode blocks' 512 rows; beside the two-pass floor at 4 TB/s
   (input read, bf16 rotated rows written and read back, int8 codes written).
2. The codes pass alone by launch shape (rows, columns, warps a program).
3. int8_linear_gated at Klein's OUT and DOWN shapes with one gate row, two in runs, two at random.
--one-pass: only plain rows, kernels/int8/quant_hopper.py's one pass (by groups an item and programs an SM) beside
the Triton passes, with the one-pass floor (x read, codes written) at 4 TB/s.
--turned: only attention outputs, kernels/int8/quant_turned.py's pass (rows whose v was turned, and plain rows) by
rows and warps a program, beside the rotate and codes passes on the same rows, with the one-pass floor.
--gated: only gated attention outputs at LTX-2.5's (a 2 sigmoid gate a head) and Krea 2's shapes (a gate a feature),
the whole-rows pass by launch (its programs walking the rows or not) beside the two passes, with the one-pass floor.
--hidden: only the MLP's hidden rows, plain against turned by UP's SwiGLU epilogue (block_gpu._turns_hidden).
On the device: python bench/bench_quantizer_shapes.py [--one-pass | --turned | --gated | --hidden]
(device_session.sh quantizer_shapes, one_pass, turned, gated, hidden).
"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))

from bench_int8_linear import median_ms  # noqa: E402

from kernels import Choices  # noqa: E402
from kernels.int8 import quant_hopper as int8_quant_hopper  # noqa: E402
from kernels.int8 import quant_turned_hopper as int8_quant_turned_hopper  # noqa: E402
from kernels.int8.codes import _codes_kernel  # noqa: E402
from kernels.int8.linear import int8_linear_gated  # noqa: E402
from kernels.int8.quant import quantize_rows  # noqa: E402
from kernels.int8.quant_turned import quantize_turned  # noqa: E402

M, TEXT_ROWS, RUNS = 4608, 512, 30
GEN = torch.Generator().manual_seed(0)


def graph_ms(fn) -> float:
    return median_ms(fn, RUNS, graph=True)


def kernel_us(fn) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    return ", ".join(f"{e.key.strip('_')} {e.device_time_total / e.count:.1f}" for e in prof.key_averages()
                     if e.device_time_total > 0)


def rows(m, k, dtype=torch.float32):
    return torch.randn(m, k, generator=GEN).to("cuda", dtype)


def runs_map(m: int) -> torch.Tensor:
    """Text rows on modulation row 0, image rows on row 1 (the joint blocks' packed sequence)."""
    return (torch.arange(m, device="cuda") >= TEXT_ROWS).long()


def modulated(m, k, mod_rows, norm="layer", starts=True):
    """The joint blocks' call: two modulation rows in runs, their first rows given (row_starts) unless not starts."""
    return {"norm": norm, "eps": 1e-6, "scale": 0.1 * torch.randn(mod_rows, k, device="cuda"),
            "shift": 0.1 * torch.randn(mod_rows, k, device="cuda"),
            "row_map": runs_map(m) if mod_rows == 2 else torch.zeros(m, dtype=torch.long, device="cuda"),
            "row_starts": (0, TEXT_ROWS) if mod_rows == 2 and starts else None}


def quantizer_table() -> list[str]:
    cases = {"Klein joint norm: layer f32 3072, 2 modulation rows in runs": (rows(M, 3072), modulated(M, 3072, 2)),
             "the same, the runs' first rows not given (gathered)": (rows(M, 3072), modulated(M, 3072, 2,
                                                                                              starts=False)),
             "the same, 1 modulation row": (rows(M, 3072), modulated(M, 3072, 1)),
             "Klein attention out: plain bf16 3072": (rows(M, 3072, torch.bfloat16), {}),
             "Klein MLP hidden: plain bf16 9216": (rows(M, 9216, torch.bfloat16), {}),
             "Klein text blocks: layer f32 512x3072, 1 row": (rows(512, 3072), modulated(512, 3072, 1)),
             "Klein text blocks: plain bf16 512x9216": (rows(512, 9216, torch.bfloat16), {}),
             "Z-Image attention out: plain bf16 3840": (rows(M, 3840, torch.bfloat16), {}),
             "Z-Image MLP hidden: plain bf16 10240": (rows(M, 10240, torch.bfloat16), {})}
    out = ["| call | graph ms | two-pass floor ms | kernels (us a call) |", "|---|---|---|---|"]
    for name, (x, kw) in cases.items():
        fn = lambda x=x, kw=kw: quantize_rows(x, 256, **kw)  # noqa: E731
        floor = x.numel() * (x.element_size() + 2 + 2 + 1) / 4e12 * 1e3
        out.append(f"| {name} | {graph_ms(fn):.4f} | {floor:.4f} | {kernel_us(fn)} |")
        if x.shape[1] > 8192:  # rotated rows past L2: the codes pass's column order matters (codes_last_first)
            fn = lambda x=x, kw=kw: quantize_rows(x, 256, **kw, choices=Choices(codes_last_first=False))  # noqa: E731
            out.append(f"| the same, codes first columns first | {graph_ms(fn):.4f} | {floor:.4f} | {kernel_us(fn)} |")
    return out


def one_pass_table() -> list[str]:
    out = ["| plain bf16 rows | Triton passes ms | one pass ms (groups an item / programs an SM) | one-pass floor ms |",
           "|---|---|---|---|"]
    for m, k in ((M, 3072), (M, 9216), (M, 3840), (M, 10240), (TEXT_ROWS, 9216)):
        x = rows(m, k, torch.bfloat16)
        codes, scales = torch.empty(m, k, dtype=torch.int8, device="cuda"), torch.empty(m, device="cuda")
        two = graph_ms(lambda x=x: quantize_rows(x, 256, choices=Choices(hopper_quant=False)))
        timed = [f"default {graph_ms(lambda x=x: quantize_rows(x, 256)):.4f}"]
        for g in (g for g in (1, 2, 3) if (k // 256) % g == 0):
            for per_sm in (2, 3, 4):
                fn = lambda x=x, g=g, per_sm=per_sm: int8_quant_hopper.launch(x, codes, scales, g, per_sm)  # noqa
                timed.append(f"{g}/{per_sm} {graph_ms(fn):.4f}")
        out.append(f"| {m}x{k} | {two:.4f} | {', '.join(timed)} | {x.numel() * 3 / 4e12 * 1e3:.4f} |")
    return out


def turned_table() -> list[str]:
    out = ["| attention output rows | rotate + codes passes ms | turned rows: Gluon (2 / 4 warps), Triton (rows / "
           "warps) ms | plain rows' one pass ms (rows / warps) | floor ms |", "|---|---|---|---|---|"]
    for m, k in ((M, 3072), (M, 3840), (TEXT_ROWS, 3072)):
        t = rows(m, k, torch.bfloat16)
        codes, scales = torch.empty(m, k, dtype=torch.int8, device="cuda"), torch.empty(m, device="cuda")
        timed = {"v": [f"Gluon {graph_ms(lambda t=t, w=w: int8_quant_turned_hopper.launch(t, codes, scales, w)):.4f}"
                       for w in (2, 4)], None: []}
        for turned in ("v", None):  # Triton's kernel (the Gluon one off)
            timed[turned].append(f"default {graph_ms(lambda t=t, tu=turned: quantize_turned(t, tu, hopper=False)):.4f}")
            for r, nw in ((1, 2), (2, 4), (2, 8)):
                fn = lambda t=t, tu=turned, r=r, nw=nw: quantize_turned(t, tu, (codes, scales), r, nw,  # noqa: E731
                                                                        hopper=False)
                timed[turned].append(f"{r}/{nw} {graph_ms(fn):.4f}")
        # the rotate and codes passes, not the plain rows' one pass
        passes = graph_ms(lambda t=t: quantize_rows(t, 256, choices=Choices(whole_rows=False)))
        out.append(f"| {m}x{k} | {passes:.4f} | {', '.join(timed['v'])} | "
                   f"{', '.join(timed[None])} | {t.numel() * 3 / 4e12 * 1e3:.4f} |")
    return out


# (M, K, the gate's values a row: a head's (f32, factor 2), a feature's (bf16, QKV's last columns, factor 1), or None:
# plain rows, no gate, which the whole-rows pass takes too)
GATED_SHAPES = {"LTX-2.5 stage 2": (14080, 4096, 32), "LTX-2.5 stage 1": (3520, 4096, 32), "Krea 2": (4608, 6144, 0),
                "LTX-2.5 stage 2 plain": (14080, 4096, None), "Z-Image plain": (4608, 3840, None)}
# whole rows' launches: (rows, warps, programs an SM walking the row blocks; 0: a program a block)
GATED_LAUNCHES = ((1, 4, 0), (1, 8, 0), (2, 4, 0), (2, 8, 0), (4, 8, 0), (1, 4, 2), (1, 4, 4), (2, 8, 1), (2, 8, 2))


def gated_rows_table() -> list[str]:
    """Gated attention outputs (rows times a gate's f sigmoid) to codes: the whole-rows pass by launch (rows / warps /
    programs an SM walking the blocks) against the rotate and codes passes, and the default launch's kernels."""
    out = ["| gated rows | rotate + codes passes ms | whole rows (rows / warps / walking programs an SM) ms | "
           "kernel us (whole rows, default) | floor ms |", "|---|---|---|---|---|"]
    for label, (m, k, heads) in GATED_SHAPES.items():
        t = rows(m, k, torch.bfloat16)
        gate = {} if heads is None else {"gate": rows(m, heads, torch.float32), "gate_factor": 2.0} if heads else \
            {"gate": rows(m, 3 * k, torch.bfloat16)[:, 2 * k:], "gate_factor": 1.0}
        codes, scales = torch.empty(m, k, dtype=torch.int8, device="cuda"), torch.empty(m, device="cuda")
        passes = graph_ms(lambda t=t: quantize_rows(t, 256, **gate, out=(codes, scales),
                                                    choices=Choices(whole_rows=False)))
        timed = []
        for r, nw, rp in GATED_LAUNCHES:
            fn = lambda t=t, r=r, nw=nw, rp=rp: quantize_turned(t, None, (codes, scales), r, nw, **gate,  # noqa
                                                                row_programs=rp)
            timed.append(f"{r}/{nw}/{rp} {graph_ms(fn):.4f}")
        own = kernel_us(lambda t=t: quantize_turned(t, None, (codes, scales), **gate))
        gated = "" if heads is None else f", gate {'a head' if heads else 'a feature'}"
        out.append(f"| {label} {m}x{k}{gated} | {passes:.4f} | "
                   f"{', '.join(timed)} | {own} | {t.numel() * 3 / 4e12 * 1e3:.4f} |")
    return out


def hidden_table() -> list[str]:
    """The MLP's hidden rows: plain (the Gluon one pass where chosen, else the Triton passes) against turned by UP's
    SwiGLU epilogue (kernels/int8/quant_turned_hopper.py's hidden rows by warps and groups a warp; the Triton
    passes with the rest of the rotation as their operand)."""
    out = ["| hidden rows | plain: one pass (Gluon) or the passes | turned: Gluon (warps / groups a warp) | turned: "
           "the Triton passes | floor ms |", "|---|---|---|---|---|"]
    for m, k in ((M, 9216), (M, 10240), (TEXT_ROWS, 9216)):
        t = rows(m, k, torch.bfloat16)
        codes, scales = torch.empty(m, k, dtype=torch.int8, device="cuda"), torch.empty(m, device="cuda")
        plain = graph_ms(lambda t=t: quantize_rows(t, 256, out=(codes, scales)))
        hidden = int8_quant_turned_hopper.launch_long
        gluon = [f"{w}/{g} {graph_ms(lambda t=t, w=w, g=g: hidden(t, codes, scales, 'hidden', w, g)):.4f}"
                 for w, g in ((1, 4), (2, 4), (1, 8), (4, 4))]
        passes = graph_ms(lambda t=t: quantize_rows(t, 256, turned="hidden", out=(codes, scales),
                                                    choices=Choices(hopper_turned_quant=False)))
        out.append(f"| {m}x{k} | {plain:.4f} | {', '.join(gluon)} | {passes:.4f} | {t.numel() * 3 / 4e12 * 1e3:.4f} |")
    return out


def codes_table() -> list[str]:
    out = ["| K | rows/columns/warps a program | codes ms | floor ms |", "|---|---|---|---|"]
    for k in (3072, 3840, 9216, 10240):
        groups = k // 256
        y = rows(M, k, torch.bfloat16)
        gmax = y.float().abs().view(M, groups, 256).amax(-1).contiguous()
        q, s = torch.empty(M, k, dtype=torch.int8, device="cuda"), torch.empty(M, device="cuda")
        for bm, bk, nw in ((16, 256, 4), (32, 256, 4), (64, 256, 4), (8, 1024, 4), (64, 128, 4), (32, 512, 4),
                           (16, 512, 4), (8, 512, 4), (16, 256, 2)):
            fn = lambda bm=bm, bk=bk, nw=nw: _codes_kernel[(-(-M // bm), -(-k // bk))](  # noqa: E731
                y, gmax, q, s, M, k, GROUPS=groups, GROUPS_P2=1 << (groups - 1).bit_length(), BLOCK_M=bm,
                BLOCK_K=bk, LAST_FIRST=True, num_warps=nw)
            out.append(f"| {k} | {bm}/{bk}/{nw} | {graph_ms(fn):.4f} | {M * k * 3 / 4e12 * 1e3:.4f} |")
    return out


def gated_table() -> list[str]:
    out = ["| K x N | gate rows | gated GEMM ms |", "|---|---|---|"]
    for k, n in ((3072, 3072), (9216, 3072)):
        q = torch.randint(-128, 128, (M, k), dtype=torch.int8, device="cuda")
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
        sx, sw, residual = torch.rand(M, device="cuda") * 1e-3, torch.rand(n, device="cuda") * 1e-3, rows(M, n)
        maps = {"1": (1, torch.zeros(M, dtype=torch.long, device="cuda")), "2 in runs": (2, runs_map(M)),
                "2 at random": (2, torch.randint(0, 2, (M,), device="cuda"))}
        for label, (r, row_map) in maps.items():
            gate = torch.randn(r, n, device="cuda")
            fn = lambda gate=gate, row_map=row_map: int8_linear_gated(  # noqa: E731
                q, sx, w, sw, None, residual=residual, gate=gate, row_map=row_map)
            out.append(f"| {k}x{n} | {label} | {graph_ms(fn):.4f} |")
    return out


if __name__ == "__main__":
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, M = {M}, group 256\n")
    if "--one-pass" in sys.argv:
        print("\n".join(one_pass_table()))
    elif "--turned" in sys.argv:
        print("\n".join(turned_table()))
    elif "--gated" in sys.argv:
        print("\n".join(gated_rows_table()))
    elif "--hidden" in sys.argv:
        print("\n".join(hidden_table()))
    else:
        print("\n".join(one_pass_table() + [""] + quantizer_table() + [""] + codes_table() + [""] + gated_table()))
