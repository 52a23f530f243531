"""The hot Triton kernels built for the H200 (sm_90a) on a GPU-less host: Triton IR (test_cuda_frontend.py) and the
whole build through the wheel's ptxas, for registers, spills and shared memory before any device time is spent.

Run as a script (not under TRITON_INTERPRET, which replaces triton.jit): python tests/kernels/sm90_builds.py
prints a markdown table of each case's resources at its H200 launch (kernels/int8/tiles.py HOPPER_TILES, the
quantizer's defaults). A spill is a store to and load from local memory, which the 200+ KB of shared memory these
tiles take leaves little L1 for.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LINEAR = {**{name: "*fp32" for name in ("sx_ptr", "sw_ptr", "bias_ptr", "down_ptr", "up_ptr", "out_ptr", "gate_ptr")},
          "q_ptr": "*i8", "w_ptr": "*i8", "map_ptr": "*i32", "add_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
          "R": "i32", "M_TUNE": "i32", "sums_ptr": "*i32", "count_ptr": "*i32", "whole": "i32", "parts": "i32"}
ROTATE = {"x_ptr": "*fp32", "stride_x": "i32", "w_ptr": "*fp32", "scale_ptr": "*fp32", "shift_ptr": "*fp32",
          "map_ptr": "*i32", "h_ptr": "*bf16", "stats_ptr": "*fp32", "stride_stats": "i32", "y_ptr": "*bf16",
          "gmax_ptr": "*fp32", "g_ptr": "*bf16", "stride_g": "i32", "M": "i32", "K": "i32"}
CODES = {"y_ptr": "*bf16", "gmax_ptr": "*fp32", "q_ptr": "*i8", "s_ptr": "*fp32", "M": "i32", "K": "i32"}
FORMS = {0: "bf16 rows", 1: "gated", 2: "SwiGLU"}


def linear_case(form: int, one_gate_row: bool, tile: dict):
    """int8_linear's kernel at a tile ({BLOCK_M.., TMA, PERSISTENT, SUBTILE, num_warps, num_stages})."""
    import triton.language as tl

    from kernels.int8.linear import _int8_linear_kernel
    launch = {k: v for k, v in tile.items() if k in ("num_warps", "num_stages")}
    constants = {"HAS_BIAS": True, "HAS_LORA": False, "FORM": form, "ONE_GATE_ROW": one_gate_row,
                 "HAS_ADDEND": False, "WIDE": False, "EVEN_K": True, "LORA_DTYPE": tl.bfloat16, "BLOCK_R": 16,
                 "TURN": False, "GELU": False,
                 "TMA": False, "PERSISTENT": False, "SUBTILE": 0, "SPLIT": False,
                 **{k: v for k, v in tile.items() if k not in launch}}
    return _int8_linear_kernel, LINEAR, constants, launch


def rotate_case(norm: int, has_scale: int, act: int, group: int = 256, block_m: int = 64, num_stages: int = 2,
                gate_span: int = 0):
    """The rotate pass; gate_span: plain rows gated, a gate value over that many features (1: Krea 2's bf16 gate,
    factor 1; more: LTX-2.5's f32 gate a head, factor 2)."""
    import triton.language as tl

    from kernels.int8.quant import _rotate_kernel
    constants = {"NORM": norm, "HAS_WEIGHT": norm == 1, "HAS_SCALE": has_scale, "HAS_SHIFT": has_scale > 0,
                 "ACT": act, "X_BF16": act > 0 or (norm == 0 and has_scale == 0), "G": group,
                 "SPLIT": 4 if group == 256 else 1, "BLOCK_M": block_m, "DOT_DTYPE": tl.bfloat16,
                 "GATE_SPAN": gate_span, "GATE_FACTOR": 2.0 if gate_span > 1 else 1.0}
    signature = {**ROTATE, "x_ptr": "*bf16" if constants["X_BF16"] else "*fp32",
                 "g_ptr": "*fp32" if gate_span > 1 else "*bf16"}
    return _rotate_kernel, signature, constants, {"num_warps": 4, "num_stages": num_stages}


