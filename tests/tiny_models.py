"""Tiny random models of each reference implementation, and their weights in ComfyUI's file layouts. The oracles
(diffusers, transformers) are imported where a model is built: the GPU machine, which runs the GPU tests that import
this module for its layouts, has neither."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
import types
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from dit_core.arch import Arch
from dit_core.block import Block
from dit_core.codecs.flux1_vae import SCALING, SHIFT
from dit_core.weights import Linear

if TYPE_CHECKING:
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import Qwen3Model

# reference/families/z_image.md section 11; dim 192 (6 heads of 32) so the FFN is 512 wide and every linear
# has a power-of-4 ConvRot group for the INT8 tests.
Z_IMAGE_TINY = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=192, n_layers=2,
                    n_refiner_layers=1, n_heads=6, n_kv_heads=6, norm_eps=1e-5, qk_norm=True, cap_feat_dim=32,
                    rope_theta=256.0, t_scale=1000.0, axes_dims=[8, 12, 12], axes_lens=[1024, 512, 512])

QWEN3_TINY = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                  max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


TESTS = Path(__file__).resolve().parent


def builders(rel: str):
    """The test module tests/<rel> (its tiny builders and fixtures), imported once by path: tests' folders are no
    packages, and a node or host test reuses an engine test's builders."""
    name = "builders_" + rel.removesuffix(".py").replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TESTS / rel)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]



def random_z_image(seed: int = 0, **overrides) -> ZImageTransformer2DModel:
    """diffusers' Z-Image with every parameter random (its init zeroes pad tokens and some gains: hides bugs)."""
    from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel
    torch.manual_seed(seed)
    model = ZImageTransformer2DModel(**{**Z_IMAGE_TINY, **overrides}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 or p.shape[0] == 1 else p.shape[-1] ** -0.5))
    return model


def z_image_comfy_layout(state: dict) -> dict:
    """diffusers names -> ComfyUI's single-file names (the inverse of diffusers' single-file converter)."""
    out = {}
    renames = [("all_final_layer.2-1.", "final_layer."), ("all_x_embedder.2-1.", "x_embedder."),
               (".attention.to_out.0.", ".attention.out."), (".attention.norm_q.", ".attention.q_norm."),
               (".attention.norm_k.", ".attention.k_norm.")]
    for key, value in state.items():
        if ".attention.to_k." in key or ".attention.to_v." in key:
            continue
        if ".attention.to_q.weight" in key:
            stem = key.replace(".attention.to_q.weight", ".attention.")
            out[stem + "qkv.weight"] = torch.cat([state[stem + f"to_{n}.weight"] for n in "qkv"])
            continue
        for old, new in renames:
            key = key.replace(old, new)
        out[key] = value.contiguous()
    return out


def randomize_language_model(model):
    """Every parameter of a transformers language model random: RMSNorm gains around 1, matrices scaled by
    1/sqrt(fan-in), embeddings and the rest standard normal."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif p.dim() == 2 and "embed" not in name:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn_like(p))
    return model


def random_qwen3(seed: int = 0, **overrides) -> Qwen3Model:
    """transformers' Qwen3 with every parameter random, RMSNorm gains around 1."""
    from transformers import Qwen3Config, Qwen3Model
    torch.manual_seed(seed)
    model = Qwen3Model(Qwen3Config(**{**QWEN3_TINY, **overrides})).eval()
    return randomize_language_model(model)


def qwen3_comfy_layout(model: Qwen3Model, prefix: str = "") -> dict[str, torch.Tensor]:
    """ComfyUI's text_encoders layout: the HF names under `model.`."""
    return {f"{prefix}model.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}


# Tiny FLUX.1-shaped VAEs: 16 latent channels, no quant convs. "flux" has FLUX.1's four levels (factor 8) and
# norm groups of 8-16 channels; "two_level" has 2 + 1 resnets per level and FLUX.1's 32 groups (the default).
CONFIGS = {
    "flux": {"block_out_channels": (32, 32, 64, 64), "layers_per_block": 1, "norm_num_groups": 4},
    "two_level": {"block_out_channels": (32, 64), "layers_per_block": 2, "norm_num_groups": 32},
}


def tiny_vae(name: str, seed: int = 1, latent_channels: int = 16, quant: bool = False) -> AutoencoderKL:
    from diffusers import AutoencoderKL
    cfg = CONFIGS[name]
    levels = len(cfg["block_out_channels"])
    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=latent_channels,
                        down_block_types=("DownEncoderBlock2D",) * levels,
                        up_block_types=("UpDecoderBlock2D",) * levels, use_quant_conv=quant,
                        use_post_quant_conv=quant, scaling_factor=SCALING, shift_factor=SHIFT, **cfg).eval()
    randomize(vae, seed)
    return vae


