"""The Z-Image nodes run in-process on ComfyUI v0.3.75's modules (no server): schemas, a whole graph against the
engine called directly, errors naming node and input, cancel, and memory: the loader's GPU budget, its report,
the hook that gives memory back to ComfyUI (streamed blocks, refilled on the next sample) and the companions
kept with a loaded model (its graphed step), cleared before its memory moves."""
import math
import re
import shutil

import pytest
import torch
from node_contract import assert_schemas_follow, pack_tokenizer_dir, run
from safetensors import safe_open
from safetensors.torch import save_file


@pytest.fixture(scope="module")
def pack(swiftdit_pack):
    import swiftdit_pack.nodes.z_image as z
    return z


@pytest.fixture(scope="module")
def models(pack, tmp_path_factory):
    """A tiny Z-Image, text encoder and VAE in ComfyUI's models folders (registered with folder_paths)."""
    import folder_paths
    from tiny_models import (
        qwen3_comfy_layout,
        random_qwen3,
        random_z_image,
        save_bfl,
        tiny_vae,
        z_image_comfy_layout,
    )
    root = tmp_path_factory.mktemp("models")
    for folder in ("diffusion_models", "text_encoders", "vae", "loras"):
        (root / folder).mkdir()
        folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    save_file(z_image_comfy_layout(random_z_image(in_channels=16, n_layers=4).state_dict()),
              root / "diffusion_models" / "z_image_tiny.safetensors")
    # A real model beside the folders: a name reaching it through ".." must be refused, not found missing.
    shutil.copy(root / "diffusion_models" / "z_image_tiny.safetensors", root / "secret.safetensors")
    save_file(qwen3_comfy_layout(random_qwen3(hidden_size=32, head_dim=8)),
              root / "text_encoders" / "qwen3_tiny.safetensors")
    save_bfl(tiny_vae("two_level"), root / "vae" / "ae_tiny.safetensors")
    g = torch.Generator().manual_seed(4)
    save_file({"diffusion_model.layers.0.attention.to_q.lora_A.weight": 0.1 * torch.randn(4, 192, generator=g),
               "diffusion_model.layers.0.attention.to_q.lora_B.weight": 0.1 * torch.randn(192, 4, generator=g)},
              root / "loras" / "tiny_lora.safetensors")
    save_file({"decoder.conv_in.weight": torch.zeros(4, 16, 3, 3)}, root / "diffusion_models" / "vae_here.safetensors")
    return root


# docs/nodes.md: each node's inputs in order (the stock node's widgets, then ours) and its output type.
CONTRACT = {
    "SwiftDiTZImageLoader": (["unet_name", "weight_dtype", "linears", "gpu_budget_gb"], "SWIFTDIT_MODEL"),
    "SwiftDiTZImageTextEncoderLoader": (["clip_name", "type", "device"], "SWIFTDIT_TEXT_ENCODER"),
    "SwiftDiTZImageTextEncode": (["text", "clip"], "CONDITIONING"),
    "SwiftDiTZImageModelSamplingAuraFlow": (["model", "shift"], "SWIFTDIT_MODEL"),
    "SwiftDiTZImageLoraLoaderModelOnly": (["model", "lora_name", "strength_model"], "SWIFTDIT_MODEL"),
    "SwiftDiTZImageSampler": (["model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive",
                               "negative", "latent_image", "denoise"], "LATENT"),
    "SwiftDiTZImageVAELoader": (["vae_name"], "SWIFTDIT_VAE"),
    "SwiftDiTZImageVAEDecode": (["samples", "vae"], "IMAGE"),
}


def test_schemas_follow_the_contract(pack):
    from comfy_api.latest import io
    assert_schemas_follow(pack.NODES, CONTRACT, "SwiftDiT/Z-Image")
    seed = next(i for i in pack.ZImageSampler.GET_SCHEMA().inputs if i.id == "seed")
    assert seed.control_after_generate
    budget = next(i for i in pack.ZImageLoader.GET_SCHEMA().inputs if i.id == "gpu_budget_gb")
    assert isinstance(budget, io.Float.Input) and (budget.default, budget.min) == (0.0, 0.0)


