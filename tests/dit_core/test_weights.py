"""dit_core weights: INT8 ConvRot / FP8 / W4A8 reading, quantizing and the INT8 linear against comfy-kitchen 0.2.40.

comfy-kitchen's eager backend is the oracle (reference/int8_convrot_format.md section 11); its CPU wheel runs
without a GPU. Files are written the way ComfyUI writes them (sections 1, 2, 8, 9).
"""
import json
import math
import struct

import comfy_kitchen
import numpy as np
import pytest
import torch
from comfy_kitchen.tensor.w4a8_int8 import (
    dequantize_w4a8_int8_weight,
    quantize_w4a8_int8_weight,
    w4a8_int8_linear,
)
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dit_core.linear import int8_product, linear
from swiftdit.quantize import main as quantize_main
from swiftdit.quantize import quantize_file
from dit_core.weights import (
    Checkpoint,
    Linear,
    WeightsError,
    dequantize_convrot,
    glu_rows,
    quantize_convrot,
    read_linear,
    stack_rows,
)

KITCHEN = torch.ops.comfy_kitchen
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # kitchen's output dtype codes
LAYER = "model.diffusion_model.layers.0.attention.qkv"


@pytest.fixture(autouse=True)
def eager_kitchen():
    """Pin kitchen to its eager backend: the bit-exact CPU reference."""
    torch.manual_seed(0)
    with comfy_kitchen.use_backend("eager"):
        yield


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def marker(conf: dict, pad: int = 0) -> torch.Tensor:
    """A `.comfy_quant` tensor as ComfyUI writes it (json.dumps default separators), optionally NUL-padded."""
    return torch.tensor(list(json.dumps(conf).encode("utf-8") + b"\x00" * pad), dtype=torch.uint8)


def write(tmp_path, tensors: dict, metadata: dict | None = None, name: str = "model.safetensors") -> Checkpoint:
    path = tmp_path / name
    save_file(tensors, str(path), metadata=metadata)
    return Checkpoint(path)


CONVROT = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}


# --- quantization and the INT8 linear against kitchen ----------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("group", [256, 64])
@pytest.mark.parametrize("n,k", [(13, 256), (8, 512), (37, 3840), (1, 768)])
def test_quantize_convrot_matches_kitchen(n, k, group, dtype):
    w = (torch.randn(n, k) * 0.02).to(dtype)
    w[0, 3] = 0.5  # an outlier: most codes small, the row absmax far away
    q, s = quantize_convrot(w, group)
    q_ref, s_ref = KITCHEN.quantize_int8_convrot_weight(w, group)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (n, 1)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("n,k,group", [(37, 512, 256), (10, 3840, 64)])
def test_int8_linear_matches_kitchen(n, k, group, with_bias, dtype):
    w = torch.randn(n, k) * 0.02
    q, s = KITCHEN.quantize_int8_convrot_weight(w, group)
    x = (torch.randn(2, 7, k) * 2).to(dtype)
    b = (torch.randn(n) * 0.1).to(dtype) if with_bias else None
    lin = Linear(q, None if b is None else b.float(), s, group)
    ours = linear(x, lin)
    # kitchen with f32 output: the same quantized product, no output rounding
    assert rel(ours, KITCHEN.int8_linear(x, q, s, b, 0, True, group)) <= 1e-3
    # ComfyUI's call (output in x's dtype): product rounded to it, then + bias in it (doc section 6)
    native = int8_product(x, lin).to(dtype)
    native = native + b if b is not None else native
    kitchen = KITCHEN.int8_linear(x, q, s, b, DTYPE_CODE[dtype], True, group)
    assert kitchen.dtype == dtype and rel(native, kitchen) <= 1e-3
    exact = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    assert rel(ours, exact) < 3e-2  # INT8 noise (~1e-2); un-rotated weights would give ~1