def randomize(vae: AutoencoderKL, seed: int) -> None:
    """Every parameter random (diffusers' init has unit norms and zero biases, which hides swapped tensors).
    Biases are large (std 2): per-channel offsets then dominate the GroupNorm statistics, so a tile's
    statistics stay close to the whole image's, and tiled vs whole compares the blending, not the norms (with
    biases of std 0.1, tiles of 24 cells differ from the whole decode by ~5% even far from the seams)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * r if name.endswith("weight") else 0.2 * r)
            elif name.endswith("bias"):
                p.copy_(2.0 * r)
            else:
                p.copy_(r / p[0].numel() ** 0.5)


# diffusers -> BFL/LDM names: the inverse of diffusers' convert_ldm_vae_checkpoint (single_file_utils.py).
RENAMES = [
    (r"\.resnets\.", ".block."), (r"conv_shortcut", "nin_shortcut"), (r"\.downsamplers\.0\.", ".downsample."),
    (r"\.upsamplers\.0\.", ".upsample."), (r"conv_norm_out", "norm_out"),
    (r"mid_block\.attentions\.0\.", "mid.attn_1."), (r"group_norm", "norm"), (r"to_out\.0", "proj_out"),
    (r"\.to_([qkv])\.", r".\1."), (r"encoder\.down_blocks\.", "encoder.down."),
]


def to_bfl(state: dict[str, torch.Tensor], levels: int, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for key, t in state.items():
        # decoder.up_blocks.i runs from the lowest resolution; BFL's up.N is indexed by level (N = levels-1-i)
        k = re.sub(r"decoder\.up_blocks\.(\d+)", lambda m: f"decoder.up.{levels - 1 - int(m[1])}", key)
        k = re.sub(r"mid_block\.resnets\.(\d)", lambda m: f"mid.block_{int(m[1]) + 1}", k)
        for pattern, repl in RENAMES:
            k = re.sub(pattern, repl, k)
        if ".attn_1." in k and t.dim() == 2:  # BFL's AttnBlock holds q/k/v/proj_out as 1x1 convs
            t = t[:, :, None, None]
        out[prefix + k] = t.contiguous()
    return out


def save_bfl(vae: AutoencoderKL, path, prefix: str = "") -> dict[str, torch.Tensor]:
    state = to_bfl(vae.state_dict(), len(vae.config.block_out_channels), prefix)
    save_file(state, str(path))
    return state


# reference/families/flux3_klein.md section 11 (hidden 64 = 2 heads of 32, FFN 192: every block linear has a
# power-of-4 ConvRot group for the INT8 tests).
FLUX3_TINY = {"in_channels": 16, "cond_in_channels": 16, "num_layers": 2, "num_single_layers": 2,
              "attention_head_dim": 32, "num_attention_heads": 2, "joint_attention_dim": 48,
              "timestep_channels": 256, "mlp_ratio": 3.0, "axes_dims_rope": (8, 8, 8, 8), "rope_theta": 10000,
              "eps": 1e-6, "flow_map": True}


def random_flux3(seed: int = 0, **overrides):
    """diffusers' Flux3Transformer2DModel with every parameter random (q/k norm gains included)."""
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
    torch.manual_seed(seed)
    model = Flux3Transformer2DModel(**{**FLUX3_TINY, **overrides}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else p.shape[-1] ** -0.5))
    return model


