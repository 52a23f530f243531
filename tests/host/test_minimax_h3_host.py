"""MiniMax H3 text to video + audio on a real ComfyUI v0.3.75 server: the shipped workflow (the official t2v template
reduced for the host and swapped, workflows/minimax_h3_t2v.json) converted with the server's /object_info and run to
an .mp4 with a stereo soundtrack, errors that name node and input, and Cancel within a sampler step. Tiny random files
under the workflow's file names, each one the real loaders take with H3's defaults: what is not in a file (the
text encoder's layer 50 and width 5120, the video VAE's heads of 64, the audio VAE's seven upsampling stages) is
kept, and only the widths the files carry are small."""

import copy
import json
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from host.server import ComfyHost, of_type
from swiftdit.workflow_api import to_api

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"
TIMEOUT = 120.0
# The file names the workflow's loaders ask for, in ComfyUI's models folders.
# the template's file names (the text encoder's content BF16: its NVFP4-AWQ reading is tests/dit_core/text's)
DIT, TEXT = "minimax_h3_fl2va_pruned_int8_convrot.safetensors", "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors"
VIDEO_VAE, AUDIO_VAE = "minimax_h3_video_vae_int8_convrot.safetensors", "minimax_h3_audio_vae_fp32.safetensors"
WRONG_DIT = "z_image_tiny.safetensors"  # a Z-Image DiT, for the H3 loader to refuse
WRONG_TEXT = "qwen3vl_64_wide.safetensors"  # a Qwen3-VL of another width
# The shipped graph's nodes (workflows/api/minimax_h3_t2v.json).
SAVE, T2V, SAMPLER, STEPS, LOADER, TEXT_LOADER = "92", "140:131", "140:141", "140:137", "140:127", "140:128"
# The text encoder's vocabulary is cut to 1024 rows (Qwen3-VL's 151936 rows of 5120 would be 1.6 GB in BF16): the
# prompt is one whose tokens all fall below it.
VOCAB, PROMPT = 1024, "he and I are at it"
# CI sizes: the template asks for 864 x 480, 124 frames (about 5 s) at 20 steps; two CPU cores get 64 x 64, 22
# frames (17 + 5: 7 latent frames, 37 audio latents), 2 steps (the reduction's own values are checked first).
WIDTH, HEIGHT, LENGTH, RUN_STEPS = 64, 64, 22, 2
FPS, SAMPLE_RATE = 24, 32000
DIT_LAYERS = 8  # a check after each block: Cancel lands within an eighth of a step


