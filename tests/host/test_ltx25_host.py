"""LTX-2.5 text to video + audio on a real ComfyUI v0.3.75 server: the shipped workflow (the official t2v template
reduced for the host and swapped, workflows/ltx25_t2v.json) converted with the server's /object_info and run to an
.mp4 with a stereo soundtrack through both stages (the x2 latent upsampler between them); errors that name node and
input (a wrong DiT, a sound frame count off the video VAE's grid, decode tiles off the latent grid, sigmas that rise)
with the server going on; Cancel within a step. Tiny random files under the workflow's file names, each one the real
loaders take with their defaults, made by the engine tests' builders: the DiT (128 video and 8 x 16 audio latent
values a row, as the VAEs give) with the text connectors of tests/dit_core/text/test_ltx25_text.py in its file, that
test's Gemma-4 text encoder with its projections and tokenizer.json (a byte-level BPE of 320 tokens, in which the
template's prompt runs past the encoder's 1024 tokens: a short one stands in), the video VAE and the audio VAE +
vocoder of tests/families/test_ltx25_codecs.py, a tiny x2 upsampler."""

import copy
import json
import shutil
import sys
from pathlib import Path

import av
import numpy as np
import pytest
from safetensors.torch import save_file
from tiny_models import builders

from host.server import ComfyHost, of_type
from swiftdit.workflow_api import to_api

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"
TIMEOUT = 120.0
# The file names the workflow's loaders ask for, in ComfyUI's models folders.
FILES = {"diffusion_models": "ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors",
         "text_encoders": "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors",
         "vae": "ltx-2.5-video-vae-bf16.safetensors",
         "latent_upscale_models": "ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0.safetensors"}
AUDIO_VAE = "ltx-2.5-audio-vae-bf16.safetensors"
WRONG_DIT = "z_image_tiny.safetensors"  # a Z-Image DiT, for the LTX-2.5 loader to refuse
# The shipped graph's nodes (workflows/api/ltx25_t2v.json).
SAVE, EMPTY_VIDEO, EMPTY_AUDIO, CREATE, PROMPT_TEXT = "75", "405:356", "405:366", "405:370", "405:376"
DECODE = "405:374"
STAGE_1, STAGE_2, LOADER, TEXT_LOADER = "405:414", "405:413", "405:384", "405:387"
VIDEO_LOADER, AUDIO_LOADER, UPSCALE_LOADER = "405:385", "405:386", "405:371"
# CI sizes: the template asks for stage 1 at 640 x 368 (1280 x 736 after the x2 upsampler), 121 frames; two CPU
# cores get stage 1 at 64 x 64 (EmptyLTXVLatentVideo's least; 2 x 2 latent cells), 17 frames (3 latent frames, 18
# audio latents), the video 128 x 128. The stages keep the template's steps and sigmas (8 and 3).
WIDTH, HEIGHT, LENGTH, FPS = 64, 64, 17, 24
SAMPLE_RATE = 48000
PROMPT = "a fox runs through the snow at dusk; it barks twice"
# The tiny vocoder's hop (mel hop 4 x 3 for 48 / 16 kHz, the file's config) makes (4 x 18 - 3) x 12 samples
SOUND_SAMPLES = (4 * 18 - 3) * 12


TEXT = builders("dit_core/text/test_ltx25_text.py")
CODECS = builders("families/test_ltx25_codecs.py")
oracle, audio = TEXT.oracle, CODECS.audio  # their module fixtures, used here too


