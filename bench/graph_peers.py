"""diffusers' pipelines end to end as bench/bench_graph.py's peers for FLUX.3 Klein and Krea 2, one process a peer.

    python bench/graph_peers.py prepare FAMILY MODELS DIR [--smoke]   # once, untimed: DIR/<component>/ saved
    python bench/graph_peers.py run FAMILY DIR --t0 T [--smoke]       # timed: prints one JSON line a case

prepare reads the same random files bench_graph.py writes (ComfyUI's layouts; INT8 ConvRot linears dequantized
to BF16: the BF16 weights the INT8 file stands for), renames them with diffusers' single-file converters
(convert_flux3_transformer_checkpoint_to_diffusers, convert_krea2_transformer_checkpoint_to_diffusers,
convert_wan_vae_to_diffusers) or the inverse of tests/tiny_models.py's maps (the FLUX.2 VAE, Qwen3-VL's comfy
layout), and saves each component with save_pretrained, as a diffusers repo holds it. The Qwen3-VL vision tower,
which the files leave out (the text path never reads it), is random: from_pretrained loads it as a user's does.

run is what a user of the pipeline does: from_pretrained each component in BF16, .to(device), then three images
(1: cold, from the process start t0 to the first image; 2: a new prompt and seed; 3: the same prompt, a new
seed). The pipelines re-encode the prompt on every call (diffusers caches nothing): case 3 passes nothing but
the prompt, as a plain user does. FLUX.3 Klein: Flux3DistilledAutoBlocks (the modular pipeline; its prompt
upsampler popped, the prompt encoded as given, as our workflow does), 16 steps. Krea 2: Krea2Pipeline
(is_distilled=True, guidance_scale=0, the turbo recipe of its docstring), 8 steps.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
TOKENIZER_DIR = ROOT / ".cache" / "comfyui-0.3.75" / "comfy" / "text_encoders" / "qwen25_tokenizer"
KLEIN_FILES = ("flux3-image-klein-int8-convrot.safetensors", "qwen3vl_4b_int8_convrot.safetensors",
               "flux2-vae.safetensors")
KREA2_FILES = ("krea2_turbo_int8_convrot.safetensors", "qwen3vl_4b_int8_convrot.safetensors",
               "qwen_image_vae.safetensors")
STEPS = {"flux3_klein": 16, "krea2": 8}
# --smoke: the tiny models' sizes (tests/tiny_models.py); 64x64, 2 steps.
KLEIN_TINY = {"in_channels": 128, "cond_in_channels": 128, "joint_attention_dim": 8 * 64}
KREA2_SMOKE = {"in_channels": 64, "text_hidden_dim": 64, "num_text_layers": 12}
WAN_TINY = dict(dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                temperal_downsample=[False, True, True], dropout=0.0)


# --- prepare (untimed) ----------------------------------------------------------------------------------------

def read_bf16(path: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """A file's tensors (prefix stripped), INT8 ConvRot linears dequantized: float tensors in BF16, VAE's F32 kept."""
    from safetensors.torch import load_file

    from dit_core.weights.convrot import dequantize_convrot
    raw = load_file(str(path))
    out = {}
    for key, value in raw.items():
        if key.endswith((".comfy_quant", ".weight_scale")):
            continue
        layer = key[: -len(".weight")]
        if value.dtype == torch.int8:
            group = json.loads(bytes(raw[f"{layer}.comfy_quant"].tolist()).decode())["convrot_groupsize"]
            value = dequantize_convrot(value, raw[f"{layer}.weight_scale"], group).to(torch.bfloat16)
        out[key[len(prefix):] if key.startswith(prefix) else key] = value
    return out


def zip_inverse(meta_state: dict, layout, file_state: dict) -> dict[str, torch.Tensor]:
    """The inverse of a one-to-one layout map of tests/tiny_models.py: layout(meta_state) keeps the order of its
    input, so zipping the two key lists pairs each diffusers/transformers name with its file name."""
    mapped = layout(meta_state)
    assert len(mapped) == len(meta_state), (len(mapped), len(meta_state))
    return {ours: file_state[theirs].reshape(meta_state[ours].shape) for ours, theirs in zip(meta_state, mapped)}


def fill_and_save(model, state: dict, out: Path) -> None:
    """model (on the meta device) with state assigned; what state lacks (the vision tower) random; saved in BF16."""
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    assert not unexpected, unexpected[:5]
    names = set(missing)
    for mod_name, module in model.named_modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in list(getattr(module, kind).items()):
                full = f"{mod_name}.{name}" if mod_name else name
                if t is not None and t.is_meta and (full in names or kind == "_buffers"):
                    new = torch.randn(t.shape) * (t.shape[-1] ** -0.5 if t.dim() >= 2 else 0.02)
                    if full.endswith("norm.weight") or full.endswith("norm1.weight") or full.endswith("norm2.weight"):
                        new = 1 + new
                    new = new.to(t.dtype)
                    getattr(module, kind)[name] = torch.nn.Parameter(new, requires_grad=False) \
                        if kind == "_parameters" else new
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    assert not left, left[:5]
    model.to(torch.bfloat16).save_pretrained(str(out))


def qwen3_vl_state(path: Path, for_model: bool) -> dict:
    """Qwen3-VL's text model from ComfyUI's layout (`model.*`): transformers' names, the inverse of
    tiny_models.qwen3_vl_layout (model.language_model.*; Qwen3VLModel: language_model.*)."""
    state = read_bf16(path)
    prefix = "language_model." if for_model else "model.language_model."
    return {prefix + k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}


def text_config(smoke: bool):
    from transformers import Qwen3VLConfig
    from real_size import QWEN3_VL_4B_TEXT
    from tiny_models import QWEN3_VL_TEXT_TINY, QWEN3_VL_VISION_TINY
    if smoke:
        return Qwen3VLConfig(text_config={**QWEN3_VL_TEXT_TINY, "num_hidden_layers": 36}, vision_config=QWEN3_VL_VISION_TINY,
                             tie_word_embeddings=True)
    return Qwen3VLConfig(text_config=QWEN3_VL_4B_TEXT, tie_word_embeddings=True)


def prepare(family: str, models: Path, out: Path, smoke: bool) -> None:
    from diffusers.loaders.single_file_utils import (convert_flux3_transformer_checkpoint_to_diffusers,
                                                     convert_krea2_transformer_checkpoint_to_diffusers,
                                                     convert_wan_vae_to_diffusers)
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLModel
    done = out / "done"
    if done.exists():
        return
    text_cfg = text_config(smoke)
    if family == "flux3_klein":
        from diffusers import AutoencoderKLFlux2
        from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
        from tiny_models import FLUX2_VAE_TINY, FLUX3_TINY, flux2_vae_bfl_layout
        dit_file, te_file, vae_file = KLEIN_FILES
        with torch.device("meta"):
            dit = Flux3Transformer2DModel(**({**FLUX3_TINY, **KLEIN_TINY} if smoke else {"flow_map": True}))
            te = Qwen3VLForConditionalGeneration(text_cfg)
            vae = AutoencoderKLFlux2(**(FLUX2_VAE_TINY if smoke else {}))
        state = read_bf16(models / "diffusion_models" / dit_file, "model.diffusion_model.")
        fill_and_save(dit, convert_flux3_transformer_checkpoint_to_diffusers(state), out / "transformer")
        fill_and_save(te, qwen3_vl_state(models / "text_encoders" / te_file, False), out / "text_encoder")
        meta = dict(vae.state_dict())
        vae_state = zip_inverse(meta, lambda s: flux2_vae_bfl_layout(_StateHolder(s, vae.config)),
                                read_bf16(models / "vae" / vae_file))
        fill_and_save(vae, vae_state, out / "vae")
    else:
        from diffusers import AutoencoderKLQwenImage
        from diffusers.models.transformers.transformer_krea2 import Krea2Transformer2DModel
        from tiny_models import KREA2_TINY
        dit_file, te_file, vae_file = KREA2_FILES
        with torch.device("meta"):
            dit = Krea2Transformer2DModel(**({**KREA2_TINY, **KREA2_SMOKE} if smoke else {}))
            te = Qwen3VLModel(text_cfg)
            vae = AutoencoderKLQwenImage(**({"base_dim": WAN_TINY["dim"]} if smoke else {}))
        state = read_bf16(models / "diffusion_models" / dit_file)
        fill_and_save(dit, convert_krea2_transformer_checkpoint_to_diffusers(state), out / "transformer")
        fill_and_save(te, qwen3_vl_state(models / "text_encoders" / te_file, True), out / "text_encoder")
        fill_and_save(vae, convert_wan_vae_to_diffusers(read_bf16(models / "vae" / vae_file)), out / "vae")
    done.write_text("ok\n")


class _StateHolder:
    """What flux2_vae_bfl_layout reads from a VAE: state_dict() and config.block_out_channels."""

    def __init__(self, state: dict, config):
        self._state, self.config = state, config

    def state_dict(self) -> dict:
        return self._state


def write_smoke_files(root: Path) -> Path:
    """Tiny random files in the real files' layouts and names under root/<model folder>/ (tests/tiny_models.py's
    builders; the transformers' and text encoder's block linears as INT8 ConvRot, group 16)."""
    from safetensors.torch import save_file

    import tiny_models as tm
    torchvision_shim()
    files = root / "peers_smoke"
    if (files / "done").exists():
        return files
    for folder in ("diffusion_models", "text_encoders", "vae"):
        (files / folder).mkdir(parents=True, exist_ok=True)
    blocks = lambda k: any(p in k for p in ("blocks.", "model.layers."))  # noqa: E731
    klein = tm.flux3_bfl_layout(tm.random_flux3(**KLEIN_TINY).state_dict(), "model.diffusion_model.")
    krea2 = tm.krea2_original_layout(tm.random_krea2(**KREA2_SMOKE).state_dict())
    text = {k: v for k, v in tm.qwen3_vl_layout(tm.random_qwen3_vl(num_hidden_layers=36), "comfy").items()
            if not k.startswith("visual.")}
    for path, state in ((files / "diffusion_models" / KLEIN_FILES[0], klein),
                        (files / "diffusion_models" / KREA2_FILES[0], krea2), (files / "text_encoders" / KLEIN_FILES[1], text)):
        state = tm.int8_convrot_state({k: v.to(torch.bfloat16) for k, v in state.items()}, blocks, 16)
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    save_file(tm.flux2_vae_bfl_layout(tm.tiny_flux2_vae()), str(files / "vae" / KLEIN_FILES[2]))
    save_file(comfy_wan_vae(), str(files / "vae" / KREA2_FILES[2]))
    (files / "done").write_text("ok\n")
    return files


def comfy_wan_vae() -> dict[str, torch.Tensor]:
    """A tiny random qwen_image_vae file as ComfyUI v0.3.75 builds the model from it (Wan 2.1's VAE)."""
    comfy_tree = str(ROOT / ".cache" / "comfyui-0.3.75")
    if comfy_tree not in sys.path:
        sys.path.append(comfy_tree)
    import comfy.options
    comfy.options.enable_args_parsing(False)
    import comfy.cli_args
    comfy.cli_args.args.cpu = True
    from comfy.ldm.wan.vae import WanVAE
    from real_size import random_tensor
    wan = WanVAE(**WAN_TINY)
    return {k: random_tensor(k, list(v.shape), torch.device("cpu")) for k, v in wan.state_dict().items()}


# --- run (timed) ------------------------------------------------------------------------------------------------

def processor():
    """What diffusers' FLUX.3 text step reads from its AutoProcessor: apply_chat_template and .tokenizer (the
    Qwen2 tokenizer the repo's processor wraps; tests/dit_core/text/test_qwen3_vl.py's stand-in)."""
    from transformers import Qwen2Tokenizer
    return QwenProcessor(Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR)))