def qwen3_vl_text(hidden: int, layers: int, seed: int) -> dict[str, torch.Tensor]:
    """A Qwen3-VL text model in ComfyUI's text_encoders names (model.*; no vision tower), BF16: one head of 8,
    an MLP of 4, VOCAB tokens; gains around 1, matrices scaled by 1/sqrt(fan-in)."""
    g = torch.Generator().manual_seed(seed)
    head, mlp = 8, 4

    def matrix(rows, cols):
        return torch.randn(rows, cols, generator=g) / cols ** 0.5

    def gain(size):
        return 1 + 0.3 * torch.randn(size, generator=g)

    state = {"model.embed_tokens.weight": torch.randn(VOCAB, hidden, generator=g), "model.norm.weight": gain(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        state.update({p + "self_attn.q_proj.weight": matrix(head, hidden), p + "self_attn.k_proj.weight":
                      matrix(head, hidden), p + "self_attn.v_proj.weight": matrix(head, hidden),
                      p + "self_attn.o_proj.weight": matrix(hidden, head), p + "self_attn.q_norm.weight": gain(head),
                      p + "self_attn.k_norm.weight": gain(head), p + "mlp.gate_proj.weight": matrix(mlp, hidden),
                      p + "mlp.up_proj.weight": matrix(mlp, hidden), p + "mlp.down_proj.weight": matrix(hidden, mlp),
                      p + "input_layernorm.weight": gain(hidden), p + "post_attention_layernorm.weight": gain(hidden)})
    return {k: v.to(torch.bfloat16) for k, v in state.items()}


def randomized(model, seed: int):
    """Every parameter of a diffusers VAE random (its init zeroes gates and registers, which would hide blocks)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.dim() >= 2 and "register" not in name:
                p.copy_(r / p[0].numel() ** 0.5)
            elif name.endswith("weight") and "norm" in name:
                p.copy_(1 + 0.2 * r)
            else:
                p.copy_(0.3 * r)
    return {k: v.contiguous() for k, v in model.state_dict().items()}


def with_stats(state: dict, channels: int, seed: int) -> dict:
    """state with latents_mean/latents_std, which our VAE loaders require in the file."""
    g = torch.Generator().manual_seed(seed)
    return {**state, "latents_mean": 0.3 * torch.randn(channels, generator=g),
            "latents_std": 0.5 + torch.rand(channels, generator=g)}


@pytest.fixture(scope="module")
def h3_models(tmp_path_factory):
    """The four files (about 43 MB, 34 of them the text encoder): a DiT of H3's channels (24 video, 32 audio, text
    5120) with a 64-wide residual and DIT_LAYERS blocks; a 50-layer, 5120-wide Qwen3-VL text model of one head; the
    video VAE's ViT decoder with one head of 64; the audio VAE with H3's seven upsampling stages from 128 channels.
    Plus the two wrong files."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
    from tiny_models import minimax_h3_comfy_layout, random_minimax_h3, random_z_image, z_image_comfy_layout
    root = tmp_path_factory.mktemp("h3_models")
    folders = {folder: root / folder for folder in ("diffusion_models", "text_encoders", "vae")}
    for folder in folders.values():
        folder.mkdir()
    dit = random_minimax_h3(in_channels=24, audio_in_channels=32, text_dim=5120, num_layers=DIT_LAYERS)
    save_file(minimax_h3_comfy_layout(dit), folders["diffusion_models"] / DIT)
    save_file(z_image_comfy_layout(random_z_image().state_dict()), folders["diffusion_models"] / WRONG_DIT)
    save_file(qwen3_vl_text(5120, 50, seed=1), folders["text_encoders"] / TEXT)
    save_file(qwen3_vl_text(64, 50, seed=2), folders["text_encoders"] / WRONG_TEXT)
    video = AutoencoderKLMiniMaxH3(block_out_channels=(8,) * 6, layers_per_block=1, norm_num_groups=4,
                                   decoder_num_layers=1, decoder_num_attention_heads=1, decoder_attention_head_dim=64)
    save_file(with_stats(randomized(video, 3), 24, 4), folders["vae"] / VIDEO_VAE)
    audio = AutoencoderKLMiniMaxH3Audio(encoder_dim=2, latent_dim=32, num_attention_heads=2, decoder_dim=128)
    save_file(with_stats(randomized(audio, 5), 32, 6), folders["vae"] / AUDIO_VAE)
    return folders


@pytest.fixture(scope="module")
def h3_host(tmp_path_factory, h3_models, serving):
    server = ComfyHost(COMFYUI_TREE, tmp_path_factory.mktemp("h3_base"), sys.executable)
    server.link_models(h3_models)
    yield from serving(server)


@pytest.fixture(scope="module")
def queued(h3_host) -> dict:
    """The shipped workflow as the editor queues it: to_api with the server's /object_info."""
    return to_api(json.loads((ROOT / "workflows" / "minimax_h3_t2v.json").read_text()), h3_host.object_info())


def shipped_graph(queued: dict) -> dict:
    """A copy of the queued graph at CI sizes, the reduction's own values checked first."""
    prompt = copy.deepcopy(queued)
    t2v, sampler = prompt[T2V]["inputs"], prompt[SAMPLER]["inputs"]
    assert (t2v["width"], t2v["height"], t2v["length"], prompt[STEPS]["inputs"]["value"]) == (864, 480, 124, 20)
    assert (sampler["sampler_name"], sampler["scheduler"]) == ("res_multistep", "simple")
    assert {prompt[n]["inputs"][k] for n, k in ((LOADER, "unet_name"), (TEXT_LOADER, "clip_name"),
                                                ("140:119", "vae_name"), ("140:120", "vae_name"))} == \
        {DIT, TEXT, VIDEO_VAE, AUDIO_VAE}
    t2v.update(prompt=PROMPT, width=WIDTH, height=HEIGHT, length=LENGTH)
    prompt[STEPS]["inputs"]["value"] = RUN_STEPS
    return prompt


def saved_video(host, entry: dict, events: list) -> Path:
    errors = of_type(events, "execution_error")
    assert entry["status"]["status_str"] == "success", (errors[:1] or entry["status"], host.log_tail())
    [saved] = entry["outputs"][SAVE]["images"]
    assert entry["outputs"][SAVE]["animated"] == [True]
    path = host.output_files({"outputs": {SAVE: {"images": [saved]}}})[0]
    assert path.suffix == ".mp4" and path.is_file()
    return path


def test_shipped_workflow_runs_to_a_video_with_sound(h3_host, queued):
    """The shipped graph (its API twin is what the editor queues) to SaveVideo's .mp4: the frames and the sound."""
    twin = json.loads((ROOT / "workflows" / "api" / "minimax_h3_t2v.json").read_text())
    assert {n: b["inputs"] for n, b in queued.items()} == {n: b["inputs"] for n, b in twin.items()}
    entry, events, seconds = h3_host.run(shipped_graph(queued), TIMEOUT)
    path = saved_video(h3_host, entry, events)
    print(f"\nMiniMax H3 {WIDTH}x{HEIGHT}, {LENGTH} frames, {RUN_STEPS} steps: {seconds:.1f} s")
    with av.open(str(path)) as container:
        [video], [audio] = container.streams.video, container.streams.audio
        assert (video.codec_context.width, video.codec_context.height) == (WIDTH, HEIGHT)
        assert video.average_rate == FPS
        assert (audio.rate, audio.channels) == (SAMPLE_RATE, 2)
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert frames.shape == (LENGTH, HEIGHT, WIDTH, 3)
    assert frames.std() > 5, "flat frames: the run or the random files are degenerate"
    with av.open(str(path)) as container:
        sound = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
    assert sound.shape[0] == 2 and np.abs(sound).max() > 1e-3
    # SaveVideo cuts the sound to the frames' duration (AAC adds up to a frame of 1024 samples of priming)
    assert abs(sound.shape[1] - LENGTH / FPS * SAMPLE_RATE) <= 2048, sound.shape


def frames_of(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]).astype(np.float32)