def graph(z, seed=7, width=16, height=12, steps=3, linears="as stored", lora=None, budget=0.0):
    (model,) = run(z.ZImageLoader, unet_name="z_image_tiny.safetensors", weight_dtype="default", linears=linears,
                   gpu_budget_gb=budget)
    if lora is not None:
        (model,) = run(z.ZImageLoraLoaderModelOnly, model=model, lora_name=lora[0], strength_model=lora[1])
    (model,) = run(z.ZImageModelSamplingAuraFlow, model=model, shift=3.0)
    (clip,) = run(z.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2")
    (positive,) = run(z.ZImageTextEncode, text="a red fox in the snow", clip=clip)
    negative = [[torch.zeros_like(positive[0][0]), {"pooled_output": None}]]  # ConditioningZeroOut
    latent = {"samples": torch.zeros(1, 16, height, width)}  # EmptySD3LatentImage
    (samples,) = run(z.ZImageSampler, model=model, seed=seed, steps=steps, cfg=1.0, sampler_name="res_multistep",
                     scheduler="simple", positive=positive, negative=negative, latent_image=latent, denoise=1.0)
    (vae,) = run(z.ZImageVAELoader, vae_name="ae_tiny.safetensors")
    (image,) = run(z.ZImageVAEDecode, samples=samples, vae=vae)
    return positive, samples, image


def test_graph_equals_the_engine(pack, models):
    from dit_core.families.z_image import ZImage
    from dit_core.text.qwen3 import Qwen3TextEncoder
    from dit_core.codecs.flux1_vae import SCALING, SHIFT
    from dit_core.sampling.ksampler import ksample
    from dit_core.codecs.flux1_vae import ImageDecoder
    positive, samples, image = graph(pack)
    rows = Qwen3TextEncoder.load(models / "text_encoders" / "qwen3_tiny.safetensors", pack_tokenizer_dir()).encode(
        "a red fox in the snow")
    assert torch.equal(positive[0][0], rows) and positive[0][1]["attention_mask"].shape == rows.shape[:2]
    dit = ZImage.load(models / "diffusion_models" / "z_image_tiny.safetensors")
    expected = ksample(dit.denoised, 7, 3, 1.0, "res_multistep", "simple", torch.zeros(1, 16, 12, 16),
                       positive=rows, negative=rows * 0, shift=3.0,
                       latent_shift=SHIFT, latent_scale=SCALING)
    assert torch.equal(samples["samples"], expected)
    assert torch.equal(image, ImageDecoder.load(models / "vae" / "ae_tiny.safetensors").decode(expected))
    assert image.shape == (1, 24, 32, 3) and 0 <= image.min() and image.max() <= 1


def test_lora_node_merges_the_lora(pack, models):
    from dit_core.families.z_image import ZImage
    from dit_core.codecs.flux1_vae import SCALING, SHIFT
    from dit_core.sampling.ksampler import ksample
    positive, samples, _ = graph(pack, lora=("tiny_lora.safetensors", 0.7))
    dit = ZImage.load(models / "diffusion_models" / "z_image_tiny.safetensors",
                      loras=((models / "loras" / "tiny_lora.safetensors", 0.7),))
    rows = positive[0][0]
    expected = ksample(dit.denoised, 7, 3, 1.0, "res_multistep", "simple", torch.zeros(1, 16, 12, 16),
                       positive=rows, negative=rows * 0, shift=3.0,
                       latent_shift=SHIFT, latent_scale=SCALING)
    assert torch.equal(samples["samples"], expected)
    assert not torch.equal(samples["samples"], graph(pack)[1]["samples"])
    from swiftdit_pack.nodes.base import SwiftDiTError
    with pytest.raises(SwiftDiTError, match="SwiftDiTZImageLoraLoaderModelOnly · lora_name"):
        graph(pack, lora=("missing.safetensors", 1.0))


def test_models_stay_loaded_and_are_freed_with_comfyui(pack, models, caplog):
    import comfy.model_management
    from swiftdit_pack.nodes.memory import LOADED, install_memory_hook
    install_memory_hook()
    graph(pack)
    with caplog.at_level("INFO", logger="SwiftDiT"):
        graph(pack, seed=8)
        assert "SwiftDiT: loaded" not in caplog.text  # the second prompt reuses the three models
        comfy.model_management.unload_all_models()
    assert "SwiftDiT: freed 3 models" in caplog.text and not LOADED._held


def test_errors_name_node_and_input(pack, models):
    """Each message names the node, the input and the fix; a name outside ComfyUI's folders is refused although the
    file it points at exists (the models fixture puts one there), and nothing is loaded."""
    from swiftdit_pack.nodes.base import SwiftDiTError
    from swiftdit_pack.nodes.memory import LOADED
    assert (models / "secret.safetensors").is_file()
    with pytest.raises(SwiftDiTError, match="SwiftDiTZImageLoader · unet_name: vae_here.safetensors: not a Z-Image"
                                            ".*; pick a Z-Image file such as z_image_turbo_bf16.safetensors"):
        run(pack.ZImageLoader, unet_name="vae_here.safetensors", weight_dtype="default", linears="as stored")
    held = dict(LOADED._held)
    with pytest.raises(SwiftDiTError, match="SwiftDiTZImageLoader · unet_name: '../secret.safetensors' is not in "
                                            ".*; put the file there and refresh"):
        run(pack.ZImageLoader, unet_name="../secret.safetensors", weight_dtype="default", linears="as stored")
    assert LOADED._held == held  # nothing loaded or replaced by the refused name
    with pytest.raises(SwiftDiTError, match="SwiftDiTZImageSampler · latent_image: .*patch grid.*image width and "
                                            "height must be multiples of 16 pixels"):
        graph(pack, width=15)


def test_bad_files_and_prompts_name_node_input_and_fix(pack, models):
    """A corrupt safetensors header on each loader, a LoRA of another model and a prompt past the text encoder's
    positions: each refused naming the node, the input and the fix."""
    from safetensors.torch import save_file
    from swiftdit_pack.nodes.base import SwiftDiTError
    made = [models / folder / "corrupt.safetensors" for folder in ("diffusion_models", "text_encoders", "vae", "loras")]
    made.append(models / "loras" / "flux1_lora.safetensors")
    try:
        for path in made[:4]:
            path.write_bytes(b"\xff" * 8 + b"not a header")  # declares more header bytes than the file holds
        save_file({"double_blocks.0.img_attn.qkv.lora_A.weight": torch.zeros(4, 3072),
                   "double_blocks.0.img_attn.qkv.lora_B.weight": torch.zeros(9216, 4)}, made[4])
        (model,) = run(pack.ZImageLoader, unet_name="z_image_tiny.safetensors", weight_dtype="default",
                       linears="as stored")
        corrupt = "corrupt.safetensors: corrupt safetensors header .*the download is probably truncated"
        for node, kw, message in [
                (pack.ZImageLoader, dict(unet_name="corrupt.safetensors", weight_dtype="default",
                                         linears="as stored"), f"unet_name: {corrupt}"),
                (pack.ZImageTextEncoderLoader, dict(clip_name="corrupt.safetensors", type="lumina2"),
                 f"clip_name: {corrupt}"),
                (pack.ZImageVAELoader, dict(vae_name="corrupt.safetensors"), f"vae_name: {corrupt}"),
                (pack.ZImageLoraLoaderModelOnly, dict(model=model, lora_name="corrupt.safetensors", strength_model=1.0),
                 f"lora_name: {corrupt}"),
                (pack.ZImageLoraLoaderModelOnly, dict(model=model, lora_name="flux1_lora.safetensors",
                                                      strength_model=1.0),
                 "lora_name: flux1_lora.safetensors: a LoRA for another model.*; pick a Z-Image LoRA")]:
            with pytest.raises(SwiftDiTError, match=f"{node.GET_SCHEMA().node_id} · {message}"):
                run(node, **kw)
    finally:
        for path in made:
            path.unlink(missing_ok=True)
    (clip,) = run(pack.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2")
    with pytest.raises(SwiftDiTError, match=r"SwiftDiTZImageTextEncode · text: the prompt is \d+ tokens .*more than "
                                            r"the text encoder's 40960; shorten it"):
        run(pack.ZImageTextEncode, text="a " * 41000, clip=clip)


def test_out_of_gpu_memory_names_node_and_fix(pack, models, monkeypatch):
    """An OOM in the step stays torch's OutOfMemoryError (ComfyUI then unloads its models and shows its hint),
    its message naming the sampler, the input and what to change."""
    import comfy.model_management
    from swiftdit_pack.dit_core.families.z_image import ZImage  # the pack's own modules, as ComfyUI loads them

    def no_room(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    monkeypatch.setattr(ZImage, "denoised", no_room)
    with pytest.raises(comfy.model_management.OOM_EXCEPTION,
                       match=r"SwiftDiTZImageSampler · latent_image: out of GPU memory \(CUDA out of memory. Tried "
                             r"to allocate 2.00 GiB\); use a smaller image or batch, or a lower gpu_budget_gb"):
        graph(pack)


def test_cancel_interrupts_within_a_step(pack, models, monkeypatch):
    """A cancel during a step stops it between blocks: the sampler's own check before each step is made blind here,
    so only the check inside the step can raise, and the first step must not finish."""
    import comfy.model_management
    from swiftdit_pack.dit_core.families.z_image import ZImage
    calls, finished, denoised = [], [], ZImage.denoised

    def counted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # Cancel, as the first step starts
            comfy.model_management.interrupt_current_processing(True)
        out = denoised(self, *args, **kwargs)
        finished.append(1)
        return out
    monkeypatch.setattr(ZImage, "denoised", counted)
    with monkeypatch.context() as blind:
        blind.setattr(comfy.model_management, "processing_interrupted", lambda: False)
        try:
            with pytest.raises(comfy.model_management.InterruptProcessingException):
                graph(pack)
        finally:
            comfy.model_management.interrupt_current_processing(False)
    assert calls == [1] and not finished
    graph(pack)  # usable after
    assert finished


def engine_samples(models, rows, seed=7):
    from dit_core.families.z_image import ZImage
    from dit_core.codecs.flux1_vae import SCALING, SHIFT
    from dit_core.sampling.ksampler import ksample
    dit = ZImage.load(models / "diffusion_models" / "z_image_tiny.safetensors")
    return ksample(dit.denoised, seed, 3, 1.0, "res_multistep", "simple", torch.zeros(1, 16, 12, 16),
                   positive=rows, negative=rows * 0, shift=3.0,
                       latent_shift=SHIFT, latent_scale=SCALING)


def test_loader_reports_where_the_model_is(pack, models, caplog):
    from swiftdit_pack.nodes.memory import LOADED
    LOADED.free()
    with caplog.at_level("INFO", logger="SwiftDiT"):
        out = pack.ZImageLoader.execute(unet_name="z_image_tiny.safetensors", weight_dtype="default",
                                        linears="as stored", gpu_budget_gb=0.0)
    assert out.result[0].gpu_budget_gb == 0.0
    (report,) = out.ui["text"]
    size = re.fullmatch(r"z_image_tiny.safetensors: (\d+\.\d) MiB of host memory", report)
    assert size, report
    with safe_open(models / "diffusion_models" / "z_image_tiny.safetensors", "pt") as f:
        assert {f.get_slice(name).get_dtype() for name in f.keys()} == {"F32"}
        stored = sum(math.prod(f.get_slice(name).get_shape()) * 4 for name in f.keys()) / 2**20
    assert abs(float(size.group(1)) - stored) <= 0.1  # the weights as stored, each counted once
    assert f"SwiftDiT: loaded {report.replace(':', ' (dit):', 1)}" in caplog.text


def test_a_load_shows_its_progress(pack, models, monkeypatch):
    """The loader's file read under a ComfyUI progress bar in percent of its bytes: rising, a hundred updates at
    most, the whole file read at the end."""
    import comfy.utils
    from swiftdit_pack.nodes.memory import LOADED
    shown = []

    class Bar(comfy.utils.ProgressBar):
        def update_absolute(self, value, total=None, preview=None):
            shown.append((value, total))

    monkeypatch.setattr(comfy.utils, "ProgressBar", Bar)
    LOADED.free()
    run(pack.ZImageLoader, unet_name="z_image_tiny.safetensors", weight_dtype="default", linears="as stored")
    values = [v for v, _ in shown]
    assert values == sorted(set(values)) and len(values) <= 101 and {t for _, t in shown} == {100}
    assert values[-1] >= 95, values  # every tensor the model keeps (the file holds little else)


def test_budget_arithmetic_with_the_loader_setting(pack, monkeypatch):
    from swiftdit_pack.nodes.memory import GIB, budget_bytes, reserve_bytes
    free, held, reserve = 10 * GIB, 2 * GIB, 3 * GIB
    assert budget_bytes(0, free, held, reserve) == 9 * GIB  # automatic: free + held - what a pass needs
    assert budget_bytes(1.5, free, held, reserve) == int(1.5 * GIB)  # the loader's setting
    assert budget_bytes(20, free, held, reserve) == 9 * GIB  # capped by what is there
    assert budget_bytes(0, GIB, 0, reserve) == 0
    from swiftdit_pack.dit_core.arch import Arch
    from swiftdit_pack.dit_core.gpu.streaming import pass_bytes
    a = Arch(family="t", hidden=3840, layers=30, refiner=2, heads=30, head=128, ffn=10240, latents=16,
             patch=(2, 2), text_dim=2560, freq_dim=256, time_hidden=1024, time_dim=256, eps=1e-5, qk_eps=1e-5,
             final_eps=1e-6, rope_axes=(32, 48, 48), rope_theta=256.0)

    class Model:
        arch = a
    import comfy.model_management
    monkeypatch.setattr(comfy.model_management, "extra_reserved_memory", lambda: 123 << 20)  # --reserve-vram
    # pass_bytes' documented sum at 1024^2 (4608 rows, one MLP chunk): per row the f32 residual 4 times, QKV's
    # product and its heads in bf16, attention's output, the linears' input rows (34 hidden-wide values, + 16 B);
    # the chunk's [rows, 2 ffn] bf16 product and f32 SwiGLU (10 ffn); 256 MiB of workspaces.
    by_hand = 4608 * (34 * 3840 + 16) + 4608 * 10 * 10240 + (256 << 20)
    assert reserve_bytes(Model, 4608) == by_hand + (123 << 20)
    assert 1 * GIB < pass_bytes(a, 9216) < 3 * GIB  # Z-Image Turbo at 2 MP: the residual streams and the MLP


@pytest.fixture
def streamed_on_cpu(pack, monkeypatch):
    """The nodes stream the DiT's blocks on the CPU as they do on a GPU, with ComfyUI's free memory fixed."""
    import comfy.model_management
    from swiftdit_pack.nodes import memory
    memory.LOADED.free()
    memory.install_memory_hook()
    monkeypatch.setattr(memory, "streams_on", lambda device: True)
    free = 64 * memory.GIB
    monkeypatch.setattr(comfy.model_management, "get_free_memory",
                        lambda dev=None, torch_free_too=False: (free, 0) if torch_free_too else free)
    yield free
    memory.LOADED.free()


class Companion:
    """A stand-in for a model's graphed step: counts its clear() calls."""

    def __init__(self):
        self.cleared = 0

    def clear(self):
        self.cleared += 1


def test_companions_live_and_are_cleared_with_their_model(pack):
    from swiftdit_pack.nodes.memory import LoadedModels

    class Model:
        pass
    loaded, cpu = LoadedModels(), torch.device("cpu")
    loaded.get("dit", ("dit", ("a.safetensors",)), Model, cpu)
    loaded.get("vae", ("vae", ("v.safetensors",)), Model, None)
    first = loaded.attached("dit", "graphed_step", Companion)
    assert loaded.attached("dit", "graphed_step", Companion) is first  # made once
    vae = loaded.attached("vae", "graphed_step", Companion)
    loaded.give_back(0, cpu)  # nothing to free, still cleared first: the blocks may move next
    assert first.cleared == 1 and vae.cleared == 0  # only the models on that device
    loaded.get("dit", ("dit", ("b.safetensors",)), Model, cpu)
    second = loaded.attached("dit", "graphed_step", Companion)
    assert second is not first and first.cleared == 1  # dropped with the model it belonged to
    loaded.free()
    assert second.cleared == 1 and vae.cleared == 1 and not loaded._held


def test_models_of_one_kind_keep_their_roles(pack, caplog):
    """The cache holds one model a (kind, role): a family's video VAE, audio VAE and vocoder stay loaded together,
    and a new file replaces only the model of its own (kind, role)."""
    from swiftdit_pack.nodes.memory import LoadedModels

    class Model:
        pass
    loaded, cpu, loads = LoadedModels(), torch.device("cpu"), []

    def get(role, name):
        return loaded.get("vae", ("vae", (name,)), lambda: loads.append(name) or Model(), cpu, role)
    with caplog.at_level("INFO", logger="SwiftDiT"):
        video, audio, vocoder = get("video", "v.safetensors"), get("audio", "a.safetensors"), get("vocoder", "w.st")
    assert "loaded a.safetensors (audio vae)" in caplog.text
    assert get("video", "v.safetensors") is video and get("audio", "a.safetensors") is audio  # all three kept
    assert get("vocoder", "w.st") is vocoder and loads == ["v.safetensors", "a.safetensors", "w.st"]
    video_step = loaded.attached("vae", "graphed_step", Companion, "video")
    assert loaded.attached("vae", "graphed_step", Companion, "audio") is not video_step
    other = get("audio", "a2.safetensors")  # a new file for the audio slot
    assert other is not audio and get("audio", "a2.safetensors") is other
    assert get("video", "v.safetensors") is video and get("vocoder", "w.st") is vocoder  # the others stay
    assert sorted(loaded._held) == [("vae", "audio"), ("vae", "video"), ("vae", "vocoder")]
    loaded.give_back(1, cpu)  # these hold no device bytes: each slot's model goes in turn, its companions cleared
    assert video_step.cleared == 1 and not loaded._held


def test_the_dits_room_takes_the_text_encoder_back(pack, monkeypatch):
    """make_room (the DiT asking for room): after ComfyUI's own models, our text encoders on that device go when
    the room is still short; the DiT, a VAE and models elsewhere stay."""
    import comfy.model_management
    from swiftdit_pack.nodes import memory

    class Model:
        pass
    loaded, gpu, other = memory.LoadedModels(), torch.device("cuda"), torch.device("cuda:1")
    monkeypatch.setattr(memory, "LOADED", loaded)
    monkeypatch.setattr(comfy.model_management, "free_memory", lambda nbytes, device, keep_loaded=(): None)
    free = [10 * memory.GIB]
    monkeypatch.setattr(comfy.model_management, "get_free_memory", lambda dev=None, torch_free_too=False: free[0])
    monkeypatch.setattr(comfy.model_management, "soft_empty_cache", lambda force=False: None)
    for kind, device in (("dit", gpu), ("text", gpu), ("vae", gpu)):
        loaded.get(kind, (kind, (f"{kind}.safetensors",)), Model, device)
    loaded.get("text", ("text", ("far.safetensors",)), Model, other, "far")
    memory.make_room(gpu, 8 * memory.GIB)  # enough free: nothing of ours goes
    assert len(loaded._held) == 4
    memory.make_room(gpu, 12 * memory.GIB)
    assert sorted(loaded._held) == [("dit", "main"), ("text", "far"), ("vae", "main")]


def test_freed_blocks_come_back_on_the_next_sample(pack, models, streamed_on_cpu, caplog):
    import comfy.model_management
    from swiftdit_pack.dit_core.gpu.streaming import StreamedBlocks
    from swiftdit_pack.nodes.memory import LOADED
    positive, samples, _ = graph(pack)
    expected = engine_samples(models, positive[0][0])
    assert torch.equal(samples["samples"], expected)
    dit = LOADED._held["dit", "main"][1]
    blocks = dit.blocks
    assert isinstance(blocks, StreamedBlocks) and all(blocks.resident) and blocks.host_bytes() == 0
    cpu, total = torch.device("cpu"), blocks.total_bytes()
    with caplog.at_level("INFO", logger="SwiftDiT"):
        # another model needs half the blocks' bytes more than is free, then all of them
        comfy.model_management.free_memory(streamed_on_cpu + total // 2, cpu)
        assert 0 < sum(blocks.resident) < len(blocks) and blocks.device_bytes() <= total // 2
        comfy.model_management.free_memory(streamed_on_cpu + blocks.device_bytes(), cpu)
    assert "SwiftDiT: gave back" in caplog.text
    assert blocks.device_bytes() == 0 and not any(blocks.resident) and blocks.host_bytes() == total
    assert LOADED._held["dit", "main"][1] is dit  # kept, in host memory
    assert torch.equal(graph(pack)[1]["samples"], expected)
    assert all(blocks.resident) and LOADED._held["dit", "main"][1] is dit  # refilled, not reloaded
    comfy.model_management.unload_all_models()
    assert not LOADED._held


def test_loader_budget_streams_the_blocks(pack, models, streamed_on_cpu, caplog):
    from swiftdit_pack.nodes.memory import GIB, LOADED
    positive, _, _ = graph(pack)
    blocks = LOADED._held["dit", "main"][1].blocks
    size = blocks.slot_bytes
    assert blocks._bytes == [size] * 4 and all(blocks.resident)
    budget = (3 * size + size // 2) / GIB  # the two slots and one block
    with caplog.at_level("INFO", logger="SwiftDiT"):
        (model,) = run(pack.ZImageLoader, unet_name="z_image_tiny.safetensors", weight_dtype="default",
                       linears="as stored", gpu_budget_gb=budget)
        assert model.gpu_budget_gb == budget and sum(blocks.resident) == 1 and blocks.budget <= budget * GIB
        samples = graph(pack, budget=budget)[1]["samples"]
    assert "SwiftDiT: loaded" not in caplog.text  # a new budget re-plans the loaded model
    assert torch.equal(samples, engine_samples(models, positive[0][0])) and sum(blocks.resident) == 1
    graph(pack)  # back to automatic: every block returns
    assert all(blocks.resident)


def test_cancel_interrupts_a_decode_within_a_tile(pack, models, monkeypatch):
    """A large decode runs in tiles; Cancel is honoured within the tile that is running (between the decoder's
    blocks), not after the last tile."""
    import comfy.model_management
    from swiftdit_pack.dit_core.codecs.flux1_vae import ImageDecoder
    tiles, forward = [], ImageDecoder.forward
    monkeypatch.setattr(ImageDecoder, "forward", lambda self, z, check=None: tiles.append(1) or forward(self, z, check))
    (vae,) = run(pack.ZImageVAELoader, vae_name="ae_tiny.safetensors")
    latent = {"samples": torch.randn(1, 16, 72, 136)}  # past the 64-cell tile: several tiles
    comfy.model_management.interrupt_current_processing(True)
    try:
        with pytest.raises(comfy.model_management.InterruptProcessingException):
            run(pack.ZImageVAEDecode, samples=latent, vae=vae)
    finally:
        comfy.model_management.interrupt_current_processing(False)
    assert tiles == [1]


def test_a_request_too_large_is_refused_before_any_work(pack, models, monkeypatch):
    """An image whose pass cannot fit in the memory there is: refused at the sampler, naming latent_image, with what
    it needs and the largest size that fits; nothing is sampled."""
    import comfy.model_management
    from swiftdit_pack.dit_core.families.z_image import ZImage
    monkeypatch.setattr(comfy.model_management, "get_free_memory", lambda *a, **k: 300 * 2**20)
    monkeypatch.setattr(ZImage, "denoised", lambda *a, **k: pytest.fail("sampled"))
    with pytest.raises(Exception, match=r"SwiftDiTZImageSampler · latent_image: .* megapixels need about .* GiB of "
                                        r"host memory .* the largest image that fits is about .* megapixels"):
        graph(pack, width=1024, height=1024)



def test_text_encoder_device_cpu_keeps_it_on_the_host(pack, models, monkeypatch):
    """The loader's `device` widget: cpu loads the encoder on the host in float32 wherever ComfyUI runs models (as
    CLIPLoader's cpu); default asks where ComfyUI runs them."""
    from swiftdit_pack.nodes import base
    from swiftdit_pack.nodes.memory import LOADED
    LOADED.free()

    def elsewhere():
        raise RuntimeError("asked for the engine's device")
    monkeypatch.setattr(base, "engine_device", elsewhere)
    (clip,) = run(pack.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2", device="cpu")
    encoder = LOADED._held["text", "main"][1]
    assert clip.device == "cpu" and encoder.device.type == "cpu"
    assert encoder.model.embed_tokens.weight.dtype == torch.float32
    LOADED.free()
    with pytest.raises(Exception, match="engine's device"):
        run(pack.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2", device="default")


def test_cancel_interrupts_the_text_encoder_between_layers(pack, models, monkeypatch):
    """Cancel inside an encode: the text encoder stops before its next layer."""
    import comfy.model_management
    from swiftdit_pack.nodes.memory import LOADED
    (clip,) = run(pack.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2")
    layers = LOADED._held["text", "main"][1].model.layers
    ran = []
    handles = [layer.register_forward_hook(lambda *_: ran.append(1)) for layer in layers]
    comfy.model_management.interrupt_current_processing(True)
    try:
        with pytest.raises(comfy.model_management.InterruptProcessingException):
            run(pack.ZImageTextEncode, text="a red fox in the snow", clip=clip)
    finally:
        comfy.model_management.interrupt_current_processing(False)
        for handle in handles:
            handle.remove()
    assert ran == [] and len(layers) > 1
    run(pack.ZImageTextEncode, text="a red fox in the snow", clip=clip)  # hooks gone: encodes again


def test_cancel_interrupts_a_load_between_tensors(pack, models):
    """Cancel while a loader reads its file: it stops before the next tensor, keeps nothing, and loads whole next time."""
    import comfy.model_management
    from swiftdit_pack.nodes.memory import LOADED
    LOADED.free()
    comfy.model_management.interrupt_current_processing(True)
    try:
        with pytest.raises(comfy.model_management.InterruptProcessingException):
            run(pack.ZImageLoader, unet_name="z_image_tiny.safetensors", weight_dtype="default", linears="as stored",
                gpu_budget_gb=0.0)
    finally:
        comfy.model_management.interrupt_current_processing(False)
    assert LOADED.free() == 0
    run(pack.ZImageLoader, unet_name="z_image_tiny.safetensors", weight_dtype="default", linears="as stored",
        gpu_budget_gb=0.0)


def test_a_text_encoder_asks_for_its_room_on_the_card_before_it_loads(pack, models, monkeypatch):
    """Before a text encoder loads onto a CUDA device, ComfyUI is asked for its BF16 bytes (memory.room_for: its own
    models unload, ours give back through the free_memory hook); nothing is asked on the CPU."""
    from safetensors import safe_open

    import comfy.model_management
    from swiftdit_pack.nodes import base
    asked = []
    monkeypatch.setattr(base, "room_for", lambda device, nbytes: asked.append((device, nbytes)))
    monkeypatch.setattr(comfy.model_management, "get_total_memory", lambda *a, **k: 80 * 2**30)
    path = str(models / "text_encoders" / "qwen3_tiny.safetensors")
    with safe_open(path, "pt") as f:
        elements = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    base.room_before(path, torch.device("cpu"))
    base.room_before(path, torch.device("cuda", 0))
    assert asked == [(torch.device("cuda", 0), 2 * elements)]
    # packed codes: INT8 doubles in BF16, NVFP4's two codes a byte quadruple (doubling where INT8 is kept)
    packed = models / "packed.safetensors"
    save_file({"a.weight": torch.zeros(4, 8, dtype=torch.int8), "b.weight": torch.zeros(4, 8, dtype=torch.uint8)},
              packed)
    base.room_before(str(packed), torch.device("cuda", 0))
    base.room_before(str(packed), torch.device("cuda", 0), int8_kept=True)
    packed.unlink()
    assert asked[1:] == [(torch.device("cuda", 0), 32 * 2 + 32 * 4), (torch.device("cuda", 0), 32 + 32 * 2)]


def test_a_text_encoder_larger_than_the_card_streams_its_layers(pack, models, monkeypatch):
    """A text encoder larger than the card (MiniMax H3's 32B on a 16 GB card) loads on the host and streams its
    layers to the card (dit_core/gpu/text_streaming.py; here the stream's slot stays on the host), room asked for
    the rest of it and its largest layer: the rows are the resident encoder's."""
    import comfy.model_management
    from swiftdit_pack.dit_core.gpu import text_streaming
    from swiftdit_pack.nodes import base
    from swiftdit_pack.nodes.memory import LOADED
    LOADED.free()
    path = models / "text_encoders" / "qwen3_tiny.safetensors"
    want = pack.Qwen3TextEncoder.load(path, pack_tokenizer_dir(), dtype=torch.bfloat16).encode("a red fox in the snow")
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        sizes = {k: 2 * math.prod(f.get_slice(k).get_shape()) for k in f.keys()}
    count = 1 + max(int(k.split(".layers.")[1].split(".")[0]) for k in sizes if ".layers." in k)
    layers = [sum(n for k, n in sizes.items() if f".layers.{i}." in k) for i in range(count)]
    rest = sum(sizes.values()) - sum(layers)
    rooms, streamed = [], []
    monkeypatch.setattr(base, "engine_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(comfy.model_management, "get_total_memory", lambda *a, **k: rest + max(layers) + 1)
    monkeypatch.setattr(comfy.model_management, "extra_reserved_memory", lambda: 1)
    monkeypatch.setattr(base, "room_for", lambda device, nbytes: rooms.append(nbytes))
    real = text_streaming.stream_layers
    monkeypatch.setattr(text_streaming, "stream_layers", lambda model, device: streamed.append(device) or
                        real(model, torch.device("cpu")))
    loads, load = [], pack.Qwen3TextEncoder.load.__func__
    monkeypatch.setattr(pack.Qwen3TextEncoder, "load", classmethod(
        lambda cls, f, tokenizer_dir, **kw: loads.append(kw) or load(cls, f, tokenizer_dir, **kw)))
    (clip,) = run(pack.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2", device="default")
    (got,) = run(pack.ZImageTextEncode, text="a red fox in the snow", clip=clip)
    encoder = LOADED._held["text", "main"][1]
    from swiftdit_pack.nodes.model_bytes import placement
    staged = [layer.staged.nbytes for layer in encoder.model.layers]
    assert placement(encoder).pinned == sum(staged)  # the layers' staged bytes; their modules on meta count nothing
    LOADED.free()
    assert streamed == [torch.device("cuda", 0)] and rooms == [rest + max(layers)]
    # loaded on the host, its FP8 or NVFP4 linears (none here) converted on the card
    assert [(kw["device"], kw["convert_on"]) for kw in loads] == [(torch.device("cpu"), torch.device("cuda", 0))]
    assert torch.equal(got[0][0], want)  # the host's BF16 load, resident


def test_a_text_encoder_larger_than_the_card_is_refused_before_it_loads(pack, models, monkeypatch):
    """A text encoder that cannot fit the card even with its layers streamed: refused before any tensor moves,
    naming the loader, its input, the sizes and the fix (the host path, or a smaller file); nothing is kept, and the
    same loader on the host works."""
    import comfy.model_management
    from swiftdit_pack.nodes import base
    from swiftdit_pack.nodes.memory import LOADED
    LOADED.free()
    monkeypatch.setattr(base, "engine_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(comfy.model_management, "get_total_memory", lambda *a, **k: 2**20)
    monkeypatch.setattr(comfy.model_management, "extra_reserved_memory", lambda: 2**19)
    monkeypatch.setattr(base, "room_for", lambda *a: pytest.fail("asked for room"))
    with pytest.raises(Exception, match=r"SwiftDiTZImageTextEncoderLoader · clip_name: qwen3_tiny\.safetensors takes "
                                        r"about [\d.]+ GiB on the card with its layers streamed, more than this "
                                        r"card's 0\.0 GiB .* set the "
                                        r"loader's device to cpu .*about \d+ GiB of RAM"):
        run(pack.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2", device="default")
    assert ("text", "main") not in LOADED._held
    run(pack.ZImageTextEncoderLoader, clip_name="qwen3_tiny.safetensors", type="lumina2", device="cpu")
    LOADED.free()


def test_on_a_gpu_the_loader_reads_blocks_as_it_places_them_within_cancel(pack, models, monkeypatch):
    """On a CUDA engine device the loader asks for the blocks read on use (blocks_on_use) and places the model inside
    the file's Cancel: a block read while it is placed checks ComfyUI's interrupt; after, the file's hooks and its
    map are gone. (The placement itself is recorded here, not run: this machine has no GPU.)"""
    from swiftdit_pack.dit_core.weights import BlocksOnUse
    from swiftdit_pack.nodes import base
    from swiftdit_pack.nodes.memory import LOADED
    gpu, placed, checks = torch.device("cuda", 0), [], []
    monkeypatch.setattr(base, "engine_device", lambda: gpu)
    monkeypatch.setattr(base, "stand_in_builds_here", lambda *args: False)
    monkeypatch.setattr(base, "interrupt_check", lambda: checks.append(1))
    monkeypatch.setattr(LOADED, "get", lambda kind, key, load, device, role: load())

    def place(model, device, budget_gb, rows):
        before = len(checks)
        block = model.blocks[1]  # read now, under the load's hooks
        placed.append((type(model.blocks), device, len(checks) > before, block.w[0].weight.shape))
        return model
    monkeypatch.setattr(base, "place_dit", place)
    path = str(models / "diffusion_models" / "z_image_tiny.safetensors")
    model = pack.load_dit(base.ModelHandle("z_image", path, "stored"))
    (kind, device, checked, _), = placed
    assert kind is BlocksOnUse and device == gpu and checked
    count = len(checks)
    model.blocks[0]  # a read after the load: no hook of the load's left
    assert len(checks) == count