# diffusers -> BFL names: the inverse of diffusers' convert_flux3_transformer_checkpoint_to_diffusers.
FLUX3_KEYS = {"timestep_embedder.linear_1.weight": "time_in.in_layer.weight",
              "timestep_embedder.linear_2.weight": "time_in.out_layer.weight",
              "target_timestep_embedder.linear_1.weight": "ref_time_in.in_layer.weight",
              "target_timestep_embedder.linear_2.weight": "ref_time_in.out_layer.weight",
              "proj_out.weight": "final_layer.image.linear.weight",
              "norm_out.linear.weight": "final_layer.image.adaLN_modulation.1.weight"}
FLUX3_PREFIXES = {"x_embedders.": "emb_in.", "context_embedder.": "txt_in.",
                  "mode_blocks.": "content_mode_blocks.", "single_transformer_blocks.": "single_blocks."}
FLUX3_BLOCK = {"attn.to_q.weight": "q_proj.weight", "attn.to_k.weight": "k_proj.weight",
               "attn.to_v.weight": "v_proj.weight", "attn.to_out.0.weight": "attn_out.weight",
               "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale",
               "ff.linear_in.weight": "mlp_in.weight", "ff.linear_out.weight": "mlp_out.weight"}


def flux3_bfl_layout(state: dict, prefix: str = "") -> dict:
    """diffusers' Flux3Transformer2DModel state -> BFL's original single-file names (the final modulation's
    rows back to BFL's [shift; scale])."""
    out = {}
    for key, value in state.items():
        if key in FLUX3_KEYS:
            if key == "norm_out.linear.weight":
                scale, shift = value.chunk(2)
                value = torch.cat([shift, scale])
            out[prefix + FLUX3_KEYS[key]] = value.contiguous()
            continue
        for old, new in FLUX3_PREFIXES.items():
            if key.startswith(old):
                key = new + key[len(old):]
                break
        if "_stream_modulations." in key:
            key = key.replace(".linear.weight", ".lin.weight")
        for old, new in FLUX3_BLOCK.items():
            if key.endswith(old):
                key = key[: -len(old)] + new
                break
        out[prefix + key] = value.contiguous()
    return out


# reference/families/krea2.md section 8 (in_channels is the packed token's width: 4 latent channels).
KREA2_TINY = dict(in_channels=16, num_layers=2, attention_head_dim=32, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, timestep_embed_dim=256, text_hidden_dim=32, num_text_layers=3,
                  text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=64,
                  num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(8, 12, 12),
                  rope_theta=1000.0, norm_eps=1e-5)


def random_krea2(seed: int = 0, **overrides):
    """diffusers' Krea2Transformer2DModel with every parameter random (its init zeroes the norm weights and the
    modulation tables: hides bugs)."""
    from diffusers.models.transformers.transformer_krea2 import Krea2Transformer2DModel
    torch.manual_seed(seed)
    model = Krea2Transformer2DModel(**{**KREA2_TINY, **overrides}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 or p.shape[0] <= 6 else p.shape[-1] ** -0.5))
    return model


# diffusers -> the original single file's names: the inverse of convert_krea2_transformer_checkpoint_to_diffusers.
KREA2_PREFIXES = {"img_in.": "first.", "time_embed.linear_1.": "tmlp.0.", "time_embed.linear_2.": "tmlp.2.",
                  "time_mod_proj.": "tproj.1.", "txt_in.norm.weight": "txtmlp.0.scale", "txt_in.linear_1.": "txtmlp.1.",
                  "txt_in.linear_2.": "txtmlp.3.", "text_fusion.": "txtfusion.", "transformer_blocks.": "blocks.",
                  "final_layer.linear.": "last.linear.", "final_layer.norm.weight": "last.norm.scale",
                  "final_layer.scale_shift_table": "last.modulation.lin"}
KREA2_BLOCK = {".attn.to_q.": ".attn.wq.", ".attn.to_k.": ".attn.wk.", ".attn.to_v.": ".attn.wv.",
               ".attn.to_out.0.": ".attn.wo.", ".attn.to_gate.": ".attn.gate.",
               ".attn.norm_q.weight": ".attn.qknorm.qnorm.scale", ".attn.norm_k.weight": ".attn.qknorm.knorm.scale",
               ".ff.": ".mlp.", ".norm1.weight": ".prenorm.scale", ".norm2.weight": ".postnorm.scale",
               ".scale_shift_table": ".mod.lin"}