@pytest.mark.parametrize("group", [256, 64])
def test_dequantize_round_trip(group):
    w = torch.randn(96, 1024) * 0.02
    q, s = quantize_convrot(w, group)
    back = dequantize_convrot(q, s, group)
    # Uniform rounding noise of step s per rotated element has variance s^2/12 (s = row absmax/127); the
    # rotation is orthogonal, so the error energy is the same in the native basis.
    predicted = math.sqrt((s.double().square() / 12).sum().item() * w.shape[1] / w.double().square().sum().item())
    assert 0.3 * predicted <= rel(back, w) <= 1.5 * predicted
    assert torch.equal(back, KITCHEN.dequantize_int8_convrot_weight(q, s, group))


# --- INT8 files as ComfyUI writes them ---------------------------------------------------------------------

def _int8_variant(kind: str, w: torch.Tensor, bias: torch.Tensor):
    """(tensors, header metadata, expected codes, expected scales, group) of one INT8 file variant."""
    group = 64 if kind == "group64" else 256
    if kind == "tensorwise":
        q, s = comfy_kitchen.quantize_int8_tensorwise(w)
        conf, group = {"format": "int8_tensorwise"}, 0
    else:
        q, s = KITCHEN.quantize_int8_convrot_weight(w, group)
        conf = {**CONVROT, "convrot_groupsize": group}
    tensors = {f"{LAYER}.weight": q, f"{LAYER}.bias": bias,
               f"{LAYER}.weight_scale": s.reshape(-1) if kind == "scale_N" else s}
    metadata = None
    if kind == "header_metadata":
        metadata = {"_quantization_metadata": json.dumps({"layers": {LAYER: conf}})}
    elif kind == "params":
        tensors[f"{LAYER}.comfy_quant"] = marker({"format": "int8_tensorwise", "params": {
            "convrot": True, "convrot_groupsize": group}})
    else:
        tensors[f"{LAYER}.comfy_quant"] = marker(conf, pad=5 if kind == "nul_padded" else 0)
    return tensors, metadata, q, s, group


@pytest.mark.parametrize("kind", ["comfy_quant", "header_metadata", "params", "nul_padded", "scale_N", "group64",
                                  "tensorwise"])
def test_int8_file_variants_read_back(tmp_path, kind):
    w, bias = torch.randn(20, 512) * 0.02, torch.randn(20).to(torch.bfloat16)
    tensors, metadata, q, s, group = _int8_variant(kind, w, bias)
    lin = read_linear(write(tmp_path, tensors, metadata), LAYER)
    assert lin.quantized and lin.group == group and torch.equal(lin.weight, q)
    assert torch.equal(lin.scale.reshape(-1), s.reshape(-1)) and torch.equal(lin.bias, bias.float())
    if group:
        assert lin.scale.shape == (20, 1)
        assert torch.equal(lin.dequantized(), KITCHEN.dequantize_int8_convrot_weight(q, s, group))
    else:
        assert lin.scale.dim() == 0 and torch.equal(lin.dequantized(), q.float() * s)
    x = torch.randn(3, 512).to(torch.bfloat16)
    assert rel(linear(x, lin), KITCHEN.int8_linear(x, q, s, bias, 0, bool(group), group or 256)) <= 1e-3


