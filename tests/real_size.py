"""Random checkpoints of the real sizes under the official templates' file names, for the GPU server test
(tests/host/test_gpu_server.py): FLUX.3 Klein and Krea 2 with their text encoder and VAEs. Z-Image's set is
host/checkpoints.py's.

The tensor names and shapes come from the reference implementations (diffusers' models, transformers' Qwen3-VL,
ComfyUI's Wan VAE) built on the meta device and put in the files' layouts by tests/tiny_models.py. They are kept
in tests/fixtures/real_size_shapes.json, so the device (which has none of those oracles installed) writes the files
from the list alone; test_real_size_shapes checks the list against the oracles.

    python tests/real_size.py --shapes            # rewrite the list from the oracles (CPU)
    python tests/real_size.py ROOT [--device cuda]  # write every file under ROOT/<ComfyUI model folder>/
"""
from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ROOT / "tests" / "fixtures" / "real_size_shapes.json"
INT8_GROUP = 256
SEED = 20261204
DIT_PREFIX = "model.diffusion_model."
# file -> (ComfyUI model folder, the families that read it); INT8 ConvRot where the template's file is.
FILES = {
    "flux3-image-klein-int8-convrot.safetensors": ("diffusion_models", ("flux3_klein",)),
    "qwen3vl_4b_int8_convrot.safetensors": ("text_encoders", ("flux3_klein", "krea2")),
    "flux2-vae.safetensors": ("vae", ("flux3_klein",)),
    "krea2_turbo_int8_convrot.safetensors": ("diffusion_models", ("krea2",)),
    "qwen_image_vae.safetensors": ("vae", ("krea2",)),
}
# Krea 2's template names the same Qwen3-VL-4B as an FP8 file; the INT8 one stands in for it (both formats are
# read by the same loader, and the text encoder runs on the host here).
ALIASES = {"qwen3vl_4b_fp8_scaled.safetensors": "qwen3vl_4b_int8_convrot.safetensors"}
# Qwen3-VL-4B's text model (its config.json); the vision tower is left out: the text path never reads it.
QWEN3_VL_4B_TEXT = {"vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
                    "max_position_embeddings": 262144,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_interleaved": True,
                                        "mrope_section": [24, 20, 20]}}


def oracle_states() -> dict[str, dict[str, torch.Tensor]]:
    """file -> its tensors (on the meta device), from the reference implementations at their real sizes."""
    from diffusers import AutoencoderKLFlux2
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
    from diffusers.models.transformers.transformer_krea2 import Krea2Transformer2DModel
    from tiny_models import flux2_vae_bfl_layout, flux3_bfl_layout, krea2_original_layout, qwen3_vl_layout
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    comfy_tree = str(ROOT / ".cache" / "comfyui-0.3.75")
    if comfy_tree not in sys.path:
        sys.path.append(comfy_tree)
    import comfy.options
    comfy.options.enable_args_parsing(False)
    import comfy.cli_args
    comfy.cli_args.args.cpu = True  # its model management asks for a CUDA device otherwise
    from comfy.ldm.wan.vae import WanVAE
    with torch.device("meta"):
        klein = Flux3Transformer2DModel(flow_map=True)
        text = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=QWEN3_VL_4B_TEXT, tie_word_embeddings=True))
        flux2_vae = AutoencoderKLFlux2()
        krea2 = Krea2Transformer2DModel()
        # qwen_image_vae as ComfyUI v0.3.75 builds it from the file (comfy/sd.py: Wan 2.1's VAE, dim 96)
        wan = WanVAE(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                     temperal_downsample=[False, True, True], dropout=0.0)
    return {
        "flux3-image-klein-int8-convrot.safetensors": flux3_bfl_layout(klein.state_dict(), DIT_PREFIX),
        "qwen3vl_4b_int8_convrot.safetensors": {k: v for k, v in qwen3_vl_layout(text, "comfy").items()
                                                if not k.startswith("visual.")},
        "flux2-vae.safetensors": flux2_vae_bfl_layout(flux2_vae),
        "krea2_turbo_int8_convrot.safetensors": krea2_original_layout(krea2.state_dict()),
        "qwen_image_vae.safetensors": dict(wan.state_dict()),
    }