def krea2_original_layout(state: dict, prefix: str = "") -> dict:
    """diffusers' Krea2Transformer2DModel state -> the original single file's names (each block's modulation table
    flattened to one vector, as the file stores it)."""
    out = {}
    for key, value in state.items():
        for old, new in KREA2_PREFIXES.items():
            if key.startswith(old):
                key = new + key[len(old):]
                break
        for old, new in KREA2_BLOCK.items():
            key = key.replace(old, new)
        if key.startswith("blocks.") and key.endswith(".mod.lin"):
            value = value.reshape(-1)
        out[prefix + key] = value.contiguous()
    return out


# reference/families/minimax_h3.md section 10, with an attention wider than the residual (4 heads x 32 = 128 over
# 64) as H3's 7168 over 5376; rope_freq_dim 4 turns 24 of a head's 32 values (H3: 96 of 128).
MINIMAX_H3_TINY = dict(num_attention_heads=4, attention_head_dim=32, hidden_size=64, num_layers=2, num_refiner_layers=1,
                       ffn_dim=96, in_channels=4, audio_in_channels=8, patch_size=(1, 2, 2), text_dim=40, freq_dim=32,
                       time_embed_hidden_dim=48, time_embed_dim=24, rope_freq_dim=4, rope_theta=10000.0,
                       norm_eps=1e-5, qk_norm_eps=1e-5, final_norm_eps=1e-5)


def random_minimax_h3(seed: int = 0, **overrides):
    """diffusers' MiniMaxH3Transformer3DModel with every parameter random (its init has unit norms and zero biases:
    hides swapped tensors)."""
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3Transformer3DModel
    torch.manual_seed(seed)
    model = MiniMaxH3Transformer3DModel(**{**MINIMAX_H3_TINY, **overrides}).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else p.shape[-1] ** -0.5))
    return model


# diffusers -> the Comfy-Org single file's names: the inverse of convert_minimax_h3_transformer_checkpoint_to_diffusers
# (whole-name prefixes first, then the names inside a block).
MINIMAX_H3_PREFIXES = {"transformer_blocks.": "blocks.", "token_refiner.refiner_blocks.": "token_refiner.blocks.",
                       "time_embedder.linear_1.": "time_embedder.proj_in.",
                       "time_embedder.linear_2.": "time_embedder.proj_out.", "proj_in.": "video_patch_proj.",
                       "audio_proj_in.": "audio_patch_proj.", "context_embedder.": "condition_proj.",
                       "norm_out.norm.": "final_layer.norm.", "norm_out.linear.": "final_layer.adaln_proj.linear.",
                       "proj_out.": "final_layer.video_out.", "audio_proj_out.": "final_layer.audio_out."}
MINIMAX_H3_BLOCK = {".attn.norm_q.": ".attn.q_norm.", ".attn.norm_k.": ".attn.k_norm.",
                    ".attn.to_out.0.": ".attn.out_proj.", ".ff.net.0.proj.": ".mlp.fc1.", ".ff.net.2.": ".mlp.fc2."}


def minimax_h3_comfy_layout(model, prefix: str = "") -> dict:
    """diffusers' MiniMaxH3Transformer3DModel -> the Comfy-Org single file: q, k, v stacked into qkv_proj, fc1 as
    [gate; value] (diffusers holds [value; gate]), and the rope.inv_freq buffer the file carries."""
    state, out = model.state_dict(), {}
    for key, value in state.items():
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        if ".attn.to_q." in key:
            value = torch.cat([state[key.replace(".to_q.", f".to_{n}.")] for n in "qkv"])
            key = key.replace(".attn.to_q.", ".attn.qkv_proj.")
        if ".ff.net.0.proj." in key:
            value = torch.cat(value.chunk(2)[::-1])
        for old, new in MINIMAX_H3_PREFIXES.items():
            if key.startswith(old):
                key = new + key[len(old):]
                break
        for old, new in MINIMAX_H3_BLOCK.items():
            key = key.replace(old, new)
        out[prefix + key] = value.contiguous()
    out[prefix + "rope.inv_freq"] = model.rope.inv_freq.clone()
    return out


