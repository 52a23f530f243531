"""Times the INT8 ConvRot linear on CUDA at Z-Image's four linears (M 4608): ours, BF16 and comfy-kitchen.

Contenders, all with the same INT8 codes and row scales (dit_core.weights.quantize_convrot of one f32
weight): ours = kernels/int8_quant.quantize_rows + kernels/int8_linear.int8_linear (also each alone, the gated
epilogue and the fused quantizer prologues), F.linear in BF16 on the dequantized weight, and comfy-kitchen 0.2.40's
int8_linear with ConvRot on its cuda (and triton) back end when it imports and reports it available.
Median of --runs timed runs after 10 warm-ups, CUDA events; eagerly and replayed from a CUDA graph (the graph
column removes Python and launch overhead, kitchen's registry included). TOPS = 2 M N K / t. Prints markdown.
Not collected by pytest (bench_*); run on the device: python tests/kernels/bench_int8_linear.py [--runs 100]
--quantizers: instead, the quantizer tables (two-pass launches, row statistics).
--gemm-sweep: instead, the GEMM alone (bf16 out, gated and SwiGLU, graph ms) at every candidate tile
(kernels/int8/tiles.py) and a few more (SWEEP_EXTRA), to see the landscape rather than the winner.
"""
import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dit_core.gpu.step_graph import kept_stream
from dit_core.weights import dequantize_convrot, quantize_convrot
from kernels import Choices
from kernels.int8.linear import BF16, GATED, SWIGLU, _autotuned, int8_linear, int8_linear_gated
from kernels.int8.tiles import candidate_tiles, config, fixed_tiles, launch_of
from kernels.int8.hadamard import hadamard
from kernels.int8.quant import quantize_rows
from kernels.int8.quant_turned import TURNED, quantize_turned, turned_rows
from kernels.int8.qkv_rope_linear import qkv_rope_linear
from kernels.int8.row_stats import launch_shape, row_stats
from kernels.int8.row_stats import reference as row_stats_reference

M = 4608
SHAPES = [("qkv", 3840, 11520), ("out", 3840, 3840), ("w1+w3", 3840, 20480), ("w2", 10240, 3840)]  # K, N
GROUP = 256
# block_m/num_warps/num_stages/row programs of the rotate pass: a program a row block (0), or fewer programs walking
# the row blocks (their loads pipelined).
QUANTIZER_LAUNCHES = [{"block_m": bm, "num_warps": nw, "num_stages": ns, "row_programs": 0}
                      for bm, nw, ns in ((32, 4, 2), (64, 4, 2), (64, 8, 2), (128, 8, 2))] + [
    {"block_m": bm, "num_warps": 4, "num_stages": ns, "row_programs": rp}
    for bm, ns, rp in ((64, 3, 8), (64, 3, 16), (32, 3, 32))]


def median_ms(fn, runs: int, graph: bool, warmups: int = 10) -> float:
    """Median time of fn in ms; with graph, of one replay of a CUDA graph holding one call of fn."""
    for _ in range(3):  # autotuning and allocations happen here, before any capture or timing
        fn()
    torch.cuda.synchronize()
    call = fn
    if graph:
        # The step graphs' capture stream (dit_core/gpu/step_graph.py): what kernels keep per stream (the split tail's
        # buffers, kernels/int8/arrival_counters.py) is made once for it, not for a new stream at each timing.
        side = kept_stream(torch.device("cuda", torch.cuda.current_device()), "capture")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        # Captured on the warm-up's stream: those buffers are made outside a capture only, so a capture on another
        # stream would run without them (whole tiles).
        with torch.cuda.graph(captured, stream=side):
            fn()
        call = captured.replay
    for _ in range(warmups):
        call()
    events = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(2)) for _ in range(runs)]
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def kitchen_linears():
    """{name: int8_linear(x, q, s, bias)} for kitchen's available back ends, and notes on the others."""
    try:
        import comfy_kitchen
    except ImportError as e:
        return {}, [f"comfy_kitchen does not import ({e})"]
    found, notes = {}, []
    status = comfy_kitchen.list_backends()
    for backend in ("cuda", "triton"):
        info = status.get(backend, {})
        if not info.get("available") or info.get("disabled"):
            notes.append(f"kitchen {backend}: unavailable ({info.get('unavailable_reason')})")
            continue

        def run(x, q, s, bias, backend=backend):
            with comfy_kitchen.use_backend(backend):
                return comfy_kitchen.int8_linear(x, q, s, bias, torch.bfloat16, True, GROUP)
        found[f"kitchen {backend}"] = run
    return found, notes


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def time_or_note(fn, runs, graph):
    try:
        return f"{median_ms(fn, runs, graph):.3f}"
    except Exception as e:  # noqa: BLE001 - a contender that cannot run (or be captured) is reported
        return f"n/a ({type(e).__name__})"