class QwenProcessor:
    def __init__(self, tokenizer):
        self.tokenizer, self.apply_chat_template = tokenizer, tokenizer.apply_chat_template


def load_pipeline(family: str, root: Path, dev: torch.device):
    import importlib.util
    bf16 = torch.bfloat16
    no_accelerate = importlib.util.find_spec("accelerate") is None
    if family == "flux3_klein":
        from diffusers import AutoencoderKLFlux2, Flux3DistilledAutoBlocks
        from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
        from transformers import Qwen3VLForConditionalGeneration
        if no_accelerate:  # from_pretrained keeps f32 modules only through accelerate (absent here: the smoke)
            Flux3Transformer2DModel._keep_in_fp32_modules = None
        blocks = Flux3DistilledAutoBlocks()
        blocks.sub_blocks.pop("prompt_upsampler")
        pipe = blocks.init_pipeline()
        pipe.update_components(
            transformer=Flux3Transformer2DModel.from_pretrained(str(root / "transformer"), torch_dtype=bf16).to(dev),
            text_encoder=Qwen3VLForConditionalGeneration.from_pretrained(str(root / "text_encoder"),
                                                                         dtype=torch.bfloat16).to(dev),
            vae=AutoencoderKLFlux2.from_pretrained(str(root / "vae"), torch_dtype=bf16).to(dev),
            tokenizer=processor())
        pipe.load_components()  # the from_config ones (scheduler, image processor)
        return pipe
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler
    from diffusers.models.transformers.transformer_krea2 import Krea2Transformer2DModel
    from diffusers.pipelines.krea2.pipeline_krea2 import Krea2Pipeline
    from transformers import Qwen2Tokenizer, Qwen3VLModel
    if no_accelerate:  # as for Klein above (the smoke only)
        Krea2Transformer2DModel._keep_in_fp32_modules = AutoencoderKLQwenImage._keep_in_fp32_modules = None
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=6400)
    return Krea2Pipeline(
        scheduler=scheduler,
        vae=AutoencoderKLQwenImage.from_pretrained(str(root / "vae"), torch_dtype=bf16),
        text_encoder=Qwen3VLModel.from_pretrained(str(root / "text_encoder"), dtype=torch.bfloat16),
        tokenizer=Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR)),
        transformer=Krea2Transformer2DModel.from_pretrained(str(root / "transformer"), torch_dtype=bf16),
        is_distilled=True).to(dev)