def minimax_h3_file(folder) -> Path:
    """The tiny random H3 (random_minimax_h3's defaults) saved as the Comfy-Org single file in folder."""
    from safetensors.torch import save_file
    path = Path(folder) / "h3_f32.safetensors"
    save_file(minimax_h3_comfy_layout(random_minimax_h3()), path)
    return path


def int8_convrot_state(state: dict, is_linear, group: int = 64) -> dict:
    """state with each 2-D weight that is_linear(key) picks as ComfyUI's INT8 ConvRot (codes, [N, 1] scales, a
    .comfy_quant marker); the rest as it is."""
    import json

    from dit_core.weights import quantize_convrot
    marker = json.dumps({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group})
    out = {}
    for key, value in state.items():
        if key.endswith(".weight") and value.dim() == 2 and is_linear(key):
            layer = key[: -len(".weight")]
            q, s = quantize_convrot(value, group)
            out.update({key: q, f"{layer}.weight_scale": s,
                        f"{layer}.comfy_quant": torch.tensor(list(marker.encode()), dtype=torch.uint8)})
        else:
            out[key] = value
    return out


def nvfp4_state(state: dict, is_linear, awq: bool = True, seed: int = 0) -> tuple[dict, dict]:
    """(state with each 2-D weight that is_linear(key) picks stored as ComfyUI's `nvfp4` by comfy-kitchen's
    quantizer: E2M1 codes, swizzled FP8 block scales, a tensor scale, a .comfy_quant marker and, with awq, a
    per-input pre_quant_scale as NVFP4-AWQ files carry; the same state with those weights as the layers compute
    them, kitchen's dequantization times pre_quant_scale along the inputs)."""
    import json

    import comfy_kitchen
    marker = torch.tensor(list(json.dumps({"format": "nvfp4"}).encode()), dtype=torch.uint8)
    g = torch.Generator().manual_seed(seed)
    stored, computed = {}, {}
    for key, value in state.items():
        stored[key] = computed[key] = value
        if key.endswith(".weight") and value.dim() == 2 and is_linear(key):
            layer = key[: -len(".weight")]
            pre = torch.rand(value.shape[1], generator=g) + 0.5 if awq else None
            w = value.float() / pre if awq else value.float()  # AWQ's scales come out again in the product
            tensor_scale = w.abs().amax() / (448.0 * 6.0)
            with comfy_kitchen.use_backend("eager"):
                packed, block = comfy_kitchen.quantize_nvfp4(w, tensor_scale)
                decoded = comfy_kitchen.dequantize_nvfp4(packed, tensor_scale, block, torch.float32)
            stored.update({key: packed, f"{layer}.weight_scale": block, f"{layer}.weight_scale_2": tensor_scale,
                           f"{layer}.comfy_quant": marker.clone()})
            if awq:
                stored[f"{layer}.pre_quant_scale"] = pre.to(torch.bfloat16)
            computed[key] = decoded * pre.to(torch.bfloat16).float() if awq else decoded
    return stored, computed


# reference/families/flux3_klein.md section 9: Qwen3-VL-4B's text model in small (34 layers, so the taps 4, ..., 32
# keep their real indices and none of them is the last layer), with a one-block vision tower the text never uses.
QWEN3_VL_TEXT_TINY = {"vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 34,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
                      "max_position_embeddings": 262144,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_interleaved": True,
                                          "mrope_section": [4, 2, 2]}}
QWEN3_VL_VISION_TINY = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                        "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2,
                        "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}


