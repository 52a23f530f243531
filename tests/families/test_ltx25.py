"""LTX-2.5's transformer on the shared block's pieces vs diffusers 0.42.1 LTX2VideoTransformer3DModel, tiny and random
(reference/families/ltx25.md section 10), written in the Comfy-Org single file's names and loaded by our recipe."""
import json

import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from tiny_models import LTX25_TINY, int8_convrot_state, ltx25_comfy_layout, random_ltx25

from dit_core.families.ltx25 import LTX25
from dit_core.families.ltx25_positions import Grid
from dit_core.weights import WeightsError

diffusers = pytest.importorskip("diffusers")
from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers
from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformer3DModel

# Section 10's tiny instance (video 2 x 16, audio 2 x 8; A<->V's rotary needs equal heads and the audio inner width
# as audio_cross_attention_dim), as 2.5 ships it: 9-row modulation, gates, split RoPE, prompt AdaLN, no video FF bias,
# the keyframe marker.
TINY = LTX25_TINY
# The other variants the reference names (section 9, items 4, 5 and 7): no prompt AdaLN (static prompt tables), video
# FF biases, the A<->V gates' time multiplier 1 (from the file's config); and no video gates (heads then come from the
# config too), no keyframe marker.
VARIANT = {**TINY, "use_prompt_adaln_single": False, "ff_bias": True, "gated_attn": False,
           "use_keyframes_abs_pos_embedding": False, "cross_attn_timestep_scale_multiplier": 1}
GRID = Grid(frames=3, height=2, width=3)
AUDIO_ROWS, TEXT_ROWS = 7, 5
SIGMA_VIDEO, SIGMA_AUDIO = 0.7, 0.45

@pytest.fixture(scope="module")
def models():
    return {"tiny": random_ltx25(), "variant": random_ltx25(seed=1, **VARIANT)}


@pytest.fixture(scope="module")
def files(models, tmp_path_factory):
    d = tmp_path_factory.mktemp("ltx25")
    save_file(ltx25_comfy_layout(models["tiny"]), d / "tiny.safetensors")
    save_file(ltx25_comfy_layout(models["tiny"], ""), d / "tiny_bare.safetensors")
    # ComfyUI's single files carry the transformer's config in the header: the variant's heads come from it
    config = {"transformer": {"num_attention_heads": 2, "audio_num_attention_heads": 2,
                              "av_ca_timestep_scale_multiplier": 1}}
    save_file(ltx25_comfy_layout(models["variant"]), d / "variant.safetensors",
              metadata={"config": json.dumps(config)})
    blocks = lambda key: ".transformer_blocks." in key  # noqa: E731
    save_file(int8_convrot_state(ltx25_comfy_layout(models["tiny"]), blocks, group=16),
              d / "tiny_int8.safetensors")
    return d


def inputs(model: LTX2VideoTransformer3DModel, seed: int = 3):
    """Random video, audio and prompt rows; a prompt mask with its last row padded; the first latent frame
    conditioned (clean) and marked as a keyframe."""
    torch.manual_seed(seed)
    cfg = model.config
    video, audio = torch.randn(GRID.rows, cfg.in_channels), torch.randn(AUDIO_ROWS, cfg.audio_in_channels)
    text_video = torch.randn(TEXT_ROWS, cfg.cross_attention_dim)
    text_audio = torch.randn(TEXT_ROWS, cfg.audio_cross_attention_dim)
    mask = torch.ones(TEXT_ROWS)
    mask[-1] = 0
    first = torch.zeros(GRID.rows)
    first[:GRID.height * GRID.width] = 1
    return video, audio, text_video, text_audio, mask, first


class AtTime(torch.nn.Module):
    """A time embedder fed a fixed time whatever its caller passes (ComfyUI's A<->V gates read the other stream's
    sigma, which no diffusers switch gives together with per-token scale/shift)."""

    def __init__(self, embedder: torch.nn.Module, time: float):
        super().__init__()
        self.embedder, self.time = embedder, time

    def forward(self, timestep, **kwargs):
        return self.embedder(torch.tensor([self.time]), **kwargs)


def diffusers_out(model, video, audio, text_video, text_audio, mask, conditioned, use_cross_timestep):
    timestep = SIGMA_VIDEO * 1000.0 * (1 - conditioned)
    with torch.no_grad():
        v, a = model(hidden_states=video[None], audio_hidden_states=audio[None],
                     encoder_hidden_states=text_video[None], audio_encoder_hidden_states=text_audio[None],
                     timestep=timestep[None],
                     audio_timestep=torch.tensor([SIGMA_AUDIO * 1000.0]), sigma=torch.tensor([SIGMA_VIDEO * 1000.0]),
                     audio_sigma=torch.tensor([SIGMA_AUDIO * 1000.0]), encoder_attention_mask=mask[None],
                     audio_encoder_attention_mask=mask[None], num_frames=GRID.frames, height=GRID.height,
                     width=GRID.width, fps=GRID.fps, audio_num_frames=AUDIO_ROWS,
                     use_cross_timestep=use_cross_timestep, video_keyframes_mask=conditioned[None, :, None],
                     return_dict=False)
    return v[0], a[0]


def ours_out(model: LTX25, video, audio, text_video, text_audio, mask, conditioned, av_times,
             rope_dtype=torch.float32):
    return model.forward(video, audio, text_video, text_audio, GRID, SIGMA_VIDEO, SIGMA_AUDIO, conditioned, mask,
                         conditioned.bool(), av_times, rope_dtype)