def qkv_rope_case(persistent: bool, turn_v: bool = False):
    """The fused QKV, head norm and rotary at its fixed tile (two heads of 128): a program a tile or persistent;
    turn_v: v's 64-column blocks turned along their top digit on the matrix cores."""
    import triton.language as tl
    from kernels.int8.tiles import HOPPER_TILES, launch_of
    from kernels.int8.qkv_rope_linear import _qkv_rope_kernel
    tile = launch_of(HOPPER_TILES["qkv_rope"])
    launch = {k: tile.pop(k) for k in ("num_warps", "num_stages")}
    signature = {"q_ptr": "*i8", "sx_ptr": "*fp32", "w_ptr": "*i8", "sw_ptr": "*fp32", "bias_ptr": "*fp32",
                 "nw_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "h_ptr": "*bf16", "out_ptr": "*bf16",
                 "M": "i32", "N": "i32", "K": "i32", "HD": "i32", "eps": "fp32", "M_TUNE": "i32"}
    constants = {"HAS_BIAS": True, "HAS_NORM": True, "D": 128, "WIDE": False, "EVEN_K": True, **tile,
                 "PERSISTENT": persistent, "SUBTILE": 0, "TURN_V": turn_v, "DOT_DTYPE": tl.bfloat16}
    return _qkv_rope_kernel, signature, constants, launch