def random_qwen3_vl(seed: int = 0, **text_overrides):
    """transformers' Qwen3VLForConditionalGeneration (the class diffusers' FLUX.3 pipeline runs) with every
    parameter random, RMSNorm gains around 1."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    torch.manual_seed(seed)
    config = Qwen3VLConfig(text_config={**QWEN3_VL_TEXT_TINY, **text_overrides},
                           vision_config=QWEN3_VL_VISION_TINY, tie_word_embeddings=True)
    model = Qwen3VLForConditionalGeneration(config).eval()
    return randomize_language_model(model)


def qwen3_vl_layout(model, layout: str = "hf") -> dict[str, torch.Tensor]:
    """Qwen3VLForConditionalGeneration's weights as a file holds them: "hf" as transformers saves it
    (model.language_model.*, model.visual.*; lm_head tied, so not stored), "comfy" as ComfyUI's text_encoders
    files hold a VL model (language model under "model.", vision tower under "visual.")."""
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    if layout == "hf":
        return state
    renames = (("model.language_model.", "model."), ("model.visual.", "visual."))
    out = {}
    for key, value in state.items():
        for old, new in renames:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


# A tiny AutoencoderKLFlux2: FLUX.2's four levels (factor 8, /16 packed) and 32 latent channels, norm groups of 4-8.
FLUX2_VAE_TINY = {"block_out_channels": (16, 32, 32, 64), "layers_per_block": 1, "norm_num_groups": 4,
                  "latent_channels": 32}


def tiny_flux2_vae(seed: int = 1, **overrides):
    """diffusers' AutoencoderKLFlux2 with every parameter random and random batch-norm statistics."""
    from diffusers import AutoencoderKLFlux2
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(**{**FLUX2_VAE_TINY, **overrides}).eval()
    randomize(vae, seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape, generator=g))
        vae.bn.running_var.copy_(0.2 + 2.0 * torch.rand(vae.bn.running_var.shape, generator=g))
    return vae


def flux2_vae_bfl_layout(vae, prefix: str = "") -> dict[str, torch.Tensor]:
    """diffusers' AutoencoderKLFlux2 -> BFL's flux2-vae.safetensors names: the LDM names of to_bfl, with the
    quant convs nested (encoder.quant_conv, decoder.post_quant_conv: the inverse of ComfyUI v0.3.75 comfy/sd.py's
    rename) and the batch-norm buffers as `bn.*`."""
    nested = {"quant_conv.": "encoder.quant_conv.", "post_quant_conv.": "decoder.post_quant_conv."}
    out = {}
    for key, t in to_bfl(vae.state_dict(), len(vae.config.block_out_channels)).items():
        top = next((old for old in nested if key.startswith(old)), None)
        out[prefix + (nested[top] + key[len(top):] if top else key)] = t
    return out


def save_flux2_vae(vae, path, prefix: str = "") -> dict[str, torch.Tensor]:
    state = flux2_vae_bfl_layout(vae, prefix)
    save_file(state, str(path))
    return state


def random_block(a: Arch, sandwich: bool, seed: int = 0) -> Block:
    """A host block of arch a with random weights at sane scales (gains around 1); sandwich: post norms too."""
    g = torch.Generator().manual_seed(seed)
    lin = lambda n, k: Linear(torch.randn(n, k, generator=g) * k ** -0.5)  # noqa: E731
    gain = lambda n: 1 + 0.2 * torch.randn(n, generator=g)  # noqa: E731
    post = (gain(a.hidden), gain(a.hidden)) if sandwich else (None, None)
    norms = (gain(a.hidden), gain(a.hidden)) if a.norm == "rms" else (None, None)
    return Block((lin(3 * a.width, a.hidden), lin(a.hidden, a.width), lin(2 * a.ffn, a.hidden),
                  lin(a.hidden, a.ffn), *norms, gain(a.head), gain(a.head), *post))


# reference/families/ltx25.md section 10's tiny LTX-2.5 (video 2 x 16, audio 2 x 8), as 2.5 ships it.
LTX25_TINY = dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
                  audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=8,
                  audio_cross_attention_dim=16, num_layers=2, gated_attn=True, audio_gated_attn=True,
                  cross_attn_mod=True, audio_cross_attn_mod=True, rope_type="split", use_prompt_embeddings=False,
                  ff_bias=False, use_prompt_adaln_single=True, use_keyframes_abs_pos_embedding=True)
# diffusers' names -> the Comfy-Org single file's (convert_ltx2_transformer_to_diffusers inverted, plus the prompt
# AdaLN it lacks): whole-name prefixes, then the names inside a block.
LTX25_PREFIXES = {"proj_in.": "patchify_proj.", "audio_proj_in.": "audio_patchify_proj.",
                  "time_embed.": "adaln_single.", "audio_time_embed.": "audio_adaln_single.",
                  "prompt_adaln.": "prompt_adaln_single.", "audio_prompt_adaln.": "audio_prompt_adaln_single.",
                  "av_cross_attn_video_scale_shift.": "av_ca_video_scale_shift_adaln_single.",
                  "av_cross_attn_audio_scale_shift.": "av_ca_audio_scale_shift_adaln_single.",
                  "av_cross_attn_video_a2v_gate.": "av_ca_a2v_gate_adaln_single.",
                  "av_cross_attn_audio_v2a_gate.": "av_ca_v2a_gate_adaln_single."}