def test_comfy_layout_converts_back_to_diffusers(models):
    """The test's name map is diffusers' converter inverted; the prompt AdaLN, which the converter does not map,
    keeps the file's name."""
    model = models["tiny"]
    back = convert_ltx2_transformer_to_diffusers(ltx25_comfy_layout(model))
    state = model.state_dict()
    renamed = {k.replace("prompt_adaln_single.", "prompt_adaln."): v for k, v in back.items()}
    assert renamed.keys() == state.keys()
    assert all(torch.equal(renamed[k], state[k]) for k in state)
    assert any(k.startswith("prompt_adaln_single.") for k in back)


@pytest.mark.parametrize("name", ["tiny", "tiny_bare"])
@pytest.mark.parametrize("av_times, use_cross_timestep", [("cross", True), ("own", False)])
def test_transformer_matches_diffusers(models, files, name, av_times, use_cross_timestep):
    """Per-token video times (the first latent frame conditioned, marked as a keyframe), a padded prompt row, the
    two streams at different sigmas; both of diffusers' A<->V time rules."""
    model = models["tiny"]
    ours = LTX25.load(files / f"{name}.safetensors")
    assert (ours.video.arch.heads, ours.video.arch.head, ours.audio.arch.head) == (2, 16, 8)
    assert ours.video.prompt is not None and ours.keyframe is not None
    args = inputs(model)
    want_v, want_a = diffusers_out(model, *args, use_cross_timestep)
    v, a = ours_out(ours, *args, av_times)
    assert rel_err(v, want_v) <= 1e-4 and rel_err(a, want_a) <= 1e-4


def test_comfyui_av_times(models, files):
    """ComfyUI's rule: each stream's own per-row times for the A<->V scale/shift, the other stream's sigma for its
    gate: diffusers' own-time forward with the gates' embedders fed the other sigma."""
    model = random_ltx25()
    model.av_cross_attn_video_a2v_gate = AtTime(model.av_cross_attn_video_a2v_gate, SIGMA_AUDIO * 1000.0)
    model.av_cross_attn_audio_v2a_gate = AtTime(model.av_cross_attn_audio_v2a_gate, SIGMA_VIDEO * 1000.0)
    ours = LTX25.load(files / "tiny.safetensors")
    args = inputs(model)
    want_v, want_a = diffusers_out(model, *args, use_cross_timestep=False)
    v, a = ours_out(ours, *args, "comfyui")
    assert rel_err(v, want_v) <= 1e-4 and rel_err(a, want_a) <= 1e-4
    # the rules differ where the video rows' times differ (the conditioned frame)
    assert rel_err(ours_out(ours, *args, "own")[0], v) > 1e-4


def test_variant_matches_diffusers(models, files):
    """No prompt AdaLN (the static tables alone), video FF biases, ungated video attentions, no keyframe marker, the
    A<->V gates at sigma x 1."""
    model = models["variant"]
    ours = LTX25.load(files / "variant.safetensors")
    assert ours.av_time_scale == 1.0
    assert ours.video.prompt is None and ours.audio.prompt is None and ours.keyframe is None
    assert ours.blocks[0].video.self_attn.head_gate is None and ours.blocks[0].audio.self_attn.head_gate is not None
    assert ours.blocks[0].video.up.bias is not None
    args = inputs(model)
    want_v, want_a = diffusers_out(model, *args, use_cross_timestep=True)
    v, a = ours_out(ours, *args, "cross")
    assert rel_err(v, want_v) <= 1e-4 and rel_err(a, want_a) <= 1e-4


def test_float64_rotary_stays_near_diffusers(models, files):
    """The release's float64 angles (the default) against diffusers' float32 ones: close, not equal (section 9,
    item 3): 1.1e-5 and 1.4e-5 measured."""
    model, ours = models["tiny"], LTX25.load(files / "tiny.safetensors")
    args = inputs(model)
    want_v, want_a = diffusers_out(model, *args, use_cross_timestep=True)
    v, a = ours_out(ours, *args, "cross", torch.float64)
    assert 0 < rel_err(v, want_v) <= 1e-3 and rel_err(a, want_a) <= 1e-3


def test_int8_file_stays_near_f32(models, files):
    """The blocks' linears stored as INT8 ConvRot (ComfyUI's markers) read as stored, through the host's exact
    emulation of the INT8 products (activations rounded to INT8 too): 1.7e-3 and 2.8e-3 measured."""
    model = models["tiny"]
    ours = LTX25.load(files / "tiny_int8.safetensors")
    assert ours.blocks[1].a2v.q.quantized and ours.blocks[0].audio.down.quantized
    assert not ours.video.proj_in.quantized
    args = inputs(model)
    want_v, want_a = diffusers_out(model, *args, use_cross_timestep=True)
    v, a = ours_out(ours, *args, "cross")
    assert rel_err(v, want_v) <= 1e-2 and rel_err(a, want_a) <= 1e-2


def test_other_files_are_refused(models, files, tmp_path):
    save_file({"model.diffusion_model.blocks.0.attn.qkv_proj.weight": torch.zeros(4, 4)}, tmp_path / "h3.safetensors")
    with pytest.raises(WeightsError, match="h3.safetensors: not an LTX-2.5 audio-video diffusion model .*pick an "
                                           "LTX-2.5 file"):
        LTX25.load(tmp_path / "h3.safetensors")
    # LTX-2.0's blocks hold six modulation rows
    state = ltx25_comfy_layout(models["tiny"], "")
    state = {k: v[:6] if k.endswith("transformer_blocks.0.scale_shift_table") else v for k, v in state.items()}
    save_file(state, tmp_path / "ltx2.safetensors")
    with pytest.raises(WeightsError, match="6 modulation rows, not LTX-2.5's 9"):
        LTX25.load(tmp_path / "ltx2.safetensors")
