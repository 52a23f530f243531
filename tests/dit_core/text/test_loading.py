"""The one loading path (dit_core/text/loading.py TextEncoder) over every encoder: each test runs once per encoder,
on its tiny random file in the layout its own tests use."""
import re
from types import SimpleNamespace

import pytest
from conftest import COMFYUI_TREE
from safetensors.torch import save_file
from tiny_models import qwen3_comfy_layout, qwen3_vl_layout, random_qwen3, random_qwen3_vl

from dit_core.text.qwen3 import Qwen3TextEncoder
from dit_core.text.qwen3_vl import Qwen3VLTextEncoder
from dit_core.weights import WeightsError

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
