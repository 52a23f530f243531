"""API-format Z-Image graphs for POST /prompt: the stock graph and ours (docs/nodes.md), on the same files."""

from __future__ import annotations

from dataclasses import dataclass

# Node ids are fixed so that tests and reports can name them (e.g. progress events of the sampler).
TEXT_LOADER, TEXT_ENCODE, NEGATIVE, LATENT = "1", "2", "3", "4"
MODEL_LOADER, SAMPLING, SAMPLER, VAE_LOADER, DECODE, SAVE = "10", "11", "12", "13", "14", "15"


@dataclass(frozen=True)
class Settings:
    """One text-to-image run; defaults are the Turbo template's sampler settings at a CPU-friendly size."""

    prompt: str = "a red fox sitting in fresh snow, golden hour"
    width: int = 128
    height: int = 96
    steps: int = 3
    seed: int = 42
    cfg: float = 1.0
    shift: float = 3.0
    sampler_name: str = "res_multistep"
    scheduler: str = "simple"
    denoise: float = 1.0
    unet_name: str = "z_image_turbo_bf16.safetensors"
    clip_name: str = "qwen_3_4b.safetensors"
    vae_name: str = "ae.safetensors"
    linears: str = "as stored"  # ours only (docs/nodes.md)
    gpu_budget_gb: float = 0  # ours only: 0 is automatic
    text_device: str = "default"  # our text encoder loader's device: "cpu" runs the host (f32) encoder
    filename_prefix: str = "swiftdit"


def _conditioning(s: Settings) -> dict:
    # Both graphs take their CONDITIONING from our text encoder nodes: the stock CLIPLoader builds a full
    # 36-layer Qwen3-4B, too heavy for CI; the two text encoders are compared on their own elsewhere.
    return {
        TEXT_LOADER: {
            "class_type": "SwiftDiTZImageTextEncoderLoader",
            "inputs": {"clip_name": s.clip_name, "type": "lumina2", "device": s.text_device},
        },
        TEXT_ENCODE: {
            "class_type": "SwiftDiTZImageTextEncode",
            "inputs": {"text": s.prompt, "clip": [TEXT_LOADER, 0]},
        },
        NEGATIVE: {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": [TEXT_ENCODE, 0]}},
        LATENT: {
            "class_type": "EmptySD3LatentImage",
            "inputs": {"width": s.width, "height": s.height, "batch_size": 1},
        },
        SAVE: {
            "class_type": "SaveImage",
            "inputs": {"images": [DECODE, 0], "filename_prefix": s.filename_prefix},
        },
    }


def _sampler_inputs(s: Settings) -> dict:
    return {
        "model": [SAMPLING, 0],
        "seed": s.seed,
        "steps": s.steps,
        "cfg": s.cfg,
        "sampler_name": s.sampler_name,
        "scheduler": s.scheduler,
        "positive": [TEXT_ENCODE, 0],
        "negative": [NEGATIVE, 0],
        "latent_image": [LATENT, 0],
        "denoise": s.denoise,
    }


def stock_graph(s: Settings = Settings()) -> dict:
    """UNETLoader -> ModelSamplingAuraFlow -> KSampler -> VAELoader/VAEDecode -> SaveImage (template
    image_z_image_turbo), conditioned by our text encoder."""
    g = _conditioning(s)
    g.update(
        {
            MODEL_LOADER: {
                "class_type": "UNETLoader",
                "inputs": {"unet_name": s.unet_name, "weight_dtype": "default"},
            },
            SAMPLING: {
                "class_type": "ModelSamplingAuraFlow",
                "inputs": {"model": [MODEL_LOADER, 0], "shift": s.shift},
            },
            SAMPLER: {"class_type": "KSampler", "inputs": _sampler_inputs(s)},
            VAE_LOADER: {"class_type": "VAELoader", "inputs": {"vae_name": s.vae_name}},
            DECODE: {"class_type": "VAEDecode", "inputs": {"samples": [SAMPLER, 0], "vae": [VAE_LOADER, 0]}},
        }
    )
    return g


def swiftdit_graph(s: Settings = Settings()) -> dict:
    """The same graph with the stock model, sampling, sampler, VAE and save nodes swapped for ours."""
    g = _conditioning(s)
    g.update(
        {
            MODEL_LOADER: {
                "class_type": "SwiftDiTZImageLoader",
                "inputs": {"unet_name": s.unet_name, "weight_dtype": "default", "linears": s.linears,
                           "gpu_budget_gb": s.gpu_budget_gb},
            },
            SAMPLING: {
                "class_type": "SwiftDiTZImageModelSamplingAuraFlow",
                "inputs": {"model": [MODEL_LOADER, 0], "shift": s.shift},
            },
            SAMPLER: {"class_type": "SwiftDiTZImageSampler", "inputs": _sampler_inputs(s)},
            VAE_LOADER: {"class_type": "SwiftDiTZImageVAELoader", "inputs": {"vae_name": s.vae_name}},
            DECODE: {
                "class_type": "SwiftDiTZImageVAEDecode",
                "inputs": {"samples": [SAMPLER, 0], "vae": [VAE_LOADER, 0]},
            },
        }
    )
    g[SAVE]["class_type"] = "SwiftDiTSaveImage"
    return g


def krea2_graph(seed: int, prompt: str = "a lighthouse on a cliff at dusk, oil painting") -> dict:
    """The Turbo t2i template's graph with our nodes, the prompt refiner off: loader -> KSampler (8 steps, cfg 1,
    euler/simple) on our text encoder's rows; stock EmptyLatentImage and VAELoader (qwen_image_vae), our VAE Decode of
    it and our Save Image."""
    return {
        "1": {"class_type": "SwiftDiTKrea2Loader",
              "inputs": {"unet_name": "krea2_turbo_int8_convrot.safetensors", "weight_dtype": "default",
                         "linears": "as stored", "gpu_budget_gb": 0}},
        "2": {"class_type": "SwiftDiTKrea2TextEncoderLoader",
              "inputs": {"clip_name": "qwen3vl_4b_fp8_scaled.safetensors", "type": "krea2", "device": "default"}},
        "3": {"class_type": "SwiftDiTKrea2TextEncode",
              "inputs": {"text": prompt, "clip": ["2", 0]}},
        "4": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["3", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
        "6": {"class_type": "SwiftDiTKrea2Sampler",
              "inputs": {"model": ["1", 0], "seed": seed, "steps": 8, "cfg": 1.0, "sampler_name": "euler",
                         "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0],
                         "latent_image": ["5", 0], "denoise": 1.0}},
        "7": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
        "8": {"class_type": "SwiftDiTKrea2VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["7", 0]}},
        "9": {"class_type": "SwiftDiTSaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "krea2"}},
    }