def bench_shape(name, k, n, runs, kitchen):
    g = torch.Generator().manual_seed(k + n)
    weight = torch.randn(n, k, generator=g) * k ** -0.5
    codes, scale = quantize_convrot(weight, GROUP)
    w_bf16 = dequantize_convrot(codes, scale, GROUP).to("cuda", torch.bfloat16)
    codes, scale = codes.cuda(), scale.cuda()  # scale [N, 1] f32, as ComfyUI stores it
    s_w = scale.reshape(-1)
    bias = (0.1 * torch.randn(n, generator=g)).to("cuda", torch.bfloat16)
    x = torch.randn(M, k, generator=g).to("cuda", torch.bfloat16)
    q, s_x = quantize_rows(x, GROUP)
    out = torch.empty(M, n, dtype=torch.bfloat16, device="cuda")
    residual = torch.zeros(M, n, device="cuda")
    gate = torch.ones(2, n, device="cuda")
    row_map = torch.zeros(M, dtype=torch.int32, device="cuda")
    exact = F.linear(x.float(), w_bf16.float()) + bias.float()
    ours = int8_linear(*quantize_rows(x, GROUP), codes, s_w, bias)
    checks = [f"ours vs f32: {rel_err(ours, exact):.2e}",
              f"bf16 vs f32: {rel_err(F.linear(x, w_bf16, bias), exact):.2e}"]
    contenders = {
        "ours: quantize + GEMM": lambda: int8_linear(*quantize_rows(x, GROUP), codes, s_w, bias, out=out),
        "ours: GEMM alone": lambda: int8_linear(q, s_x, codes, s_w, bias, out=out),
        "ours: gated GEMM alone": lambda: int8_linear_gated(q, s_x, codes, s_w, bias, residual=residual,
                                                            gate=gate, row_map=row_map),
        "ours: quantizer alone": lambda: quantize_rows(x, GROUP, out=(q, s_x)),
        "BF16 F.linear": lambda: F.linear(x, w_bf16, bias),
    }
    if name == "out":  # the attention's output arrives turned where the QKV turned v (block_gpu._turns_v)
        t = turned_rows(x)
        turned = int8_linear(*quantize_rows(t, GROUP, turned="v"), codes, s_w, bias)
        checks.append(f"ours, rows turned, vs f32: {rel_err(turned, exact):.2e}")
        contenders["ours: turned quantize + GEMM"] = lambda: int8_linear(*quantize_rows(t, GROUP, turned="v"),
                                                                        codes, s_w, bias, out=out)
        contenders["ours: turned quantizer alone"] = lambda: quantize_rows(t, GROUP, turned="v", out=(q, s_x))
        contenders["ours: plain rows' one-pass quantizer alone"] = lambda: quantize_turned(x, None, out=(q, s_x))
    if name == "w2":  # UP's SwiGLU epilogue turns the hidden rows for an INT8 DOWN (block_gpu._turns_hidden)
        t = turned_rows(x, TURNED["hidden"])
        turned = int8_linear(*quantize_rows(t, GROUP, turned="hidden"), codes, s_w, bias)
        checks.append(f"ours, rows turned, vs f32: {rel_err(turned, exact):.2e}")
        contenders["ours: turned quantize + GEMM"] = lambda: int8_linear(*quantize_rows(t, GROUP, turned="hidden"),
                                                                        codes, s_w, bias, out=out)
        contenders["ours: turned quantizer alone"] = lambda: quantize_rows(t, GROUP, turned="hidden", out=(q, s_x))
    if name == "w1+w3":  # the turn's cost in UP's SwiGLU epilogue
        hidden = torch.empty(M, n // 2, dtype=torch.bfloat16, device="cuda")
        contenders["ours: SwiGLU GEMM alone"] = lambda: int8_linear(q, s_x, codes, s_w, bias, out=hidden, swiglu=True)
        contenders["ours: SwiGLU GEMM alone, rows turned"] = lambda: int8_linear(
            q, s_x, codes, s_w, bias, out=hidden, swiglu=True, turn_hidden=True)
    for label, fn in kitchen.items():
        try:
            checks.append(f"{label} vs f32: {rel_err(fn(x, codes, scale, bias), exact):.2e}")
        except Exception as e:  # noqa: BLE001 - kitchen's failure is a finding, not the bench's end
            checks.append(f"{label} failed: {type(e).__name__}: {e}")
            continue
        contenders[f"{label}: full linear"] = (lambda fn=fn: fn(x, codes, scale, bias))
    rows = []
    for label, fn in contenders.items():
        eager, graphed = time_or_note(fn, runs, False), time_or_note(fn, runs, True)
        flops = 2 * M * n * k
        tops = "-" if "quantizer" in label else ", ".join(
            f"{flops / float(t) / 1e9:.0f}" if not t.startswith("n/a") else "n/a" for t in (eager, graphed))
        rows.append(f"| {name} {k}x{n} | {label} | {eager} | {graphed} | {tops} |")
    return rows, checks


# Tiles outside the candidates, to see whether any beats the fixed Hopper ones: a K depth of 256 (fewer waits per
# tile), other row-group widths for the L2 reuse of weight columns, a 64-row tile, and the persistent SwiGLU-able form.
SWEEP_EXTRA = [config(128, 256, 256, 8, 2, tma=True, persistent=True), config(128, 256, 128, 8, 4, tma=True,
               persistent=True, group_m=4), config(128, 256, 128, 8, 4, tma=True, persistent=True, group_m=16),
               config(64, 256, 128, 4, 4, tma=True, persistent=True), config(128, 256, 128, 8, 3, tma=True,
               persistent=True, subtile=2)]


# One warpgroup a program, small enough that two programs share an SM (shared memory under half of 227 KB, registers
# under 256 a thread: tests/kernels/sm90_builds.py): one's epilogue runs while the other's products do, as two
# ping-pong consumer warpgroups would, where the 8-warp 128 x 256 tile leaves the matrix cores idle in its epilogue.
TWO_A_SM = {"128x128x128 w4 s3 tma": config(128, 128, 128, 4, 3, tma=True),
            "128x128x64 w4 s4 tma": config(128, 128, 64, 4, 4, tma=True)}


def bench_two_a_sm(runs):
    """The GEMM alone at Z-Image's shapes, bf16 out / gated / SwiGLU: its fixed Hopper tiles against TWO_A_SM's."""
    rows = []
    for _, k, n in SHAPES:
        q, s_x, w, s_w = random_codes(k, n)
        out, residual = torch.empty(M, n, dtype=torch.bfloat16, device="cuda"), torch.zeros(M, n, device="cuda")
        gate, row_map = torch.ones(1, n, device="cuda"), torch.zeros(M, dtype=torch.int32, device="cuda")
        cells = []
        for tile in [None] + [launch_of(t) for t in TWO_A_SM.values()]:
            cells.append(" / ".join(time_or_note(fn, runs, True) for fn in (
                lambda: int8_linear(q, s_x, w, s_w, out=out, tiles=tile),
                lambda: int8_linear_gated(q, s_x, w, s_w, residual=residual, gate=gate, row_map=row_map, tiles=tile),
                lambda: int8_linear(q, s_x, w, s_w, swiglu=True, tiles=tile))))
        rows.append(f"| {k}x{n} | " + " | ".join(cells) + " |")
    return rows


def random_codes(k: int, n: int):
    """(q [M, k], s_x, w [n, k], s_w) on the GPU: random codes, scales 1e-3, the same for a shape every time."""
    g = torch.Generator().manual_seed(k + n)
    q = torch.randint(-128, 128, (M, k), generator=g, dtype=torch.int8).cuda()
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8).cuda()
    return q, torch.full((M,), 1e-3, device="cuda"), w, torch.full((n,), 1e-3, device="cuda")