@pytest.fixture(scope="module")
def ltx25_models(oracle, audio, tmp_path_factory):
    """The five files (and the wrong DiT), a folder per ComfyUI models kind."""
    from diffusers import AutoencoderKLLTX2Video
    from tiny_models import (ltx25_comfy_layout, random_ltx2_upsampler, random_ltx25, random_z_image,
                             save_ltx2_upsampler, z_image_comfy_layout)
    root = tmp_path_factory.mktemp("ltx25_models")
    folders = {folder: root / folder for folder in FILES}
    for folder in folders.values():
        folder.mkdir()
    dit = random_ltx25(in_channels=128, out_channels=128, audio_in_channels=128, audio_out_channels=128,
                       num_layers=6)  # a cancel check after each: a sixth of a step
    connectors = {k: v for k, v in TEXT.dit_layout(oracle).items() if "_embeddings_connector." in k}
    save_file({**ltx25_comfy_layout(dit), **connectors}, folders["diffusion_models"] / FILES["diffusion_models"])
    save_file(z_image_comfy_layout(random_z_image().state_dict()), folders["diffusion_models"] / WRONG_DIT)
    save_file(TEXT.text_encoder_layout(oracle), folders["text_encoders"] / FILES["text_encoders"])
    CODECS.video_file(folders["vae"], CODECS.randomized(AutoencoderKLLTX2Video(**CODECS.VIDEO), 0), FILES["vae"])
    shutil.copy(audio["path"], folders["vae"] / AUDIO_VAE)
    save_ltx2_upsampler(random_ltx2_upsampler(in_channels=128, mid_channels=32),
                        folders["latent_upscale_models"] / FILES["latent_upscale_models"])
    return folders


@pytest.fixture(scope="module")
def ltx25_host(tmp_path_factory, ltx25_models, serving):
    server = ComfyHost(COMFYUI_TREE, tmp_path_factory.mktemp("ltx25_base"), sys.executable)
    server.link_models(ltx25_models)
    yield from serving(server)


@pytest.fixture(scope="module")
def queued(ltx25_host) -> dict:
    """The shipped workflow as the editor queues it: to_api with the server's /object_info."""
    return to_api(json.loads((ROOT / "workflows" / "ltx25_t2v.json").read_text()), ltx25_host.object_info())


def shipped_graph(queued: dict, width: int = WIDTH, height: int = HEIGHT, length: int = LENGTH) -> dict:
    """A copy of the queued graph at CI sizes (or those given), the reduction's own values checked first."""
    prompt = copy.deepcopy(queued)
    video, sound = prompt[EMPTY_VIDEO]["inputs"], prompt[EMPTY_AUDIO]["inputs"]
    assert (video["width"], video["height"], video["length"]) == (640, 368, 121)
    assert (sound["frames_number"], sound["frame_rate"], prompt[CREATE]["inputs"]["fps"]) == (121, FPS, FPS)
    assert [prompt[n]["inputs"]["steps"] for n in (STAGE_1, STAGE_2)] == [8, 3]
    assert {prompt[n]["inputs"][k] for n, k in ((LOADER, "unet_name"), (TEXT_LOADER, "clip_name"),
                                                (VIDEO_LOADER, "vae_name"), (AUDIO_LOADER, "vae_name"),
                                                (UPSCALE_LOADER, "model_name"))} == {*FILES.values(), AUDIO_VAE}
    assert prompt[PROMPT_TEXT]["inputs"]["value"].startswith("A close-up of an Arctic hunter's face")
    prompt[PROMPT_TEXT]["inputs"]["value"] = PROMPT
    video.update(width=width, height=height, length=length)
    sound["frames_number"] = length
    return prompt


def test_shipped_workflow_runs_to_a_video_with_sound(ltx25_host, queued):
    """The shipped graph (its API twin is what the editor queues) to SaveVideo's .mp4: the frames and the sound."""
    twin = json.loads((ROOT / "workflows" / "api" / "ltx25_t2v.json").read_text())
    assert {n: b["inputs"] for n, b in queued.items()} == {n: b["inputs"] for n, b in twin.items()}
    entry, events, seconds = ltx25_host.run(shipped_graph(queued), TIMEOUT)
    errors = of_type(events, "execution_error")
    assert entry["status"]["status_str"] == "success", (errors[:1] or entry["status"], ltx25_host.log_tail())
    [saved] = entry["outputs"][SAVE]["images"]
    assert entry["outputs"][SAVE]["animated"] == [True]
    path = ltx25_host.output_files({"outputs": {SAVE: {"images": [saved]}}})[0]
    assert path.suffix == ".mp4" and path.is_file()
    print(f"\nLTX-2.5 {2 * WIDTH}x{2 * HEIGHT}, {LENGTH} frames, 8 + 3 steps: {seconds:.1f} s")
    with av.open(str(path)) as container:
        [video], [sound_stream] = container.streams.video, container.streams.audio
        assert (video.codec_context.width, video.codec_context.height) == (2 * WIDTH, 2 * HEIGHT)
        assert video.average_rate == FPS
        assert (sound_stream.rate, sound_stream.channels) == (SAMPLE_RATE, 2)
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert frames.shape == (LENGTH, 2 * HEIGHT, 2 * WIDTH, 3)
    assert frames.std() > 5, "flat frames: the run or the random files are degenerate"
    with av.open(str(path)) as container:
        sound = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
    assert sound.shape[0] == 2 and np.abs(sound).max() > 1e-3
    # the tiny vocoder's clip is shorter than the frames, so it is kept whole (AAC adds up to 2048 samples)
    assert SOUND_SAMPLES <= sound.shape[1] <= SOUND_SAMPLES + 2048, sound.shape