def is_int8(file: str, key: str, shape: list[int]) -> bool:
    """The linears the template's INT8 ConvRot file holds as codes: the transformer blocks' and the text model's
    layers' 2-D weights (embedders, modulation and final layers stay BF16)."""
    if "int8" not in file or not key.endswith(".weight") or len(shape) != 2 or shape[1] % INT8_GROUP:
        return False
    return any(part in key for part in ("_blocks.", "blocks.", "model.layers."))


def shape_list() -> dict[str, dict[str, list]]:
    """file -> {tensor name: [shape, 'int8' or the stored float dtype]} from the oracles."""
    out = {}
    for file, state in oracle_states().items():
        dtype = "f32" if FILES[file][0] == "vae" else "bf16"
        out[file] = {k: [list(v.shape), "int8" if is_int8(file, k, list(v.shape)) else dtype]
                     for k, v in sorted(state.items())}
    return out


def random_tensor(key: str, shape: list[int], device: torch.device) -> torch.Tensor:
    """Values at sane scales (no NaN, no flat image): matrices and convolutions N(0, 1/fan_in), norm gains about
    1, batch-norm variances positive, other vectors small; a generator per name (the same on every run)."""
    g = torch.Generator(device).manual_seed(SEED ^ zlib.crc32(key.encode()))
    normal = lambda: torch.randn(shape, generator=g, device=device)  # noqa: E731
    if key.endswith("running_var"):
        return 0.2 + 2 * torch.rand(shape, generator=g, device=device)
    if len(shape) >= 2:
        return normal() / max(1, torch.Size(shape[1:]).numel()) ** 0.5
    if any(part in key for part in ("norm", "scale", "gamma")):
        return 1 + 0.1 * normal()
    return 0.02 * normal()


def write(root: str | Path, device: str = "cuda", shapes: dict | None = None) -> Path:
    """Every file of shapes (by default the real sizes' list) and ALIASES' links under root/<model folder>/, written
    once (a finished file is kept; an unfinished one never passes for one: quantize_file's writer)."""
    from swiftdit.quantize import marker_bytes, streamed_safetensors
    from dit_core.weights import quantize_convrot
    root, device = Path(root), torch.device(device)
    dtypes = {"bf16": ("BF16", torch.bfloat16), "f32": ("F32", torch.float32)}
    shapes = shapes or json.loads(SHAPES.read_text())
    for file, tensors in shapes.items():
        path = root / FILES[file][0] / file
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = {}
        for key, (shape, kind) in tensors.items():
            if kind == "int8":
                layer = key[: -len(".weight")]
                entries |= {key: ("I8", shape), f"{layer}.weight_scale": ("F32", [shape[0], 1]),
                            f"{layer}.comfy_quant": ("U8", [marker_bytes(INT8_GROUP).numel()])}
            else:
                entries[key] = (dtypes[kind][0], shape)
        with streamed_safetensors(path, entries, {}) as put:
            for key, (shape, kind) in tensors.items():
                values = random_tensor(key, shape, device)
                if kind == "int8":
                    codes, scale = quantize_convrot(values, INT8_GROUP)
                    layer = key[: -len(".weight")]
                    put(key, codes.cpu())
                    put(f"{layer}.weight_scale", scale.cpu())
                    put(f"{layer}.comfy_quant", marker_bytes(INT8_GROUP))
                else:
                    put(key, values.to(dtypes[kind][1]).cpu())
    for alias, file in ALIASES.items():
        link = root / FILES[file][0] / alias
        if file in shapes and not link.exists():
            link.symlink_to(file)
    return root


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", help="folder to write the files under (in ComfyUI's model folders)")
    p.add_argument("--device", default="cuda", help="where the values are drawn and quantized")
    p.add_argument("--shapes", action="store_true", help=f"rewrite {SHAPES.name} from the reference implementations")
    args = p.parse_args(argv)
    if args.shapes:
        if "torchvision" not in sys.modules:  # CPU torch beside a CUDA torchvision wheel (as tests/conftest.py)
            from host.run_comfy import TorchvisionOpsShim
            sys.meta_path.insert(0, TorchvisionOpsShim())
        SHAPES.write_text(json.dumps(shape_list(), indent=0) + "\n")
        print(SHAPES)
    elif args.root:
        print(write(args.root, args.device))
    else:
        p.error("give ROOT or --shapes")
    return 0


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    sys.exit(main())