def gemm_sweep(runs):
    """Rows: a tile variant, then graph ms of the GEMM alone per shape, bf16 out / gated (one gate row) / SwiGLU:
    both forms' candidate tiles, the epilogue on column halves of every TMA tile (and quarters of the 256-wide
    ones: fewer spills, tests/kernels/sm90_builds.py), and SWEEP_EXTRA."""
    variants = []
    for c in candidate_tiles(False) + candidate_tiles(True) + SWEEP_EXTRA:
        tile = launch_of(c)
        for tiles in (tile, dict(tile, SUBTILE=2), dict(tile, SUBTILE=4)):
            if tiles not in variants and (not tiles["SUBTILE"] or tiles["TMA"] and tiles["BLOCK_N"] >= 128 * (
                    tiles["SUBTILE"] // 2)):
                variants.append(tiles)
    rows = []
    for tiles in variants:
        cells = []
        for _, k, n in SHAPES:
            q, s_x, w, s_w = random_codes(k, n)
            out, residual = torch.empty(M, n, dtype=torch.bfloat16, device="cuda"), torch.zeros(M, n, device="cuda")
            gate, row_map = torch.ones(1, n, device="cuda"), torch.zeros(M, dtype=torch.int32, device="cuda")
            plain = time_or_note(lambda: int8_linear(q, s_x, w, s_w, out=out, tiles=tiles), runs, True)
            gated = time_or_note(lambda: int8_linear_gated(q, s_x, w, s_w, residual=residual, gate=gate,
                                                           row_map=row_map, tiles=tiles), runs, True)
            swiglu = time_or_note(lambda: int8_linear(q, s_x, w, s_w, swiglu=True, tiles=tiles), runs, True)
            cells.append(f"{plain} / {gated} / {swiglu}")
        name = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K} g{GROUP_M} w{num_warps} s{num_stages}".format(**tiles) + "".join(
            f" {flag.lower()}" for flag in ("TMA", "PERSISTENT") if tiles[flag]) + (
            f" subtile {tiles['SUBTILE']}" if tiles["SUBTILE"] else "")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    return rows


