"""The one loading path (dit_core/text/loading.py TextEncoder) over every encoder: each test runs once per encoder,
on its tiny random file in the layout its own tests use."""
import json
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import COMFYUI_TREE
from torch.profiler import ProfilerActivity, profile
from safetensors.torch import save_file
from tiny_models import qwen3_comfy_layout, qwen3_vl_layout, random_qwen3, random_qwen3_vl

from dit_core.text.qwen3 import Qwen3TextEncoder
from dit_core.text.qwen3_vl import Qwen3VLTextEncoder
from dit_core.weights import WeightsError, convrot_group_for, quantize_convrot

TOKENIZER_DIR = COMFYUI_TREE / "comfy" / "text_encoders" / "qwen25_tokenizer"
HIDDEN = 64  # both tiny models' width
# encoder -> (class, its file's name, the file's tensors, the key of one of its down_proj weights)
ENCODERS = {
    "qwen3": (Qwen3TextEncoder, "qwen3_tiny.safetensors", lambda: qwen3_comfy_layout(random_qwen3()),
              "model.layers.0.mlp.down_proj.weight"),
    "qwen3_vl": (Qwen3VLTextEncoder, "qwen3vl_tiny_hf.safetensors", lambda: qwen3_vl_layout(random_qwen3_vl(), "hf"),
                 "model.language_model.layers.3.mlp.down_proj.weight"),
}


@pytest.fixture(scope="module", params=list(ENCODERS))
def case(request, tmp_path_factory):
    cls, name, tensors, down_proj = ENCODERS[request.param]
    state = tensors()
    path = tmp_path_factory.mktemp(request.param) / name
    save_file(state, str(path))
    return SimpleNamespace(cls=cls, path=path, state=state, down_proj=down_proj)


def test_wrong_hidden_size(case):
    with pytest.raises(WeightsError, match=rf"{re.escape(case.path.name)}.*hidden size 64, expected 2560"):
        case.cls.load(case.path, TOKENIZER_DIR, expected_hidden=2560)


def test_missing_tensor(tmp_path, case):
    save_file({k: v for k, v in case.state.items() if k != case.down_proj}, str(tmp_path / "cut.safetensors"))
    with pytest.raises(WeightsError, match=r"cut\.safetensors.*down_proj\.weight' is missing"):
        case.cls.load(tmp_path / "cut.safetensors", TOKENIZER_DIR)


def test_bad_tokenizer_folder(tmp_path, case):
    with pytest.raises(WeightsError, match="vocab.json"):
        case.cls.load(case.path, tmp_path)


def test_token_ids_out_of_range(case):
    encoder = case.cls.load(case.path, TOKENIZER_DIR, expected_hidden=HIDDEN)
    with pytest.raises(ValueError, match="token ids"):
        encoder.encode_ids([0, 151936])


def as_stored(state: dict, fmt: str) -> dict:
    """The tiny file's tensors as a real one stores them: BF16, or INT8 ConvRot linears (ComfyUI's markers) beside
    BF16 embedding and norms."""
    out = {k: v.to(torch.bfloat16) for k, v in state.items()}
    if fmt == "int8":
        for key in [k for k in out if k.endswith("_proj.weight")]:
            layer, w = key.removesuffix(".weight"), out[key].float()
            group = convrot_group_for(w.shape[1])
            out[key], out[f"{layer}.weight_scale"] = quantize_convrot(w, group)
            marker = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group}
            out[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps(marker).encode()), dtype=torch.uint8)
    return out


def peak_host_bytes(run) -> int:
    """The most bytes of CPU tensors alive at once while run() runs (the profiler's allocations and frees in order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    alive = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        alive += event.self_cpu_memory_usage
        peak = max(peak, alive)
    return peak


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_a_bf16_load_makes_no_float32_copy(tmp_path, case, fmt):
    """Loading in BF16 (as on the GPU) holds no f32 copy on the host: tensors move as stored and are converted where
    they go, one at a time, so the peak of host tensors stays within 10% of the BF16 model (which here ends up on
    the CPU), where an f32 intermediate of the embedding alone (most of a tiny model's bytes) would double it and
    the f32 load takes three times."""
    path = tmp_path / f"{fmt}.safetensors"
    save_file(as_stored(case.state, fmt), str(path))
    loaded = []
    peak = peak_host_bytes(lambda: loaded.append(case.cls.load(path, TOKENIZER_DIR, dtype=torch.bfloat16)))
    params = list(loaded[0].model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)
    model_bytes = sum(p.numel() * 2 for p in params)
    assert peak <= 1.1 * model_bytes, f"peak {peak / 1e6:.2f} MB for a {model_bytes / 1e6:.2f} MB model"
