"""Tiny random models of each reference implementation, and their weights in ComfyUI's file layouts."""
import torch
from transformers import Qwen3Config, Qwen3Model

from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel

# reference/families/z_image.md section 11; dim 192 (6 heads of 32) so the FFN is 512 wide and every linear
# has a power-of-4 ConvRot group for the INT8 tests.
Z_IMAGE_TINY = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=192, n_layers=2,
                    n_refiner_layers=1, n_heads=6, n_kv_heads=6, norm_eps=1e-5, qk_norm=True, cap_feat_dim=32,
                    rope_theta=256.0, t_scale=1000.0, axes_dims=[8, 12, 12], axes_lens=[1024, 512, 512])

QWEN3_TINY = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                  max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def random_z_image(seed: int = 0, **overrides) -> ZImageTransformer2DModel:
    """diffusers' Z-Image with every parameter random (its init zeroes pad tokens and some gains: hides bugs)."""
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


def random_qwen3(seed: int = 0, **overrides) -> Qwen3Model:
    """transformers' Qwen3 with every parameter random, RMSNorm gains around 1."""
    torch.manual_seed(seed)
    model = Qwen3Model(Qwen3Config(**{**QWEN3_TINY, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif p.dim() == 2 and "embed" not in name:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn_like(p))
    return model


def qwen3_comfy_layout(model: Qwen3Model, prefix: str = "") -> dict[str, torch.Tensor]:
    """ComfyUI's text_encoders layout: the HF names under `model.`."""
    return {f"{prefix}model.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
