"""The official FLUX.3 Klein templates on a real ComfyUI v0.3.75 server: `swiftdit swap --for-host` reduces and
swaps them, `swiftdit to-api` converts them with the server's /object_info, and both (text to image, and the
edit with its reference image) run to an image on tiny random Klein checkpoints under the templates' file
names."""

import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from official_templates import template
from PIL import Image
from safetensors.torch import save_file

from host.images import PNG_SIGNATURE, load
from host.server import ComfyHost, of_type
from swiftdit.for_host import swap_for_host
from swiftdit.workflow_api import to_api

pytestmark = pytest.mark.slow

COMFYUI_TREE = Path(__file__).resolve().parents[2] / ".cache" / "comfyui-0.3.75"
TIMEOUT = 300.0
# The file names the templates' loaders ask for (properties.models), in ComfyUI's models folders.
FILES = {"diffusion_models": "flux3-image-klein-int8-convrot.safetensors",
         "text_encoders": "qwen3vl_4b_int8_convrot.safetensors",
         "vae": "flux2-vae.safetensors"}
REFERENCE = "woman_gold_earring_teal_top_portrait.png"  # the edit template's LoadImage file (its input asset)
REFERENCE_SIZE = (128, 96)  # width, height of the random stand-in we put in the input folder
SAVE = "9"  # both templates' SaveImage
# CI sizes: the templates ask for 1024 x 1024 (t2i) and ~1 MP references (edit) at 16 steps; on two CPU cores a
# whole run must stay within seconds, so these widgets are overridden in the API graphs (the reduction's own
# values are checked before the override).
STEPS = 3
T2I_SIZE = (128, 96)
REFERENCE_MEGAPIXELS = 0.01


@pytest.fixture(scope="module")
def klein_models(tmp_path_factory):
    """Tiny random FLUX.3 Klein (edit-capable: it has image_cond blocks), Qwen3-VL text encoder and FLUX.2 VAE:
    the DiT and text encoder as INT8 ConvRot, as the templates' files are."""
    from tiny_models import (
        flux3_bfl_layout,
        int8_convrot_state,
        qwen3_vl_layout,
        random_flux3,
        random_qwen3_vl,
        save_flux2_vae,
        tiny_flux2_vae,
    )
    root = tmp_path_factory.mktemp("klein_models")
    for folder in FILES:
        (root / folder).mkdir()
    dit = random_flux3(in_channels=128, cond_in_channels=128, joint_attention_dim=8 * 64)
    save_file(int8_convrot_state(flux3_bfl_layout(dit.state_dict(), "model.diffusion_model."),
                                 lambda key: "_blocks." in key),
              root / "diffusion_models" / FILES["diffusion_models"])
    text = qwen3_vl_layout(random_qwen3_vl(), "comfy")
    save_file(int8_convrot_state(text, lambda key: key.startswith("model.layers.") and "_proj" in key),
              root / "text_encoders" / FILES["text_encoders"])
    # 32 norm groups, as the real FLUX.2 VAE (our loader reads them as FLUX VAEs have them)
    save_flux2_vae(tiny_flux2_vae(block_out_channels=(32, 32, 64, 64), norm_num_groups=32),
                   root / "vae" / FILES["vae"])
    return root


@pytest.fixture(scope="module")
def klein_host(tmp_path_factory, klein_models, serving):
    base = tmp_path_factory.mktemp("klein_base")
    server = ComfyHost(COMFYUI_TREE, base, sys.executable)
    server.link_models({folder: klein_models / folder for folder in FILES})
    (base / "input").mkdir(parents=True)
    pixels = np.random.default_rng(0).integers(0, 256, (REFERENCE_SIZE[1], REFERENCE_SIZE[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(base / "input" / REFERENCE)
    yield from serving(server)


def host_graph(host, name: str) -> dict:
    """The template reduced, swapped and converted as a user would: swap --for-host, then to-api."""
    wf, _, _ = swap_for_host(template(name), "flux3_klein")
    return to_api(wf, host.object_info())


def run_to_image(host, prompt: dict) -> np.ndarray:
    # Posted by hand, not with host.run: a server that refuses some outputs still runs the others (the
    # PreviewAny nodes), so the answer's node_errors must be empty for the whole graph to have been accepted.
    with host.events() as stream:
        t0 = time.monotonic()
        answer = host.request("POST", "/prompt", {"prompt": prompt, "client_id": stream.client_id})
        assert not answer.get("node_errors"), answer["node_errors"]
        events = stream.collect(answer["prompt_id"], TIMEOUT)
        seconds = time.monotonic() - t0
    entry = host.wait(answer["prompt_id"], 30)
    errors = of_type(events, "execution_error")
    assert entry["status"]["status_str"] == "success", (errors[:1] or entry["status"], host.log_tail())
    images = entry["outputs"][SAVE]["images"]
    assert len(images) == 1
    path = host.output_files({"outputs": {SAVE: {"images": images}}})[0]
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    print(f"\n{prompt[SAVE]['inputs']['filename_prefix']}: {seconds:.1f} s")
    image = load(path)
    assert image.std() > 5, "a flat image: the run or the random checkpoints are degenerate"
    return image


def test_t2i_template_runs_to_an_image(klein_host):
    prompt = host_graph(klein_host, "image_flux3_klein_distilled_t2i")
    latent, sampler = prompt["18:6"]["inputs"], prompt["18:7"]["inputs"]
    assert (latent["width"], latent["height"], sampler["steps"]) == (1024, 1024, 16)  # as the template sets
    assert prompt["18:1"]["inputs"]["unet_name"] == FILES["diffusion_models"]
    latent.update(width=T2I_SIZE[0], height=T2I_SIZE[1])
    sampler["steps"] = STEPS
    image = run_to_image(klein_host, prompt)
    assert image.shape == (T2I_SIZE[1], T2I_SIZE[0], 3)


def test_edit_template_runs_to_an_image(klein_host):
    prompt = host_graph(klein_host, "image_flux3_klein_distilled_image_edit")
    scales = [body["inputs"] for body in prompt.values() if body["class_type"] == "ImageScaleToTotalPixels"]
    assert len(scales) == 1 and scales[0]["megapixels"] == 1  # the template's ~1 MP reference
    assert prompt["11"]["inputs"]["image"] == REFERENCE
    scales[0]["megapixels"] = REFERENCE_MEGAPIXELS
    prompt["7"]["inputs"]["steps"] = STEPS
    image = run_to_image(klein_host, prompt)
    # ImageScaleToTotalPixels (v0.3.75): sides scaled to the pixel budget and rounded; then our encode crops each
    # side to a multiple of 16, and the output takes the reference latent's size.
    w, h = REFERENCE_SIZE
    scale = math.sqrt(int(REFERENCE_MEGAPIXELS * 1024 * 1024) / (w * h))
    expected = (round(h * scale) // 16 * 16, round(w * scale) // 16 * 16, 3)
    assert image.shape == expected