def turned_case(k: int = 3840, turned: bool = True, gate_span: int = 0, walking: bool = False, rows: int = 1,
                num_warps: int = 4):
    """kernels/int8/quant_turned.py's pass at an attention output's width (whole rows in registers); gate_span:
    plain rows gated, as rotate_case's; walking: its programs walking the row blocks (_turned_codes_loop_kernel)."""
    import triton.language as tl

    from kernels.int8.quant_turned import BLOCK, GROUP, TURN, _turned_codes_kernel, _turned_codes_loop_kernel
    signature = {"t_ptr": "*bf16", "h_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*fp32",
                 "g_ptr": "*fp32" if gate_span > 1 else "*bf16", "stride_g": "i32", "M": "i32", "K": "i32"}
    constants = {"GROUP": GROUP, "BLOCK": BLOCK, "SPAN": TURN if turned else BLOCK,
                 "GROUPS_P2": 1 << (k // GROUP - 1).bit_length(), "ROWS": rows, "DOT_DTYPE": tl.bfloat16,
                 "GATE_SPAN": gate_span, "GATE_FACTOR": 2.0 if gate_span > 1 else 1.0}
    return _turned_codes_loop_kernel if walking else _turned_codes_kernel, signature, constants, \
        {"num_warps": num_warps}


def rows_norm_rope_case(norm: int, head: int = 128, by_axis: bool = False, row_at_once: bool = False):
    """kernels/rows_norm_rope.py (LTX-2.5's q/k rows): NORM 0 none, 1 by head, 2 across the row's heads; angles by
    row or by axis; rows in blocks walking the heads or a row at once (its 32 heads in one tile)."""
    from kernels.rows_norm_rope import _rows_norm_rope_kernel
    columns = "*i32" if by_axis else "*bf16"  # (unread without angles by axis: the launcher passes out)
    signature = {"x_ptr": "*bf16", "stride_x": "i32", "w_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                 "stride_cm": "i32", "stride_ch": "i32", "out_ptr": "*bf16", "M": "i32", "HEADS": "i32", "R": "i32",
                 "eps": "fp32", "index_ptr": columns, "stride_i": "i32", "axis_ptr": columns, "freq_ptr": columns}
    return _rows_norm_rope_kernel, signature, {"NORM": norm, "D": head, "BLOCK_D": head, "BLOCK_M": 1 if row_at_once
                                               else 16, "BY_AXIS": by_axis, "ROW_AT_ONCE": row_at_once,
                                               "BLOCK_H": 32 if row_at_once else 1}, {"num_warps": 4}


def rows_in_pairs_case(norm: int, axes: int = 0, tail: int = 0):
    """kernels/rows_norm_rope.py's rows walking the heads by rotary pairs (its default launch: 16 rows, 4 warps), 32
    heads of 128, angles by row or by axis (axes > 0), tail: columns past the pairs."""
    from kernels.rows_norm_rope import _pairs_kernel
    columns = "*i32" if axes else "*bf16"
    signature = {"x_ptr": "*bf16", "stride_x": "i32", "w_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                 "stride_cm": "i32", "stride_ch": "i32", "out_ptr": "*bf16", "M": "i32", "HEADS": "i32", "R": "i32",
                 "eps": "fp32", "index_ptr": columns, "stride_i": "i32", "axis_ptr": columns, "freq_ptr": columns}
    return _pairs_kernel, signature, {"NORM": norm, "D": 128, "BLOCK_R": 64 - tail // 2, "BLOCK_T": tail,
                                      "BLOCK_M": 16, "AXES": axes}, {"num_warps": 4}


def group_norm_last_case(cg: int):
    """kernels/group_norm.py's channels-last pass 2 (the statistics' combine and the norm, SiLU on), 32 groups of
    cg channels; its pass 1 lowers with it (the same tiles)."""
    from kernels.group_norm import _last_apply_kernel
    signature = {"x_ptr": "*bf16", "y_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "shift_ptr": "*fp32",
                 "stats_ptr": "*fp32", "S": "i32", "PIECE": "i32", "PIECES": "i32", "eps": "fp32"}
    constants = {"G": 32, "CG": cg, "SILU": True, "BLOCK_S": 4096 // (32 * cg), "PARTS": 64}
    return _last_apply_kernel, signature, constants, {"num_warps": 4}


def channel_rms_case(c: int):
    """kernels/channel_rms.py at the Qwen-Image decoder's widest tile (384 channels in 512 columns), SiLU on."""
    from kernels.channel_rms import _channel_rms_kernel, block_m
    signature = {"x_ptr": "*bf16", "s_ptr": "*fp32", "g_ptr": "*fp32", "y_ptr": "*bf16", "M": "i32"}
    constants = {"C": c, "SILU": True, "BLOCK_M": block_m(c), "BLOCK_C": 512}
    return _channel_rms_kernel, signature, constants, {"num_warps": 4}


def frontend_cases() -> dict:
    """name -> (kernel, signature, constants, launch): the forms and branches the interpreter cannot type-check."""
    cases = {}
    for form, one in ((0, False), (1, True), (1, False), (2, False)):
        for tma, persistent, subtile in ((True, True, 4), (True, False, 2), (True, True, False), (False, False, False)):
            tile = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "TMA": tma,
                    "PERSISTENT": persistent, "SUBTILE": subtile, "num_warps": 8, "num_stages": 4}
            cases[f"int8_linear {FORMS[form]}{'' if one or form != 1 else ' (gathered)'} tma {tma} persistent "
                  f"{persistent} subtile {subtile}"] = linear_case(form, one, tile)
    kernel, signature, constants, launch = linear_case(1, False, {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128,
                                                                  "GROUP_M": 8, "TMA": True, "PERSISTENT": True,
                                                                  "SUBTILE": 4, "num_warps": 8, "num_stages": 4})
    cases["int8_linear gated with an addend"] = (kernel, signature, {**constants, "HAS_ADDEND": True}, launch)
    kernel, signature, constants, launch = linear_case(2, False, {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128,
                                                                  "GROUP_M": 8, "TMA": True, "PERSISTENT": True,
                                                                  "SUBTILE": 0, "num_warps": 8, "num_stages": 4})
    cases["int8_linear SwiGLU, rows turned"] = (kernel, signature, {**constants, "TURN": True}, launch)
    for subtile in (0, 4):  # a GELU MLP's UP (LTX-2.5): GELU, its rows turned; whole tiles and a tail's quarters
        kernel, signature, constants, launch = linear_case(0, False, {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128,
                                                                      "GROUP_M": 8, "TMA": True, "PERSISTENT": True,
                                                                      "SUBTILE": subtile, "num_warps": 8,
                                                                      "num_stages": 4})
        gelu = {**constants, "GELU": True, "TURN": True}
        cases[f"int8_linear GELU, rows turned, subtile {subtile}"] = (kernel, signature, gelu, launch)
    for form in (1, 2):  # 64-bit offsets (2^31 outputs or more: too large to run in a test)
        kernel, signature, constants, launch = linear_case(form, False, {"BLOCK_M": 128, "BLOCK_N": 256,
                                                                         "BLOCK_K": 128, "GROUP_M": 8, "TMA": True})
        cases[f"int8_linear {FORMS[form]} wide"] = (kernel, signature, {**constants, "WIDE": True}, launch)
    cases.update(split_cases())
    for norm, has_scale, act in ((2, 1, 0), (1, 2, 0), (0, 0, 0), (0, 0, 1), (0, 0, 2)):
        for group in (256, 64):
            cases[f"rotate norm {norm} modulation {has_scale} act {act} group {group}"] = rotate_case(
                norm, has_scale, act, group)
    for norm in (0, 1, 2):
        cases[f"rows_norm_rope norm {norm}"] = rows_norm_rope_case(norm)
        cases[f"rows_norm_rope norm {norm}, a row at once"] = rows_norm_rope_case(norm, row_at_once=True)
    cases["rows_norm_rope angles by axis"] = rows_norm_rope_case(2, by_axis=True)
    cases["rows_norm_rope angles by axis, a row at once"] = rows_norm_rope_case(2, by_axis=True, row_at_once=True)
    for norm in (0, 1, 2):
        cases[f"rows_norm_rope by pairs, norm {norm}"] = rows_in_pairs_case(norm)
    cases["rows_norm_rope by pairs, angles by 3 axes"] = rows_in_pairs_case(2, axes=3)
    cases["rows_norm_rope by pairs, angles by 4 axes, columns past the pairs"] = rows_in_pairs_case(1, 4, tail=64)
    for span in (1, 128):
        cases[f"rotate gated, a gate value over {span}"] = rotate_case(0, 0, 0, gate_span=span)
        cases[f"one pass gated, a gate value over {span}"] = turned_case(6144, turned=False, gate_span=span)
    for cg in (4, 16):
        cases[f"group norm channels last, {cg} channels a group"] = group_norm_last_case(cg)
    cases["channel rms, 384 channels"] = channel_rms_case(384)
    cases["one pass gated a head, its programs walking the rows"] = turned_case(4096, False, 128, walking=True)
    cases["one pass turned, its programs walking the rows"] = turned_case(3840, True, walking=True, rows=2)
    from kernels.int8.codes import _codes_kernel
    cases["codes"] = (_codes_kernel, CODES, {"GROUPS": 15, "GROUPS_P2": 16, "BLOCK_M": 16, "BLOCK_K": 256,
                                             "LAST_FIRST": True}, {"num_warps": 4})
    return cases


def split_cases() -> dict:
    """Each form's tail launch at its H200 tile: the last wave's tiles in parts along K (kernels/int8/split_tail.py)."""
    from kernels.int8.tiles import HOPPER_TILES, launch_of
    return {f"int8_linear {FORMS[form]}{' one gate row' if one else ''}, tail split (H200 tile, subtile 4)":
            linear_case(form, one, {**launch_of(HOPPER_TILES[form]), "PERSISTENT": False, "SUBTILE": 4, "SPLIT": True})
            for form, one in ((0, False), (1, True), (1, False), (2, False))}


def resource_cases() -> dict:
    """name -> case: what the H200 runs (HOPPER_TILES by form; the quantizer's launches) and the subtile variants."""
    from kernels.int8.tiles import HOPPER_TILES, launch_of
    cases = {}
    for form in (0, 1, 2):
        tile = launch_of(HOPPER_TILES[form])
        for subtile in sorted({tile.get("SUBTILE", False), 4} - {False} | ({False} if form != 1 else set())):
            for one in ((True, False) if form == 1 else (False,)):
                label = f"int8_linear {FORMS[form]}" + (" one gate row" if one else " (gathered)" if form == 1 else "")
                default = subtile == tile.get("SUBTILE", False)
                cases[f"{label}, subtile {subtile}{' (H200 default)' if default else ''}"] = linear_case(
                    form, one, {**tile, "SUBTILE": subtile})
    cases.update(split_cases())
    cases["qkv_rope, a program a tile (H200 default: 0.402 ms at Z-Image's QKV)"] = qkv_rope_case(False)
    cases["qkv_rope, persistent (0.404 ms)"] = qkv_rope_case(True)
    cases["qkv_rope, v turned"] = qkv_rope_case(False, turn_v=True)
    cases["turned rows: radix-4 and codes, K 3840"] = turned_case()
    cases["plain rows in one pass, K 3840"] = turned_case(turned=False)
    cases["rotate: modulated layer norm, 2 rows in runs (Klein)"] = rotate_case(2, 1, 0)
    cases["rotate: modulated RMS norm, 1 row (Z-Image)"] = rotate_case(1, 2, 0)
    cases["rotate: plain bf16 rows (16 programs, 3 stages)"] = rotate_case(0, 0, 0, num_stages=3)
    cases["rotate: SwiGLU"] = rotate_case(0, 0, 1)
    cases["rotate: gated rows (Krea 2's attention gate, 2 stages)"] = rotate_case(0, 0, 0, gate_span=1)
    cases["rotate: gated rows, a gate a head of 128 (LTX-2.5, 2 stages)"] = rotate_case(0, 0, 0, gate_span=128)
    cases["gated rows in one pass, K 4096, a gate a head (LTX-2.5)"] = turned_case(4096, turned=False, gate_span=128)
    for rows, warps in ((1, 4), (2, 4), (2, 8)):
        cases[f"gated rows in one pass, walking, {rows} rows on {warps} warps"] = turned_case(
            4096, False, 128, walking=True, rows=rows, num_warps=warps)
    return cases


def _target():
    from triton.backends.compiler import GPUTarget
    return GPUTarget("cuda", 90, 32)


def lower(kernel, signature: dict, constants: dict) -> str:
    """Triton IR of the kernel for sm_90 (triton's CompilationError where the frontend rejects it)."""
    from triton._C.libtriton import ir
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
    backend = CUDABackend(_target())
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(kernel, {**signature, **{name: "constexpr" for name in constants}}, constants)
    return str(source.make_ir(_target(), options, backend.get_codegen_implementation(options),
                              backend.get_module_map(), context))


def launch_divisibility(kernel, signature: dict) -> dict:
    """What triton.jit assumes at the H200 launches: every pointer (torch's allocations) and every integer argument
    (Z-Image's and Klein's sizes, strides) a multiple of 16, so loads and stores vectorize as they do there."""
    names = list(kernel.arg_names)
    return {(names.index(name),): [["tt.divisibility", 16]] for name, kind in signature.items()
            if kind.startswith("*") or kind == "i32"}


def resources(kernel, signature: dict, constants: dict, launch: dict) -> dict:
    """The whole build for sm_90a: registers, stack, spill stores and loads (bytes a thread), shared memory."""
    import triton
    from triton.compiler import ASTSource
    built = triton.compile(ASTSource(kernel, {**signature, **{name: "constexpr" for name in constants}}, constants,
                                     launch_divisibility(kernel, signature)),
                           target=_target(), options={**launch, "enable_fp_fusion": False})
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas = next(p for p in (ptxas / "ptxas-blackwell", ptxas / "ptxas") if p.exists())  # the one that takes the PTX
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(built.asm["ptx"])
        report = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", str(ptx), "-o", os.devnull],
                                capture_output=True, text=True)
    text = report.stdout + report.stderr
    spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    regs = re.search(r"Used (\d+) registers", text)
    if not (spill and regs):
        raise RuntimeError(f"ptxas said: {text[-800:]}")
    return {"registers": int(regs.group(1)), "stack": int(spill.group(1)), "spill stores": int(spill.group(2)),
            "spill loads": int(spill.group(3)), "shared": built.metadata.shared}


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    print(f"Triton {triton.__version__}, sm_90a (the device's Triton decides: install its version to a folder and put "
          f"it first on PYTHONPATH)\n")
    print("| kernel at its H200 launch | registers | stack B | spill stores B | spill loads B | shared KB |")
    print("|---|---|---|---|---|---|")
    for name, (kernel, signature, constants, launch) in resource_cases().items():
        r = resources(kernel, signature, constants, launch)
        print(f"| {name} | {r['registers']} | {r['stack']} | {r['spill stores']} | {r['spill loads']} | "
              f"{r['shared'] / 1024:.0f} |")