def test_wrong_dit_names_the_node_and_the_input_and_the_server_goes_on(ltx25_host, queued):
    """A Z-Image DiT under the LTX-2.5 loader ends the prompt there, the message naming node and input; the next
    prompt runs to its video."""
    prompt = shipped_graph(queued)
    prompt[LOADER]["inputs"]["unet_name"] = WRONG_DIT
    ltx25_host.run_failing(prompt, LOADER, "unet_name", "not an LTX-2.5 audio-video", SAVE, TIMEOUT)
    prompt = shipped_graph(queued)
    prompt[SAVE]["inputs"]["filename_prefix"] = "video/after_error"
    entry, events, _ = ltx25_host.run(prompt, TIMEOUT)
    assert entry["status"]["status_str"] == "success", (of_type(events, "execution_error")[:1], entry["status"])
    assert entry["outputs"][SAVE]["images"]


# case -> (node, the input changed there, its value, what the message says after "<node type> · <input>: ")
ERROR_CASES = {
    "120 frames of sound (not 8n + 1)": (EMPTY_AUDIO, "frames_number", 120, "120 frames is not 8n + 1"),
    "decode tiles of 80 pixels (not a multiple of 32)": (DECODE, "tile_size", 80,
                                                        "80 is not a multiple of 32 pixels"),
    "stage 1's sigmas rising": (STAGE_1, "sigmas", "1.0, 0.5, 0.7, 0.4, 0.3, 0.2, 0.1, 0.05, 0.0",
                                "is not a falling list of noise levels"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_name_the_node_and_the_input(ltx25_host, queued, case):
    """Each error ends the prompt at its node, the message naming node and input, nothing saved; the server goes
    on (the tests after these run on it)."""
    node, name, value, says = ERROR_CASES[case]
    prompt = shipped_graph(queued)
    prompt[node]["inputs"][name] = value
    assert prompt[node]["class_type"].startswith("SwiftDiTLTX25")
    ltx25_host.run_failing(prompt, node, name, says, SAVE, TIMEOUT)


def test_cancel_within_a_step_and_the_server_stays_usable(ltx25_host, queued):
    """Cancel at stage 1's second step (512 x 512, 121 frames: 4096 video rows), the prompt ends interrupted at
    that sampler well within its next step (a check after each layer), with no video saved; then the next prompt
    runs."""
    prompt = shipped_graph(queued, 512, 512, 121)
    prompt[SAVE]["inputs"]["filename_prefix"] = "video/cancelled"
    prompt_id, _, _ = ltx25_host.run_cancelled_at_step(prompt, STAGE_1, 2, TIMEOUT, within_a_step=True)
    assert not ltx25_host.wait(prompt_id, 30)["outputs"].get(SAVE)
    prompt = shipped_graph(queued)
    prompt[SAVE]["inputs"]["filename_prefix"] = "video/after_cancel"
    entry, events, _ = ltx25_host.run(prompt, TIMEOUT)
    assert entry["status"]["status_str"] == "success", (of_type(events, "execution_error")[:1], entry["status"])
    assert entry["outputs"][SAVE]["images"]