LTX25_BLOCK = {".video_a2v_cross_attn_scale_shift_table": ".scale_shift_table_a2v_ca_video",
               ".audio_a2v_cross_attn_scale_shift_table": ".scale_shift_table_a2v_ca_audio",
               ".norm_q.": ".q_norm.", ".norm_k.": ".k_norm."}


def random_ltx25(seed: int = 0, **overrides):
    """diffusers' LTX2VideoTransformer3DModel (LTX25_TINY) with every parameter random (gains near 1), f32."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformer3DModel
    torch.manual_seed(seed)
    model = LTX2VideoTransformer3DModel(**{**LTX25_TINY, **overrides}).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm_q.weight", "norm_k.weight")):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "scale_shift_table" in name:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() == 2 else 0.1 * torch.randn_like(p))
    return model


def ltx25_comfy_layout(model, prefix: str = "model.diffusion_model.") -> dict:
    """diffusers' LTX2VideoTransformer3DModel -> the Comfy-Org single file's names."""
    out = {}
    for key, value in model.state_dict().items():
        for old, new in LTX25_PREFIXES.items():
            if key.startswith(old):
                key = new + key[len(old):]
                break
        for old, new in LTX25_BLOCK.items():
            key = key.replace(old, new)
        out[prefix + key] = value.contiguous()
    return out


def random_ltx2_upsampler(seed: int = 0, **overrides):
    """diffusers' LTX2LatentUpsamplerModel, spatial x2, tiny (16 latent channels, 32 inside, one res block a side),
    every parameter random (norm gains near 1)."""
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
    torch.manual_seed(seed)
    config = {"in_channels": 16, "mid_channels": 32, "num_blocks_per_stage": 1, **overrides}
    model = LTX2LatentUpsamplerModel(**config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.1 if p.dim() == 1 else p[0].numel() ** -0.5))
    return model


def save_ltx2_upsampler(model, path) -> None:
    """The upsampler as the released file holds it: diffusers' names are the original ones (buffers included), the
    config in the header as ComfyUI's loader reads it."""
    import json
    cfg = model.config
    config = {"_class_name": "LatentUpsampler", "in_channels": cfg.in_channels, "mid_channels": cfg.mid_channels,
              "num_blocks_per_stage": cfg.num_blocks_per_stage, "dims": cfg.dims,
              "spatial_upsample": cfg.spatial_upsample, "temporal_upsample": cfg.temporal_upsample,
              "spatial_scale": cfg.rational_spatial_scale, "rational_resampler": cfg.use_rational_resampler}
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"config": json.dumps(config)})


# The vocoder's output layers scaled so that some first-stage samples pass 1 (the stage clamp matters) while the
# result mostly stays inside the final clamp (a comparison means something).
VOCODER_OUT_SCALE = {"vocoder": 0.2, "bwe_generator": 0.05}


