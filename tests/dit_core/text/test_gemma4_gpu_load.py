"""LTX-2.5's text path loaded as on a GPU (issue 34): Gemma-4 and its projections read to the device in the file's
precision (BF16; INT8 ConvRot linears kept as stored for the INT8 kernels), the connectors' linears in BF16, against
the f32 host reference; the GPU form's options run here on the CPU, and on CUDA in the gpu-marked test. Tiny files
of tests/dit_core/text/test_ltx25_text.py's random Gemma-4 and connectors, stored as real files store them."""
import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from test_loading import peak_host_bytes
from tiny_models import builders, int8_convrot_state

from dit_core.gpu.block import GpuLinear
from dit_core.gpu.text_linear import Int8Linear
from dit_core.text.gemma4 import Gemma4TextEncoder, LTX25TextConnectors
from dit_core.weights import Checkpoint, Linear, read_linear

TEXT = builders("dit_core/text/test_ltx25_text.py")
oracle = TEXT.oracle  # its module fixture, used here too
PROMPTS = ["a fox runs through the snow at dusk; it barks twice", "東京 café naïve Zürich night lights"]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Features and rows against the f32 host reference of the same file (rel. Frobenius error, worst of PROMPTS' video
# and audio features). Measured on the CPU: the BF16 load 0.0029-0.0040 (the Qwen tests allow 5e-2 for a BF16
# load); the INT8 path 0.0055-0.0077 (scaled FP8 file: 0.0058-0.0081), and 0.0057-0.0083 (0.0061-0.0086) against
# the BF16-dequantized load of the same file (test_loading.py's INT8_PATH_TOL: qwen3 3e-2); the connectors' BF16 linears 0.0022-0.0024 (rows). The bounds keep
# 4-5x headroom for CUDA's BF16 products and attention and the INT8 kernels' rounding; a misread tensor lands near 1.
BF16_TOL, INT8_TOL, CONNECTORS_TOL = 2e-2, 3e-2, 1e-2


def is_linear(key: str) -> bool:
    return key.startswith(("model.layers.", "text_embedding_projection.")) and key.endswith(".weight")


def as_stored(state: dict, fmt: str) -> dict:
    """The text encoder file as a release stores it: every float tensor BF16 (the tokenizer stays uint8), or
    Gemma's linears and both projections INT8 ConvRot (ComfyUI's markers, group 64) or scaled FP8 (a per-tensor
    scale, as ComfyUI's fp8_scaled files) beside BF16 embedding and norms."""
    if fmt == "int8":
        state = int8_convrot_state(state, is_linear)
    elif fmt == "fp8":
        state = dict(state)
        for key in [k for k, v in state.items() if is_linear(k) and v.dim() == 2]:
            scale = state[key].abs().max() / 448.0
            state[key] = (state[key] / scale).to(torch.float8_e4m3fn)
            state[key.removesuffix("weight") + "weight_scale"] = scale.reshape(())
    return {k: v.to(torch.bfloat16) if v.dtype == torch.float32 and not k.endswith("weight_scale") else v
            for k, v in state.items()}


@pytest.fixture(scope="module")
def files(oracle, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4_gpu_load")
    te = TEXT.text_encoder_layout(oracle)
    paths = {"f32": root / "te_f32.safetensors", "bf16": root / "te_bf16.safetensors",
             "int8": root / "te_int8.safetensors", "fp8": root / "te_fp8.safetensors", "dit": root / "dit.safetensors"}
    save_file(te, str(paths["f32"]))
    for fmt in ("bf16", "int8", "fp8"):
        save_file(as_stored(te, fmt), str(paths[fmt]))
    dit = TEXT.dit_layout(oracle)
    save_file({k: v.to(torch.bfloat16) if "_embeddings_connector." in k else v for k, v in dit.items()},
              str(paths["dit"]))
    return paths


@pytest.fixture(scope="module")
def reference(files):
    """The host reference of each file: f32 on the CPU, the path the loader takes there by default."""
    return {fmt: Gemma4TextEncoder.load(files[fmt]) for fmt in ("bf16", "int8", "fp8")}


def features(encoder) -> list[torch.Tensor]:
    return [f for p in PROMPTS for f in encoder.encode(p)]


def worst(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(rel_err(g.float().cpu(), w) for g, w in zip(got, want))


def test_f32_host_path_is_the_file_dequantized(files, reference):
    """The f32 host load holds each linear exactly as weights' Linear.dequantized() (the reference's formula), the
    projections too, and reads the same whether given a path or an open Checkpoint."""
    ckpt = Checkpoint(files["int8"])
    model = reference["int8"].model
    for i, layer in enumerate(model.layers):
        for group, n in [("self_attn", n) for n in LINEARS[:4]] + [("mlp", n) for n in LINEARS[4:]]:
            module = getattr(getattr(layer, group), n)
            if module is not None:
                want = read_linear(ckpt, f"model.layers.{i}.{group}.{n}").dequantized()
                assert module.weight.dtype == torch.float32 and torch.equal(module.weight, want)
    for m, p in (("video", reference["int8"].video_proj), ("audio", reference["int8"].audio_proj)):
        lin = read_linear(ckpt, f"text_embedding_projection.{m}_aggregate_embed")
        assert isinstance(p, Linear) and torch.equal(p.weight, lin.dequantized()) and torch.equal(p.bias, lin.bias)
    again = Gemma4TextEncoder.load(ckpt, dtype=torch.float32, device="cpu", int8_linears=False)
    assert all(torch.equal(a, b) for a, b in zip(features(again), features(reference["int8"])))


def test_bf16_load_is_close_to_the_host_reference(files, reference):
    """The GPU form's BF16 load, here on the CPU: every parameter BF16 (RoPE angles f32), features within BF16_TOL."""
    bf16 = Gemma4TextEncoder.load(files["bf16"], dtype=torch.bfloat16, device="cpu")
    assert all(p.dtype == torch.bfloat16 for p in bf16.model.parameters())
    assert bf16.video_proj.weight.dtype == torch.bfloat16 and bf16.video_proj.bias.dtype == torch.float32
    assert bf16.model.rotary_emb.sliding_attention_inv_freq.dtype == torch.float32
    got = features(bf16)
    assert all(f.dtype == torch.float32 for f in got)
    err = worst(got, features(reference["bf16"]))
    assert 1e-5 < err <= BF16_TOL, err


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_int8_path_is_close_to_the_host_reference(files, reference, fmt):
    """The GPU form's INT8 path (CUDA's default), asked for on the CPU (the kernels' references): every Gemma linear
    an Int8Linear of the stored codes (scaled FP8 ones: INT8 ConvRot after weights.read_linear), both projections
    GpuLinears of theirs; features within INT8_TOL of the f32 reference and of the BF16-dequantized load of the
    same file."""
    int8 = Gemma4TextEncoder.load(files[fmt], dtype=torch.bfloat16, device="cpu", int8_linears=True)
    linears = [m for m in int8.model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == len(LINEARS) * len(int8.model.layers) - 1  # the full layer's V is K's projection
    assert all(m.weight.dtype == torch.int8 and m.scale.dtype == torch.float32 for m in linears)
    assert not any(isinstance(m, torch.nn.Linear) for m in int8.model.modules())
    for p in (int8.video_proj, int8.audio_proj):
        assert isinstance(p, GpuLinear) and p.int8 and p.bias.dtype == torch.float32
    got = features(int8)
    err = worst(got, features(reference[fmt]))
    assert 1e-4 < err <= INT8_TOL, err
    dequantized = Gemma4TextEncoder.load(files[fmt], dtype=torch.bfloat16, device="cpu")
    assert isinstance(dequantized.video_proj, Linear)
    assert 1e-4 < worst(got, features(dequantized)) <= INT8_TOL


def test_connectors_bf16_close_to_f32(files, reference):
    """The connectors as read on a GPU (BF16 linears; registers, norms f32), here on the CPU: rows f32, within
    CONNECTORS_TOL of the f32 load of the same file, whose linears are the stored ones dequantized, exactly."""
    f32, bf16 = (LTX25TextConnectors.load(files["dit"], dtype=dtype) for dtype in (torch.float32, torch.bfloat16))
    assert bf16.video.blocks[0].q.weight.dtype == torch.bfloat16 and bf16.video.registers.dtype == torch.float32
    stored = read_linear(Checkpoint(files["dit"]), "model.diffusion_model.audio_embeddings_connector."
                                                   "transformer_1d_blocks.1.ff.net.2")
    assert torch.equal(f32.audio.blocks[1].down.weight, stored.dequantized())  # the f32 reference's formula
    encoded = reference["bf16"].encode(PROMPTS[0])
    got, want = bf16(*encoded), f32(*encoded)
    assert got[0].dtype == got[1].dtype == torch.float32 and torch.equal(got[2], want[2])
    err = max(rel_err(g, w) for g, w in zip(got[:2], want[:2]))
    assert 1e-5 < err <= CONNECTORS_TOL, err


@pytest.mark.parametrize("fmt,int8_linears", [("bf16", None), ("int8", False), ("int8", True)])
def test_a_bf16_or_int8_load_makes_no_float32_copy(files, fmt, int8_linears):
    """A BF16 load (the GPU form; here the CPU is its device) holds no f32 copy of the model on the host: tensors
    move as stored and are converted where they go, one at a time. The peak of host tensors stays within the file
    (safetensors maps it whole as one storage, which the profiler counts; tensors kept as stored are views of it)
    plus 1.1 times the loaded model plus one linear's f32 dequantization (int8 file, int8_linears False), where the
    f32 load of the same file goes above that (measured: 0.56 / 0.93 / 0.41 MB against bounds of 1.15 / 0.99 /
    0.67 MB; the f32 loads 1.64 / 1.50 / 1.50 MB)."""
    loaded = []
    peak = peak_host_bytes(lambda: loaded.append(Gemma4TextEncoder.load(files[fmt], dtype=torch.bfloat16,
                                                                        int8_linears=int8_linears)))
    enc = loaded[0]
    projections = [t for p in (enc.video_proj, enc.audio_proj) for t in (p.weight, p.bias, getattr(p, "scale", None))
                   if t is not None]
    tensors = [*enc.model.parameters(), *enc.model.buffers(), *projections]
    assert not any(t.dtype == torch.float32 and t.dim() == 2 for t in tensors)  # no f32 matrix kept either
    model_bytes = sum(t.numel() * t.element_size() for t in tensors)
    one_linear = 4 * max(w.numel() for w in (enc.video_proj.weight, enc.audio_proj.weight))
    bound = files[fmt].stat().st_size + 1.1 * model_bytes + (one_linear if (fmt, int8_linears) == ("int8", False)
                                                             else 0)
    assert peak <= bound, f"peak {peak / 1e6:.3f} MB, bound {bound / 1e6:.3f} MB"
    f32_peak = peak_host_bytes(lambda: Gemma4TextEncoder.load(files[fmt]))
    assert f32_peak > bound, f"the f32 load's peak {f32_peak / 1e6:.3f} MB, bound {bound / 1e6:.3f} MB"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_close_to_the_host_reference(files, reference):
    """On a CUDA device as the LTX-2.5 text loader loads it: the BF16 file in BF16, the INT8 and scaled FP8 files on
    the INT8 kernels (the default there), every tensor on the card; features f32 within BF16_TOL / INT8_TOL of the host
    f32 reference; the connectors' BF16 linears on the card within CONNECTORS_TOL of the host f32 rows."""
    for fmt, tol in (("bf16", BF16_TOL), ("int8", INT8_TOL), ("fp8", INT8_TOL)):
        enc = Gemma4TextEncoder.load(files[fmt], dtype=torch.bfloat16, device="cuda")
        assert all(t.device.type == "cuda" for t in [*enc.model.parameters(), *enc.model.buffers()])
        assert (fmt != "bf16") == any(isinstance(m, Int8Linear) for m in enc.model.modules())
        assert (fmt != "bf16") == isinstance(enc.video_proj, GpuLinear)
        got = features(enc)
        assert all(f.device.type == "cuda" and f.dtype == torch.float32 for f in got)
        err = worst(got, features(reference[fmt]))
        assert err <= tol, (fmt, err)
    host = LTX25TextConnectors.load(files["dit"])
    card = LTX25TextConnectors.load(files["dit"], device="cuda", dtype=torch.bfloat16)
    assert card.device.type == "cuda"
    encoded = reference["bf16"].encode(PROMPTS[0])
    got, want = card(*encoded), host(*encoded)
    assert got[0].device.type == "cuda" and got[0].dtype == torch.float32
    assert max(rel_err(g.cpu(), w) for g, w in zip(got[:2], want[:2])) <= CONNECTORS_TOL
