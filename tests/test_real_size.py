"""tests/real_size.py: its list of the real sizes' tensors is what the reference implementations give, and the files
it writes from a list are what our loaders read (INT8 ConvRot codes, scales and markers, floats as listed)."""
import json

import torch

import real_size  # tests/ is on sys.path (pytest rootdir conftest)
from dit_core.weights import Checkpoint


def test_the_shape_list_is_the_oracles(comfy):
    assert real_size.shape_list() == json.loads(real_size.SHAPES.read_text())


def test_written_files_hold_the_listed_tensors(tmp_path):
    shapes = {"flux3-image-klein-int8-convrot.safetensors": {"single_blocks.0.linear1.weight": [[8, 512], "int8"],
                                                             "final_layer.linear.weight": [[4, 8], "bf16"],
                                                             "norm.scale": [[8], "bf16"]},
              "qwen3vl_4b_int8_convrot.safetensors": {"model.norm.weight": [[4], "bf16"]}}
    real_size.write(tmp_path, "cpu", shapes)
    klein = Checkpoint(tmp_path / "diffusion_models" / "flux3-image-klein-int8-convrot.safetensors")
    assert klein.get("single_blocks.0.linear1.weight").dtype == torch.int8
    assert klein.shape("single_blocks.0.linear1.weight_scale") == (8, 1)
    assert json.loads(bytes(klein.get("single_blocks.0.linear1.comfy_quant").tolist()))["convrot_groupsize"] == 256
    assert klein.get("final_layer.linear.weight").dtype == torch.bfloat16
    gains = klein.get("norm.scale").float()
    assert (gains - 1).abs().max() < 0.5 and gains.std() > 0  # gains about 1, not all equal
    alias = tmp_path / "text_encoders" / "qwen3vl_4b_fp8_scaled.safetensors"
    assert alias.is_symlink() and alias.resolve().name == "qwen3vl_4b_int8_convrot.safetensors"
    mtime = alias.resolve().stat().st_mtime_ns
    real_size.write(tmp_path, "cpu", shapes)  # a finished file is kept
    assert alias.resolve().stat().st_mtime_ns == mtime