def bench_qkv_rope(runs):
    """Z-Image's QKV product then the q/k head norm and rotary: two launches against qkv_rope_linear's one."""
    from kernels.head_norm_rope import head_norm_rope
    g = torch.Generator().manual_seed(5)
    heads, head, k = 30, 128, 3840
    q = torch.randint(-128, 128, (M, k), generator=g, dtype=torch.int8).cuda()
    w = torch.randint(-128, 128, (3 * heads * head, k), generator=g, dtype=torch.int8).cuda()
    s_x, s_w = torch.full((M,), 1e-3, device="cuda"), torch.full((3 * heads * head,), 1e-3, device="cuda")
    bias = torch.randn(3 * heads * head, generator=g).to("cuda", torch.bfloat16)
    angles = 50 * torch.rand(M, head // 2, generator=g).cuda()
    norms = (torch.ones(head, device="cuda"), torch.ones(head, device="cuda"))
    cos, sin = angles.cos(), angles.sin()
    two = lambda: head_norm_rope(int8_linear(q, s_x, w, s_w, bias), heads, head, *norms, cos, sin)  # noqa: E731
    cells = [time_or_note(lambda t=t: qkv_rope_linear(q, s_x, w, s_w, bias, heads, head, *norms, cos, sin,
                                                      tiles=t and launch_of(t)), runs, True)
             for t in QKV_ROPE_TILES.values()]
    expected = qkv_rope_linear(q, s_x, w, s_w, bias, heads, head, *norms, cos, sin)
    same = all(torch.equal(qkv_rope_linear(q, s_x, w, s_w, bias, heads, head, *norms, cos, sin,
                                           tiles=t and launch_of(t))[i], expected[i])
               for t in QKV_ROPE_TILES.values() for i in range(3))
    alone = time_or_note(lambda: int8_linear(q, s_x, w, s_w, bias), runs, True)
    turned = time_or_note(lambda: qkv_rope_linear(q, s_x, w, s_w, bias, heads, head, *norms, cos, sin, turn_v=True),
                          runs, True)
    return [f"| QKV 3840x11520 + head norm + rotary | {alone} | {time_or_note(two, runs, True)} | " + " | ".join(cells)
            + f" | {turned} | {same} |"]


def bench_tail_split(runs):
    """The GEMM alone with its last wave's tiles split along K (kernels/int8/split_tail.py, the default) and whole, at the
    shapes where it splits at 1024^2 (split_tail.MIN_K_STEPS): Z-Image's w2 and FLUX.3 Klein's MLP output."""
    rows = []
    for name, k, n in (("Z-Image w2", 10240, 3840), ("Klein MLP out", 9216, 3072)):
        q, s_x, w, s_w = random_codes(k, n)
        residual = torch.zeros(M, n, device="cuda")
        gate, row_map = torch.ones(1, n, device="cuda"), torch.zeros(M, dtype=torch.int32, device="cuda")
        cells, outs = [], []
        for split in (True, False):
            c = Choices(split_tail=split)
            cells += [time_or_note(lambda: int8_linear(q, s_x, w, s_w, choices=c), runs, True),
                      time_or_note(lambda: int8_linear_gated(q, s_x, w, s_w, residual=residual, gate=gate,
                                                             row_map=row_map, choices=c), runs, True)]
            outs += [int8_linear(q, s_x, w, s_w, choices=c), int8_linear_gated(
                q, s_x, w, s_w, residual=torch.ones_like(residual), gate=gate, row_map=row_map, choices=c)]
        same = torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
        rows.append(f"| {name} {k}x{n} | " + " | ".join(cells) + f" | {same} |")
    return rows


# qkv_rope_linear's tiles timed beside its default (HOPPER_TILES["qkv_rope"]): its epilogue holds two whole heads a
# 256-column tile, so the best GEMM tile need not be its best.
QKV_ROPE_TILES = {"default": None, "128x256 tma persistent": config(128, 256, 128, 8, 4, tma=True, persistent=True),
                  "128x256 s3 tma persistent": config(128, 256, 128, 8, 3, tma=True, persistent=True),
                  "128x128 tma persistent": config(128, 128, 128, 8, 4, tma=True, persistent=True),
                  **{f"two a SM, {name}": tile for name, tile in TWO_A_SM.items()}}


def bench_swiglu(runs):
    """Z-Image's w1+w3 product and the down projection's quantizer: the product written whole and activated in the
    quantizer's prologue, against SwiGLU in the product's epilogue and the plain quantizer; and how many codes
    differ between the two (Triton's exp is the same in both: none should)."""
    g = torch.Generator().manual_seed(6)
    k, n = 3840, 20480
    q = torch.randint(-128, 128, (M, k), generator=g, dtype=torch.int8).cuda()
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8).cuda()
    s_x, s_w = torch.full((M,), 2e-3, device="cuda"), torch.full((n,), 2e-3, device="cuda")
    apart = lambda: quantize_rows(int8_linear(q, s_x, w, s_w), GROUP, act="swiglu")  # noqa: E731
    fused = lambda: quantize_rows(int8_linear(q, s_x, w, s_w, swiglu=True), GROUP)  # noqa: E731
    differ = (apart()[0] != fused()[0]).sum().item()
    return [f"| w1+w3 3840x20480 + SwiGLU + quantize | {time_or_note(apart, runs, True)} | "
            f"{time_or_note(fused, runs, True)} | {differ} |"]