def generate(family: str, pipe, prompt: str, seed: int, size: int, steps: int, dev: torch.device):
    gen = torch.Generator(dev).manual_seed(seed)
    if family == "flux3_klein":
        return pipe(prompt=prompt, height=size, width=size, num_inference_steps=steps, generator=gen,
                    output_type="pil", output="images")
    return pipe(prompt=prompt, height=size, width=size, num_inference_steps=steps, guidance_scale=0.0,
                generator=gen, output_type="pil").images


def host_gb() -> float:
    """The peak RSS of this process so far (ru_maxrss, KiB on Linux)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def timed_cases(prompts: list[str], repeats: int = 1) -> list[tuple[str, str, int]]:
    """(case, prompt, seed) in the order run: cold on the first prompt; `repeats` new prompts, each with a new seed;
    then the last of them `repeats` times with new seeds (a case's figure: the median of its runs)."""
    if len(prompts) < repeats + 1:
        raise ValueError(f"{repeats} new prompts need {repeats + 1} prompts, got {len(prompts)}")
    return ([("1 cold", prompts[0], 1)] + [("2 new prompt and seed", prompts[1 + i], 2 + i) for i in range(repeats)]
            + [("3 same prompt, new seed", prompts[repeats], 100 + i) for i in range(repeats)])


def run(family: str, root: Path, t0: float, smoke: bool, prompts: list[str], repeats: int = 1) -> None:
    dev = torch.device("cpu" if smoke else "cuda")
    size, steps = (64, 2) if smoke else (1024, STEPS[family])
    pipe = load_pipeline(family, root, dev)
    for case, prompt, seed in timed_cases(prompts, repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.time()
        images = generate(family, pipe, prompt, seed, size, steps, dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        end = time.time()
        assert len(images) == 1 and images[0].size == (size, size), images
        card = torch.cuda.max_memory_allocated() / 1e9 if dev.type == "cuda" else 0.0
        seconds = end - (t0 if case == "1 cold" else start)
        print(json.dumps({"case": case, "seconds": seconds, "card_gb": card, "host_gb": host_gb()}), flush=True)


def torchvision_shim() -> None:
    """CPU torch beside a CUDA torchvision wheel (as tests/conftest.py): transformers' imports would fail."""
    if "torchvision" not in sys.modules and not torch.cuda.is_available():
        from host.run_comfy import TorchvisionOpsShim
        sys.meta_path.insert(0, TorchvisionOpsShim())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("prepare", "run"))
    p.add_argument("family", choices=("flux3_klein", "krea2"))
    p.add_argument("paths", nargs="+", help="prepare: MODELS DIR; run: DIR")
    p.add_argument("--t0", type=float, help="run: the process start, time.time() of the parent before the spawn")
    p.add_argument("--prompts", nargs="+")
    p.add_argument("--repeats", type=int, default=1, help="run: new prompts, and new seeds of the last, each")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    torchvision_shim()
    if args.what == "prepare":
        prepare(args.family, Path(args.paths[0]), Path(args.paths[1]), args.smoke)
    else:
        run(args.family, Path(args.paths[0]), args.t0, args.smoke, args.prompts, args.repeats)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