def randomized_vocoder(vocoder, seed: int = 7):
    """diffusers' LTX2VocoderWithBWE with random weights: convolutions fan-in scaled, SnakeBeta's log alpha/beta
    small, the mel basis positive; the sinc filters as computed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(vocoder.named_parameters()) + list(vocoder.named_buffers()):
            if not name.endswith(".filter"):
                r = torch.randn(p.shape, generator=g)
                p.copy_(r.abs() if "mel_basis" in name else 0.3 * r if ".act." in name
                        else VOCODER_OUT_SCALE[name.split(".")[0]] * r / p[0].numel() ** 0.5 if "conv_out" in name
                        else r / p[0].numel() ** 0.5 if p.dim() >= 2 else 0.5 * r)
    return vocoder.eval()


def ltx2_vocoder_names(state: dict) -> dict:
    """diffusers' LTX2VocoderWithBWE names -> ComfyUI's VocoderWithBWE (the file's, under `vocoder.`)."""
    out = {}
    for k, v in state.items():
        for a, b in (("conv_in", "conv_pre"), ("upsamplers", "ups"), ("resnets", "resblocks"),
                     ("act_out", "act_post"), ("conv_out", "conv_post"),
                     ("downsample.filter", "downsample.lowpass.filter")):
            k = k.replace(f".{a}.", f".{b}.").replace(f".{a}", f".{b}") if f".{a}" in k else k
        out["vocoder." + k] = v.contiguous()
    return out


def save_ltx2_audio(vae, vocoder, path, seed: int = 8) -> tuple[dict, dict]:
    """diffusers' audio VAE and vocoder as the released audio file holds them (ComfyUI's LTXVAudioVAELoader reads
    it): the VAE under `audio_vae.` with random per-channel statistics, the vocoder under `vocoder.` in ComfyUI's
    names, its stages' config in the header. Returns (the statistics, the file's tensors)."""
    import json
    g = torch.Generator().manual_seed(seed)
    stats = {"audio_vae.per_channel_statistics.mean-of-means": 0.5 * torch.randn(128, generator=g),
             "audio_vae.per_channel_statistics.std-of-means": 0.5 + torch.rand(128, generator=g)}
    state = {"audio_vae." + k: v.contiguous() for k, v in vae.state_dict().items() if not k.startswith("latents_")}
    state.update(stats)
    state.update(ltx2_vocoder_names(vocoder.state_dict()))
    c = vocoder.config
    config = {"vocoder": {"vocoder": {"upsample_rates": list(c.upsample_factors), "use_tanh_at_final": False,
                                      "resblock_dilation_sizes": [list(d) for d in c.resnet_dilations]},
                          "bwe": {"upsample_rates": list(c.bwe_upsample_factors),
                                  "resblock_dilation_sizes": [list(d) for d in c.bwe_resnet_dilations],
                                  "input_sampling_rate": 16000, "output_sampling_rate": 48000,
                                  "hop_length": c.hop_length}}}
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path),
              metadata={"config": json.dumps(config)})
    return stats, state


# Krea 2's style reference reads its picture with Qwen3-VL-4B, whose DeepStack feeds decoder layers 0, 1 and 2: the
# tiny text model at 4B's depth (36 layers: the taps 2, ..., 35 keep their real indices) with a three-block tower,
# each block a DeepStack layer, so that Krea 2's first tap (hidden_states[2]) is one DeepStack reaches.
QWEN3_VL_VISION_DEEPSTACK3_TINY = {**QWEN3_VL_VISION_TINY, "depth": 3, "deepstack_visual_indexes": [0, 1, 2]}


def random_krea2_qwen3_vl(seed: int = 0):
    """transformers' Qwen3VLForConditionalGeneration of Krea 2's shape in small (36 layers, three DeepStack layers),
    every parameter random as random_qwen3_vl's."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    torch.manual_seed(seed)
    config = Qwen3VLConfig(text_config={**QWEN3_VL_TEXT_TINY, "num_hidden_layers": 36},
                           vision_config=QWEN3_VL_VISION_DEEPSTACK3_TINY, tie_word_embeddings=True)
    return randomize_language_model(Qwen3VLForConditionalGeneration(config).eval())


def byte_tokenizer(special_tokens):
    """A byte-level BPE without merges (one token a byte) and special_tokens added: OmniVoice's text tokenizer
    for tiny models (its real one is Qwen3's; only the special tokens' handling matters to the tests)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_tokens(list(special_tokens), special_tokens=True)
    return fast


@contextmanager
def torchaudio_stand_in():
    """While the omnivoice package and transformers' Higgs codec import: a stand-in torchaudio where none is
    installed (it has no build for our torch; reference/families/omnivoice.md section 9), taken out again after.
    transformers caches its first answer to whether torchaudio is there: asked first, it stays no. Yields whether
    it stood in."""
    if importlib.util.find_spec("torchaudio") is not None:
        yield False
        return
    from transformers.utils import is_torchaudio_available
    is_torchaudio_available()
    stub = types.ModuleType("torchaudio")
    stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    sys.modules["torchaudio"] = stub
    try:
        yield True
    finally:
        sys.modules.pop("torchaudio", None)