def test_the_loaders_gpus_share_the_steps_between_rank_processes(h3_host, queued):
    """The loader's gpus 2 on this GPU-less server: the DiT's blocks in two rank processes the server starts (from
    its main.py, which the ranks do not run again, and the pack named by its folder's path, as ComfyUI imports it),
    the sampler in the server; the video as with one process, to the codec's rounding."""
    videos, mark = {}, h3_host.log_mark()
    for gpus in ("1", "2"):
        prompt = shipped_graph(queued)
        prompt[LOADER]["inputs"]["gpus"] = gpus
        prompt[SAVE]["inputs"]["filename_prefix"] = f"video/gpus_{gpus}"
        entry, events, seconds = h3_host.run(prompt, TIMEOUT)
        videos[gpus] = frames_of(saved_video(h3_host, entry, events))
        print(f"\ngpus {gpus}: {seconds:.1f} s")
    assert videos["1"].shape == videos["2"].shape
    assert np.abs(videos["1"] - videos["2"]).mean() < 0.5, np.abs(videos["1"] - videos["2"]).mean()
    said = h3_host.log_since(mark)
    assert "Traceback" not in said, said[-3000:]


# case -> (node, the input changed there, its value, what the message says after "<node type> · <input>: ")
ERROR_CASES = {
    "a Z-Image DiT in the H3 loader": (LOADER, "unet_name", WRONG_DIT, "not a MiniMax H3"),
    "a text encoder 64 wide": (TEXT_LOADER, "clip_name", WRONG_TEXT, "hidden size 64, expected 5120"),
    "123 frames (not 17n + 5)": (T2V, "length", 123, "123 frames is not 17n + 5"),
    "width 80 (not a multiple of 32)": (T2V, "width", 80, "80 is not a multiple of 32"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_name_the_node_and_the_input(h3_host, queued, case):
    """Each error ends the prompt at its node, the message naming node and input; the server goes on (the tests
    after these run on it)."""
    node, name, value, says = ERROR_CASES[case]
    prompt = shipped_graph(queued)
    prompt[node]["inputs"][name] = value
    assert prompt[node]["class_type"].startswith("SwiftDiTMiniMaxH3")
    h3_host.run_failing(prompt, node, name, says, SAVE, TIMEOUT)


def test_cancel_within_a_step_and_the_server_stays_usable(h3_host, queued):
    """Cancel at the second step's end (512 x 512, 124 frames: 3 to 4 s a step on two cores, so that a stall of the
    server's or the client's of a few tenths of a second does not pass for a late check): the prompt ends interrupted
    at the sampler well within the next step (a check after each of its blocks; ComfyUI's own hook would wait for the
    step's end), with no video saved; then the next prompt runs."""
    prompt = shipped_graph(queued)
    prompt[T2V]["inputs"].update(width=512, height=512, length=124)
    prompt[STEPS]["inputs"]["value"] = 4
    prompt[SAVE]["inputs"]["filename_prefix"] = "video/cancelled"
    prompt_id, _, _ = h3_host.run_cancelled_at_step(prompt, SAMPLER, 2, TIMEOUT, within_a_step=True)
    assert not h3_host.wait(prompt_id, 30)["outputs"].get(SAVE)
    prompt = shipped_graph(queued)
    prompt[SAVE]["inputs"]["filename_prefix"] = "video/after_cancel"
    entry, events, _ = h3_host.run(prompt, TIMEOUT)
    saved_video(h3_host, entry, events)