def bench_quantizers(runs):
    """The quantizer's launch shapes, plain and with the fused prologues the block uses."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for k in (3840, 10240):
        x = torch.randn(M, k, generator=g).to("cuda", torch.bfloat16)
        residual = torch.randn(M, k, generator=g).cuda()
        mod = {"norm": "rms", "norm_weight": torch.ones(k, device="cuda"), "eps": 1e-5,
               "scale": 0.1 * torch.randn(2, k, device="cuda"),
               "shift": 0.1 * torch.randn(2, k, device="cuda"),
               "row_map": torch.zeros(M, dtype=torch.int32, device="cuda")}
        # As a one-image step runs it: one modulation row, the row statistics given (the gated residual's).
        one_row = {**mod, "scale": mod["scale"][:1], "shift": mod["shift"][:1],
                   "stats": row_stats_reference(residual, "rms", 1e-5)}
        glu = torch.randn(M, 2 * k, generator=g).to("cuda", torch.bfloat16)
        variants = {"plain bf16": (x, {}), "rms+modulation f32 (2 rows, statistics launch)": (residual, mod),
                    "rms+modulation f32 (1 row, statistics given)": (residual, one_row),
                    "swiglu bf16": (glu, {"act": "swiglu"})}
        # What the rotation alone costs as one cuBLAS product by H_256 (block-diagonal: rows of 256 values), bf16
        # out: a floor for the rotate pass, whose prologue and group maxima come on top.
        h = hadamard(GROUP, torch.bfloat16).cuda()
        cublas = time_or_note(lambda x=x, h=h: x.view(-1, GROUP) @ h, runs, True)
        rows.append(f"| {k} | rotation alone, cuBLAS x @ H_256 | {cublas} | " + " | ".join(
            "" for _ in QUANTIZER_LAUNCHES[1:]) + " |")
        for label, (rows_in, kw) in variants.items():
            times = [time_or_note(lambda launch=launch, rows_in=rows_in, kw=kw:
                                  quantize_rows(rows_in, GROUP, **kw, **launch), runs, True)
                     for launch in QUANTIZER_LAUNCHES]
            rows.append(f"| {k} | {label} | " + " | ".join(times) + " |")
    return rows


def bench_row_stats(runs):
    """The norms' row statistics (f32 rows, as the residual stream): the default launch against walking the
    columns, with each launch's largest relative difference to the reference."""
    rows = []
    launches = {"default": {}, "64 rows, walk 256": {"block_m": 64, "block_k": 256, "num_warps": 4},
                "16 rows, walk 256": {"block_m": 16, "block_k": 256, "num_warps": 4}}
    for k in (3072, 3840):
        x = 3 + torch.randn(M, k, generator=torch.Generator().manual_seed(k)).cuda()
        for norm in ("rms", "layer"):
            expected = row_stats_reference(x, norm, 1e-5)
            cells = []
            for launch in launches.values():
                err = ((row_stats(x, norm, 1e-5, **launch) - expected).abs() / expected.abs().clamp(min=1e-6)).max()
                cells.append(f"{time_or_note(lambda launch=launch: row_stats(x, norm, 1e-5, **launch), runs, True)}"
                             f" ({err.item():.0e})")
            rows.append(f"| {k} | {norm} | " + " | ".join(cells) + " |")
    head = " | ".join(f"{name}" for name in launches)
    return [f"default launch: {launch_shape(3840)} at K 3840", "", f"| K | norm | {head} |",
            "|---|---|" + "---|" * len(launches)] + rows