# --- FP8 ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["comfy_quant", "header_metadata", "legacy_scaled_fp8"])
def test_fp8_reads_as_int8_convrot(tmp_path, kind):
    w = torch.randn(24, 512) * 0.05
    scale = (w.abs().max() / 448).reshape(())
    w8 = (w / scale).to(torch.float8_e4m3fn)
    tensors, metadata = {f"{LAYER}.weight": w8}, None
    if kind == "legacy_scaled_fp8":  # ComfyUI's old form: a dtype-only marker and per-layer scale_weight
        tensors.update({"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn), f"{LAYER}.scale_weight": scale})
    else:
        tensors[f"{LAYER}.weight_scale"] = scale
        if kind == "comfy_quant":
            tensors[f"{LAYER}.comfy_quant"] = marker({"format": "float8_e4m3fn"})
        else:
            metadata = {"_quantization_metadata": json.dumps({"layers": {LAYER: {"format": "float8_e4m3fn"}}})}
    lin = read_linear(write(tmp_path, tensors, metadata), LAYER)
    q, s = quantize_convrot(w8.float() * scale, 256)
    assert lin.group == 256 and torch.equal(lin.weight, q) and torch.equal(lin.scale, s)


def test_a_checkpoint_tells_the_bytes_it_reads(tmp_path):
    """read(nbytes) after each tensor a load takes (get or read_into): the file's tensor bytes in all."""
    ckpt = write(tmp_path, {"a": torch.zeros(3, 5), "b": torch.ones(7, dtype=torch.bfloat16)})
    got = []
    ckpt.read = got.append
    ckpt.get("a")
    ckpt.read_into("b", torch.empty(14, dtype=torch.uint8))
    assert got == [60, 14] and ckpt.total_bytes() == 74


def test_a_linear_converted_where_it_is_placed_stays_there(tmp_path):
    """computed_on's placed_on: an FP8 linear requantized on the device its caller places it on (a text encoder
    loaded on the card) stays there, codes, scales and bias alike, instead of a trip to the host and back; computed
    elsewhere, or placed elsewhere, it comes back to the host as before."""
    w = torch.randn(24, 512) * 0.05
    scale = (w.abs().max() / 448).reshape(())
    ckpt = write(tmp_path, {f"{LAYER}.weight": (w / scale).to(torch.float8_e4m3fn), f"{LAYER}.weight_scale": scale,
                            f"{LAYER}.bias": torch.randn(24)})
    meta = torch.device("meta")  # (a device with no data: what stays there is never brought back)
    lin = read_linear(ckpt, LAYER, compute_on=meta, placed_on=meta)
    assert {t.device.type for t in (lin.weight, lin.scale, lin.bias)} == {"meta"} and lin.weight.dtype == torch.int8
    assert read_linear(ckpt, LAYER, placed_on=meta).weight.device.type == "cpu"  # computed on the host: stays there


def test_load_arithmetic_falls_back_to_the_host_when_its_device_is_full(tmp_path, monkeypatch):
    """computed_on: a linear whose arithmetic does not fit on the device asked for is computed where the file is
    read, the same as without a device (an FP8 linear here)."""
    import dit_core.weights.linear as linear_module
    w = torch.randn(24, 512) * 0.05
    scale = (w.abs().max() / 448).reshape(())
    ckpt = write(tmp_path, {f"{LAYER}.weight": (w / scale).to(torch.float8_e4m3fn), f"{LAYER}.weight_scale": scale})
    seen, real = [], linear_module.quantize_convrot

    def quantize(weight, group):
        seen.append(weight.device.type)
        if weight.device.type == "meta":
            raise torch.OutOfMemoryError("CUDA out of memory (a test)")
        return real(weight, group)

    monkeypatch.setattr(linear_module, "quantize_convrot", quantize)
    lin = read_linear(ckpt, LAYER, compute_on=torch.device("meta"))
    want = read_linear(ckpt, LAYER)
    assert seen == ["meta", "cpu", "cpu"] and lin.weight.device.type == "cpu"
    assert torch.equal(lin.weight, want.weight) and torch.equal(lin.scale, want.scale)


# --- W4A8 --------------------------------------------------------------------------------------------------

W4A8_MARKER = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}


def slow_w4a8_decode(packed, s_rel, codebook, k, bits, group=16) -> torch.Tensor:
    """Per element, straight from the format doc (section 9): nibble plane, then the 2-bit plane."""
    rows, scales = packed.view(torch.uint8).tolist(), s_rel.float().numpy()
    book = None if codebook is None else codebook.float().numpy()
    out = np.zeros((len(rows), k), dtype=np.int8)
    for n, row in enumerate(rows):
        for c in range(k):
            code = (row[c // 2] >> (4 * (c % 2))) & 0xF  # even column = low nibble
            if bits == 6:
                code |= ((row[k // 2 + c // 4] >> (2 * (c % 4))) & 0x3) << 4
            level = book[code] if book is not None else np.float32(code - (8 if bits == 4 else 32))
            value = np.float32(level) * scales[n, c // group]  # f32 product, then round half to even
            out[n, c] = np.clip(np.rint(value), -127, 127)
    return torch.from_numpy(out)


@pytest.mark.parametrize("s_rel_u8", [True, False], ids=["s_rel_u8", "s_rel_fp8"])
@pytest.mark.parametrize("bits,codebook", [(4, True), (4, False), (6, False)], ids=["w4_codebook", "w4_uniform", "w6"])
def test_w4a8_decodes_like_kitchen(tmp_path, monkeypatch, bits, codebook, s_rel_u8):
    n, k = 20, 512
    monkeypatch.setattr("dit_core.weights.w4a8.DECODE_ELEMENTS", 3 * k)  # decode in chunks of 3 rows, last one short
    w = torch.randn(n, k) * 0.02
    packed, s_rel, s_ch, _, book = quantize_w4a8_int8_weight(w, group_size=16, convrot_groupsize=256, bits=bits,
                                                             codebook=codebook)
    assert (book is not None) == codebook and packed.shape == (n, k * bits // 8)
    bias = torch.randn(n)
    tensors = {f"{LAYER}.weight": packed, f"{LAYER}.bias": bias, f"{LAYER}.weight_s_channel": s_ch,
               f"{LAYER}.weight_s_rel": s_rel.view(torch.uint8) if s_rel_u8 else s_rel,
               f"{LAYER}.comfy_quant": marker(W4A8_MARKER)}
    if book is not None:
        tensors[f"{LAYER}.weight_codebook"] = book
    lin = read_linear(write(tmp_path, tensors), LAYER)
    assert lin.quantized and lin.group == 256 and torch.equal(lin.scale, s_ch.reshape(n, 1))
    assert torch.equal(lin.weight, slow_w4a8_decode(packed, s_rel, book, k, bits))
    kitchen_w = dequantize_w4a8_int8_weight(packed, s_rel, s_ch, codebook=book, output_dtype=torch.float32)
    assert torch.equal(lin.dequantized(), kitchen_w)
    x = torch.randn(5, k).to(torch.bfloat16)
    y_ref = w4a8_int8_linear(x, packed, s_rel, s_ch, codebook=book, bias=bias, out_dtype=torch.float32)
    assert rel(linear(x, lin), y_ref) <= 1e-3


@pytest.mark.parametrize("problem,fix", [
    ("has no", lambda t: t.pop(f"{LAYER}.weight_s_channel")),
    ("do not match", lambda t: t.update({f"{LAYER}.weight": torch.zeros(8, 130, dtype=torch.int8)})),
    ("do not match", lambda t: t.update({f"{LAYER}.weight_s_rel": torch.ones(8, 8, dtype=torch.uint8)})),
    ("weight_codebook", lambda t: t.update({f"{LAYER}.weight_codebook": torch.ones(15)})),
    ("convrot_groupsize", lambda t: t.update({f"{LAYER}.comfy_quant": marker({**W4A8_MARKER,
                                                                               "convrot_groupsize": 100})})),
])
def test_w4a8_malformed_raises(tmp_path, problem, fix):
    tensors = {f"{LAYER}.weight": torch.zeros(8, 128, dtype=torch.int8),
               f"{LAYER}.weight_s_rel": torch.ones(8, 16, dtype=torch.uint8),
               f"{LAYER}.weight_s_channel": torch.ones(8), f"{LAYER}.comfy_quant": marker(W4A8_MARKER)}
    fix(tensors)
    with pytest.raises(WeightsError, match=problem) as err:
        read_linear(write(tmp_path, tensors, name="bad_w4a8.safetensors"), LAYER)
    assert "bad_w4a8.safetensors" in str(err.value) and LAYER in str(err.value)


# --- the quantize tool --------------------------------------------------------------------------------------

def tiny_dit() -> dict:
    bf = torch.bfloat16
    return {
        "x_embedder.weight": torch.randn(64, 16).to(bf), "x_embedder.bias": torch.randn(64).to(bf),
        "t_embedder.mlp.0.weight": torch.randn(256, 256).to(bf),
        "x_pad_token": torch.randn(1, 256).to(bf),
        "layers.0.attention.qkv.weight": torch.randn(768, 256).to(bf),
        "layers.0.attention.out.weight": torch.randn(256, 256).to(bf),
        "layers.0.attention.out.bias": torch.randn(256).to(bf),
        "layers.0.attention.norm_q.weight": torch.ones(32, dtype=bf),
        "layers.0.attention_norm1.weight": torch.ones(256, dtype=bf),
        "layers.0.feed_forward.w1.weight": torch.randn(690, 256).to(bf),
        "layers.0.feed_forward.w2.weight": torch.randn(256, 690).to(bf),  # K % 256 != 0: stays bf16
        "layers.0.adaLN_modulation.0.weight": torch.randn(1024, 256),  # an f32 source
        "layers.0.adaLN_modulation.0.bias": torch.randn(1024),
        "final_layer.linear.weight": torch.randn(13, 256).to(torch.float16),
        "final_layer.conv.weight": torch.randn(8, 4, 2, 2).to(bf),
        "rope.theta": torch.tensor(10000.0),
    }


# --- NVFP4 (and NVFP4-AWQ) -----------------------------------------------------------------------------------

def nvfp4_layer(w: torch.Tensor, pre: torch.Tensor | None = None, scales_u8: bool = False) -> dict:
    """One linear as ComfyUI stores `nvfp4` (kitchen's quantizer: codes, swizzled block scales, tensor scale)."""
    tensor_scale = w.abs().amax().float() / (448.0 * 6.0)
    packed, block = comfy_kitchen.quantize_nvfp4(w, tensor_scale)
    tensors = {f"{LAYER}.weight": packed, f"{LAYER}.weight_scale": block.view(torch.uint8) if scales_u8 else block,
               f"{LAYER}.weight_scale_2": tensor_scale, f"{LAYER}.comfy_quant": marker({"format": "nvfp4"})}
    return tensors | ({f"{LAYER}.pre_quant_scale": pre} if pre is not None else {})


@pytest.mark.parametrize("rows, cols", [(200, 9), (128, 4), (5, 1)])
def test_block_scales_unswizzle_as_kitchen(rows, cols):
    from comfy_kitchen.float_utils import from_blocked, to_blocked
    from dit_core.weights.nvfp4 import unswizzle_block_scales
    scales = torch.randn(rows, cols)
    assert torch.equal(unswizzle_block_scales(to_blocked(scales), rows, cols), scales)
    assert torch.equal(unswizzle_block_scales(to_blocked(scales), rows, cols),
                       from_blocked(to_blocked(scales), rows, cols))


@pytest.mark.parametrize("scales_u8", [False, True], ids=["scales_fp8", "scales_u8"])
@pytest.mark.parametrize("awq", [False, True], ids=["nvfp4", "nvfp4_awq"])
@pytest.mark.parametrize("n, k", [(48, 256), (200, 512)])  # 200 rows: a second, partial 128-row tile of scales
def test_nvfp4_decodes_like_kitchen(tmp_path, monkeypatch, n, k, awq, scales_u8):
    """The f32 weight is kitchen's dequantization exactly (times AWQ's pre_quant_scale along the inputs, which
    ComfyUI multiplies the input by); the layer is its INT8 ConvRot, and its product that of ComfyUI's forward."""
    from dit_core.weights.nvfp4 import nvfp4_weight
    monkeypatch.setattr("dit_core.weights.nvfp4.DECODE_ELEMENTS", 3 * k)  # chunks of 3 rows, the last one short
    w, pre = torch.randn(n, k) * 0.02, (torch.rand(k) + 0.5 if awq else None)
    tensors = nvfp4_layer(w, pre, scales_u8) | {f"{LAYER}.bias": torch.randn(n)}
    kitchen_w = comfy_kitchen.dequantize_nvfp4(tensors[f"{LAYER}.weight"], tensors[f"{LAYER}.weight_scale_2"],
                                               tensors[f"{LAYER}.weight_scale"].view(torch.float8_e4m3fn),
                                               torch.float32)
    want = kitchen_w * pre if awq else kitchen_w
    got = nvfp4_weight(tensors[f"{LAYER}.weight"], tensors[f"{LAYER}.weight_scale"].view(torch.float8_e4m3fn),
                       tensors[f"{LAYER}.weight_scale_2"], pre)
    assert torch.equal(got, want)
    lin = read_linear(write(tmp_path, tensors), LAYER)
    assert lin.quantized and lin.group == 256 and torch.equal(lin.bias, tensors[f"{LAYER}.bias"])
    assert rel(lin.dequantized(), want) <= 1e-2  # INT8 ConvRot of the decoded weight
    x = torch.randn(5, k)
    y_comfy = torch.nn.functional.linear(x * pre if awq else x, kitchen_w, tensors[f"{LAYER}.bias"])
    assert rel(linear(x, lin), y_comfy) <= 2e-2


@pytest.mark.parametrize("problem,fix", [
    ("has no", lambda t: t.pop(f"{LAYER}.weight_scale_2")),
    ("weight_scale is", lambda t: t.update({f"{LAYER}.weight_scale": torch.ones(8, 8, dtype=torch.uint8)})),
    ("weight is", lambda t: t.update({f"{LAYER}.weight": torch.zeros(8, 128)})),
    ("weight_scale_2 is", lambda t: t.update({f"{LAYER}.weight_scale_2": torch.ones(2)})),
    ("pre_quant_scale is", lambda t: t.update({f"{LAYER}.pre_quant_scale": torch.ones(100)})),
])
def test_nvfp4_malformed_raises(tmp_path, problem, fix):
    tensors = nvfp4_layer(torch.randn(8, 256))
    fix(tensors)
    with pytest.raises(WeightsError, match=problem) as err:
        read_linear(write(tmp_path, tensors, name="bad_nvfp4.safetensors"), LAYER)
    assert "bad_nvfp4.safetensors" in str(err.value) and LAYER in str(err.value)


def test_quantize_file_writes_comfyui_layout(tmp_path):
    src, dst = tmp_path / "tiny_bf16.safetensors", tmp_path / "tiny_int8.safetensors"
    sd, meta = tiny_dit(), {"format": "pt", "modelspec.title": "tiny"}
    save_file(sd, str(src), metadata=meta)
    layers = quantize_file(src, dst)
    plain = tmp_path / "plain"
    plain.touch()  # a file made as any program makes one: the user's umask, not mkstemp's 0600
    assert dst.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    plain.unlink()
    expected = {"layers.0.attention.qkv", "layers.0.attention.out", "layers.0.feed_forward.w1",
                "layers.0.adaLN_modulation.0", "final_layer.linear"}
    assert set(layers) == expected
    out = load_file(str(dst))  # the safetensors library's own checks pass
    assert set(out) == set(sd) | {f"{la}.{s}" for la in expected for s in ("weight_scale", "comfy_quant")}
    with safe_open(str(dst), "pt") as f:
        assert f.metadata() == meta
    ckpt = Checkpoint(dst)
    for layer in expected:
        w = sd[f"{layer}.weight"]
        q_ref, s_ref = KITCHEN.quantize_int8_convrot_weight(w.float(), 256)
        q, s = out[f"{layer}.weight"], out[f"{layer}.weight_scale"]
        assert q.dtype == torch.int8 and q.shape == w.shape and s.dtype == torch.float32 and s.shape == (w.shape[0], 1)
        assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
        assert bytes(out[f"{layer}.comfy_quant"].tolist()) == json.dumps(CONVROT).encode("utf-8")
        assert out[f"{layer}.comfy_quant"].dtype == torch.uint8
        lin = read_linear(ckpt, layer)
        assert lin.group == 256 and torch.equal(lin.weight, q_ref) and torch.equal(lin.scale, s_ref)
    for key, t in sd.items():
        if key[: -len(".weight")] not in expected:
            assert out[key].dtype == t.dtype and torch.equal(out[key], t), key
    assert torch.equal(read_linear(ckpt, "layers.0.attention.out").bias, sd["layers.0.attention.out.bias"].float())

    # never overwrites without being told; leaves no temporary files behind
    with pytest.raises(FileExistsError):
        quantize_file(src, dst)
    assert quantize_main([str(src), str(dst)]) == 1
    assert quantize_main([str(src), str(dst), "--group", "64", "--skip", "--overwrite"]) == 0
    out64 = load_file(str(dst))
    assert out64["t_embedder.mlp.0.weight"].dtype == torch.int8  # no skip patterns: embedders too
    assert bytes(out64["t_embedder.mlp.0.comfy_quant"].tolist()) == json.dumps(
        {**CONVROT, "convrot_groupsize": 64}).encode()
    assert {p.name for p in tmp_path.iterdir()} == {dst.name, src.name}


# --- bad input ----------------------------------------------------------------------------------------------

def _raw_file(path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def test_corrupt_files_raise(tmp_path):
    good = tmp_path / "truncated.safetensors"
    save_file({"a.weight": torch.randn(64, 64)}, str(good))
    good.write_bytes(good.read_bytes()[:-100])
    cases = [(good, "truncated")]
    garbage = tmp_path / "garbage.safetensors"
    _raw_file(garbage, b"{this is not json", b"\0" * 8)
    cases.append((garbage, "not JSON"))
    past = tmp_path / "past_end.safetensors"
    _raw_file(past, json.dumps({"a": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}).encode(),
              b"\0" * 16)
    cases.append((past, "do not fit"))
    huge = tmp_path / "huge_header.safetensors"
    huge.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    cases.append((huge, "corrupt safetensors header"))
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    cases.append((short, "corrupt"))
    suffix = tmp_path / "model.ckpt"
    suffix.write_bytes(b"\0" * 16)
    cases.append((suffix, "only .safetensors"))
    for path, problem in cases:
        with pytest.raises(WeightsError) as err:
            Checkpoint(path)
        assert path.name in str(err.value) and problem in str(err.value), str(err.value)


def test_bad_layers_raise(tmp_path):
    q, s = KITCHEN.quantize_int8_convrot_weight(torch.randn(8, 256), 256)
    cases = [
        ("missing", {"other.weight": torch.randn(4, 4)}, "is missing"),
        ("unknown_format", {f"{LAYER}.weight": torch.zeros(8, 128, dtype=torch.uint8),
                            f"{LAYER}.comfy_quant": marker({"format": "mxfp8"})}, "'mxfp8'"),
        ("no_scale", {f"{LAYER}.weight": q, f"{LAYER}.comfy_quant": marker(CONVROT)}, "weight_scale"),
        ("bad_group", {f"{LAYER}.weight": q, f"{LAYER}.weight_scale": s,
                       f"{LAYER}.comfy_quant": marker({**CONVROT, "convrot_groupsize": 128})}, "convrot_groupsize"),
        ("bad_marker", {f"{LAYER}.weight": q, f"{LAYER}.weight_scale": s,
                        f"{LAYER}.comfy_quant": torch.tensor([123, 1, 2], dtype=torch.uint8)}, "not a JSON"),
    ]
    for name, tensors, problem in cases:
        ckpt = write(tmp_path, tensors, name=f"{name}.safetensors")
        with pytest.raises(WeightsError) as err:
            read_linear(ckpt, LAYER)
        assert f"{name}.safetensors" in str(err.value) and problem in str(err.value), str(err.value)


def test_a_released_checkpoint_maps_its_file_again_on_the_next_read(tmp_path):
    """Z-Image keeps its file for staging: its map is dropped after the load (its pages would count in the process's
    resident memory) and a later read maps it again."""
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.arange(6.0).reshape(2, 3)}, str(path))
    ckpt = Checkpoint(path)
    first = ckpt.get("a")
    ckpt.release()
    assert ckpt._file is None and torch.equal(ckpt.get("a"), first)


@pytest.mark.parametrize("formats", [("int8", "int8"), ("bf16", "bf16"), ("int8", "bf16")])
@pytest.mark.parametrize("biases", [(True, True), (False, True), (False, False)])
def test_glu_rows_interleave_the_stacked_rows(formats, biases):
    g = torch.Generator().manual_seed(7)

    def made(fmt, bias):
        w = torch.randn(24, 256, generator=g)
        b = torch.randn(24, generator=g) if bias else None
        if fmt == "int8":
            codes, scale = quantize_convrot(w, 64)
            return Linear(codes, b, scale, 64)
        return Linear(w.to(torch.bfloat16), b)

    gate, up = (made(f, b) for f, b in zip(formats, biases))
    order = torch.stack([torch.arange(24), torch.arange(24) + 24], dim=1).reshape(-1)
    stacked = stack_rows([gate, up])  # the definition: stacked, then every gate row before its up row
    both = glu_rows(gate, up)
    for mine, theirs in ((both.weight, stacked.weight[order]), (both.bias, None if stacked.bias is None else
                         stacked.bias[order]), (both.scale, None if stacked.scale is None else
                         stacked.scale.reshape(-1, 1)[order])):
        assert (mine is None and theirs is None) or (mine.dtype == theirs.dtype and torch.equal(mine, theirs))
    assert both.group == stacked.group
    picked = torch.tensor([5, 0, 47, 3])
    rows = both.rows(picked)
    assert torch.equal(rows.weight, both.weight[picked]) and (both.scale is None or
                                                              torch.equal(rows.scale, both.scale[picked]))


@pytest.mark.parametrize("tensorwise", [False, True], ids=["row_scales", "tensorwise"])
def test_stacked_rows_in_an_order_equal_the_stack_then_its_rows(tensorwise):
    g = torch.Generator().manual_seed(8)
    parts = []
    for n, bias in ((16, True), (8, False), (8, True)):
        codes, scale = quantize_convrot(torch.randn(n, 128, generator=g), 64)
        parts.append(Linear(codes, torch.randn(n, generator=g) if bias else None,
                            scale.amax().reshape(()) if tensorwise else scale, 64))
    heads = torch.randperm(16, generator=g)
    order = torch.cat([heads, 16 + torch.randperm(8, generator=g), torch.arange(24, 32)])  # runs of one part each
    for order in (order, torch.randperm(32, generator=g)):  # and runs of a row or two
        made, stacked = stack_rows(parts, order), stack_rows(parts).rows(order)
        assert all(torch.equal(x, y) for x, y in ((made.weight, stacked.weight), (made.bias, stacked.bias),
                                                  (made.scale, stacked.scale)))
    with pytest.raises(IndexError, match="rows 0..31"):
        stack_rows(parts, torch.tensor([0, 32]))
    half = parts[0].row_slice(4, 12)
    assert torch.equal(half.weight, parts[0].weight[4:12]) and half.weight.data_ptr() == parts[0].weight[4].data_ptr()