def print_quantizer_tables(runs):
    print("\nQuantizer alone, ms in a CUDA graph, by launch shape (block_m/num_warps/num_stages/row programs of the"
          " rotate pass, 0: one a row block):\n")
    shapes = " | ".join("/".join(str(v) for v in c.values()) for c in QUANTIZER_LAUNCHES)
    print(f"| K | input | {shapes} |")
    print("|---|---|" + "---|" * len(QUANTIZER_LAUNCHES))
    print("\n".join(bench_quantizers(runs)))
    print(f"\nRow statistics of f32 rows [{M}, K], ms in a CUDA graph (max relative difference to the reference):\n")
    print("\n".join(bench_row_stats(runs)))


def print_qkv_table(runs):
    print("\nQKV with the head norm and rotary, ms in a CUDA graph (cos/sin tables given):\n")
    print("| work | the product alone | int8_linear + head_norm_rope | " + " | ".join(
        f"fused, {t}" for t in QKV_ROPE_TILES) + " | default, v turned | q, k, v equal to the default's |")
    print("|---|---|---|" + "---|" * len(QKV_ROPE_TILES) + "---|---|")
    print("\n".join(bench_qkv_rope(runs)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--gemm-sweep", action="store_true", help="every GEMM tile variant, nothing else")
    parser.add_argument("--quantizers", action="store_true", help="the quantizer tables, nothing else")
    parser.add_argument("--qkv", action="store_true", help="the fused QKV's tiles and the tiles two programs an SM "
                        "run (TWO_A_SM), nothing else")
    parser.add_argument("--triton-gemm", action="store_true", help="ours by the Triton products where the Hopper "
                        "ones run (kernels.Choices' hopper_gemm off)")
    args = parser.parse_args()
    if args.triton_gemm:  # this bench's own names: every GEMM and fused QKV below with the Hopper kernels off
        global int8_linear, int8_linear_gated, qkv_rope_linear
        triton_gemms = Choices(hopper_gemm=False)
        int8_linear, int8_linear_gated, qkv_rope_linear = (functools.partial(f, choices=triton_gemms) for f in (
            int8_linear, int8_linear_gated, qkv_rope_linear))
    if not torch.cuda.is_available():
        sys.exit("bench_int8_linear needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, M = {M}, runs = {args.runs}\n")
    if args.gemm_sweep:
        print("| tiles | " + " | ".join(f"{name} {k}x{n}" for name, k, n in SHAPES) + " |")
        print("|---|" + "---|" * len(SHAPES))
        gemm_sweep(args.runs)
        return
    if args.quantizers:
        print_quantizer_tables(args.runs)
        return
    if args.qkv:
        print("| GEMM alone, graph ms: bf16 out / gated / SwiGLU | fixed Hopper tiles | " + " | ".join(TWO_A_SM)
              + " |\n|---|---|" + "---|" * len(TWO_A_SM))
        print("\n".join(bench_two_a_sm(args.runs)))
        print_qkv_table(args.runs)
        return
    kitchen, notes = kitchen_linears()
    print("| linear K x N | contender | ms eager | ms graph | TOPS eager, graph |\n|---|---|---|---|---|")
    all_checks = []
    for name, k, n in SHAPES:
        rows, checks = bench_shape(name, k, n, args.runs, kitchen)
        print("\n".join(rows))
        all_checks.append(f"- {name}: " + "; ".join(checks))
    print("\nRelative Frobenius error against f32 x W_bf16^T + b (INT8 ConvRot expects about 1e-2):")
    print("\n".join(all_checks + [f"- {note}" for note in notes]))
    forms = {"bf16 out": BF16, "gated": GATED, "swiglu": SWIGLU}
    print("\nTiles: " + "; ".join(f"{name} {fixed_tiles(form, torch.device('cuda'), 3840)}" for name, form in
                                  forms.items()) + " (None: autotuned, chosen as below)")
    for name, form in forms.items():
        for key, chosen in _autotuned(form).cache.items():
            print(f"- {name} {key}: {chosen}")
    print_qkv_table(args.runs)
    print("\nThe last wave's tiles split along K, ms in a CUDA graph:\n")
    print("| GEMM alone | bf16 out, split | gated, split | bf16 out, whole | gated, whole | equal bit for bit |")
    print("|---|---|---|---|---|---|")
    print("\n".join(bench_tail_split(args.runs)))
    print("\nThe MLP's SwiGLU, ms in a CUDA graph:\n")
    print("| work | in the quantizer's prologue | in the product's epilogue | codes that differ |\n|---|---|---|---|")
    print("\n".join(bench_swiglu(args.runs)))


if __name__ == "__main__":
    main()
