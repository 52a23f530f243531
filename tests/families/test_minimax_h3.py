"""MiniMax H3 on the shared block (attention wider than the residual, rotary on part of a head, modulation rows per
(time, modality)) vs diffusers 0.42.1 MiniMaxH3Transformer3DModel, tiny and random, over a packed layout built as
diffusers' modular pipeline builds it."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err
from safetensors.torch import save_file
from tiny_models import MINIMAX_H3_TINY, minimax_h3_comfy_layout, random_minimax_h3

from dit_core.arch import Arch
from dit_core.families.minimax_h3 import (MiniMaxH3, Reference, packed_layout, patchify, reference_image_size,
                                         row_times)
from dit_core.families.minimax_h3_layout import reference_video_frames, reference_video_size
from dit_core.gpu.block import GpuBlock
from dit_core.gpu.staging import staged_bytes
from dit_core.gpu.streaming import StreamedBlocks

diffusers = pytest.importorskip("diffusers")
from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3Ref2VAPrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)
from diffusers.modular_pipelines.minimax_h3.references import (
    MiniMaxH3AudioReference,
    MiniMaxH3ImageReference,
    MiniMaxH3VideoReference,
)

C, CA, TEXT = MINIMAX_H3_TINY["in_channels"], MINIMAX_H3_TINY["audio_in_channels"], MINIMAX_H3_TINY["text_dim"]
GRID = 1001  # the curve test's table: 0.5, 0.75 and 0.999 (f32) land on its points


@pytest.fixture(scope="module")
def model():
    return random_minimax_h3()


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("minimax_h3")
    state = minimax_h3_comfy_layout(model)
    save_file(state, d / "h3_f32.safetensors")
    save_file(minimax_h3_comfy_layout(model, "model.diffusion_model."), d / "h3_prefixed.safetensors")
    # The pruned files' curve form: the time MLP's activation sampled on a grid of t in [0, 1], in its place.
    with torch.no_grad():
        t = torch.linspace(0, 1, GRID)
        table = F.silu(model.time_embedder(model.time_proj(t)))
    curve = {k: v for k, v in state.items() if not k.startswith("time_embedder.")}
    save_file({**curve, "adaln_t_table": table.contiguous()}, d / "h3_pruned.safetensors")
    return d


def diffusers_layout(tags, frames, h, w, audio_latents, keyframes):
    return MiniMaxH3PrepareLayoutStep.build_packed_sequence(tags, frames, h, w, audio_latents, (1, 2, 2), 2, 2, 0,
                                                            keyframes)


def test_comfy_layout_converts_back_to_diffusers(model):
    """The test's own name map is diffusers' converter inverted: converting it back gives the model's state."""
    back = convert_minimax_h3_transformer_checkpoint_to_diffusers(minimax_h3_comfy_layout(model),
                                                                  dict(model.config))
    state = model.state_dict()
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("frames, h, w, keyframes, image_rows", [(3, 4, 6, ("first",), 0), (7, 6, 4, ("last",), 2),
                                                                 (22, 4, 4, ("first", "last"), 0), (2, 2, 8, (), 3)])
def test_packed_layout_matches_diffusers(frames, h, w, keyframes, image_rows):
    """Positions bit for bit (float64), tags and row indices as diffusers' build_packed_sequence gives them; text
    rows of a picture's vision block tagged video."""
    tags = torch.ones(6, dtype=torch.long)
    tags[1:1 + image_rows] = 0
    positions, token_tags, video, audio, text, n_key, _ = diffusers_layout(tags, frames, h, w, 5, keyframes)
    ours = packed_layout(tags, frames, h, w, 5, keyframes)
    assert torch.equal(ours.positions, positions)
    assert torch.equal(ours.tags, token_tags)
    assert torch.equal(ours.video_rows, video) and torch.equal(ours.audio_rows, audio)
    assert (ours.text, ours.video_conditions) == (text.numel(), n_key)


def test_row_times_match_diffusers():
    layout = packed_layout(5, 3, 4, 6, 4, ("first",))
    want = MiniMaxH3SetTimestepsStep.build_row_timesteps(layout.video_rows, layout.audio_rows,
                                                         layout.video_conditions, 0, layout.text, 0.4, 0.55,
                                                         max(0.4, 0.999), 1.0)
    times, index = row_times(layout, 0.4, 0.55)
    assert torch.equal(times, want[0]) and torch.equal(index, want[1])
    assert times.numel() == 3


def test_patchify_matches_diffusers():
    z = torch.randn(C, 3, 4, 6)
    assert torch.equal(patchify(z), patchify_video_latents(z[None], (1, 2, 2)))


def inputs(seed=3, frames=3, h=4, w=6, audio_latents=4, keyframes=("first",), t_video=0.4, t_audio=0.55):
    """A packed t2va / fl2va pass: text, keyframe rows, stereo audio, target video; random rows."""
    torch.manual_seed(seed)
    layout = packed_layout(5, frames, h, w, audio_latents, keyframes)
    video = torch.randn(layout.video_rows.numel(), 4 * C)
    audio, text = torch.randn(layout.audio, CA), torch.randn(layout.text, TEXT)
    return layout, video, audio, text, *row_times(layout, t_video, t_audio)


def diffusers_out(model, layout, video, audio, text, times, index):
    with torch.no_grad():
        v, a = model(hidden_states=video[None], audio_hidden_states=audio[None], encoder_hidden_states=text[None],
                     timestep=times, timestep_indices=index, token_tags=layout.tags, position_ids=layout.positions,
                     video_indices=layout.video_rows, audio_indices=layout.audio_rows,
                     text_indices=torch.arange(layout.text), return_dict=False)
    return v[0], a[0]


@pytest.mark.parametrize("name", ["h3_f32", "h3_prefixed"])
def test_transformer_matches_diffusers(model, files, name):
    layout, video, audio, text, times, index = inputs()
    ours = MiniMaxH3.load(files / f"{name}.safetensors")
    assert (ours.arch.width, ours.arch.hidden, ours.arch.rotary) == (128, 64, 24)
    want_v, want_a = diffusers_out(model, layout, video, audio, text, times, index)
    v, a = ours.output(video, audio, text, layout, times, index)
    assert rel_err(v, want_v) <= 1e-4 and rel_err(a, want_a) <= 1e-4


def test_curve_form_matches_diffusers_on_its_grid(model, files):
    """The pruned file's table (the time MLP's activation on a grid) gives diffusers' output where every time lands
    on a grid point, and interpolates linearly between them."""
    ours = MiniMaxH3.load(files / "h3_pruned.safetensors")
    assert ours.time is None and ours.time_table.shape == (GRID, MINIMAX_H3_TINY["time_embed_dim"])
    layout, video, audio, text, times, index = inputs(t_video=0.5, t_audio=0.75)
    want_v, want_a = diffusers_out(model, layout, video, audio, text, times, index)
    v, a = ours.output(video, audio, text, layout, times, index)
    assert rel_err(v, want_v) <= 1e-4 and rel_err(a, want_a) <= 1e-4
    between = ours.time_rows(torch.tensor([0.5005, 1.5, -1.0]))
    table = ours.time_table
    assert torch.allclose(between[0], (table[500] + table[501]) / 2, atol=1e-6)
    assert torch.equal(between[1], table[-1]) and torch.equal(between[2], table[0])


def test_denoised_steps_target_rows_data_ward(model, files):
    ours = MiniMaxH3.load(files / "h3_f32.safetensors")
    layout, video, audio, text, _, _ = inputs()
    txt = ours.text_rows(text)
    x0_v, x0_a = ours.denoised(video, audio, txt, layout, 0.6, 0.45)
    v, a = ours.velocity(video, audio, txt, layout, *row_times(layout, 0.4, 0.55))
    assert torch.equal(x0_v[:layout.video_conditions], video[:layout.video_conditions])
    k = layout.video_conditions
    assert torch.allclose(x0_v[k:], video[k:] + 0.6 * v[k:])
    assert torch.allclose(x0_a, audio + 0.45 * a)


# ref2va requests: (kind, latent frames, h, w, audio latents a channel) per reference, in request order
REFERENCES = {"image, video with sound, audio": (("image", 1, 4, 6, 0), ("video", 3, 4, 4, 4), ("audio", 0, 0, 0, 3)),
              "two images": (("image", 1, 2, 8, 0), ("image", 1, 6, 4, 0)),
              "silent long video, image": (("video", 17, 2, 2, 0), ("image", 1, 2, 2, 0))}


def references(request) -> tuple[Reference, ...]:
    return tuple(Reference(kind, torch.empty(1, C, f, h, w) if kind != "audio" else None,
                           torch.empty(1, CA, 2, na) if na else None) for kind, f, h, w, na in request)


def diffusers_ref2va(tags, request, frames, h, w, audio_latents):
    refs = [MiniMaxH3ImageReference(image=None) if kind == "image" else MiniMaxH3AudioReference(audio=None)
            if kind == "audio" else MiniMaxH3VideoReference(frames=None, audio=torch.empty(1) if na else None)
            for kind, _, _, _, na in request]
    video = [torch.empty(1, C, f, rh, rw) for kind, f, rh, rw, _ in request if kind != "audio"]
    audio = [torch.empty(2 * na, CA) for *_, na in request if na]
    return MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(tags, refs, video, audio, frames, h, w,
                                                                         audio_latents, (1, 2, 2), 2, 2, 0)


@pytest.mark.parametrize("name", REFERENCES)
def test_ref2va_layout_matches_diffusers(name):
    """[text | reference blocks | target audio | target video]: positions bit for bit (float64), tags, row indices
    and condition counts as diffusers' build_ref2va_packed_sequence; the target origin moved on by the blocks."""
    tags = torch.ones(7, dtype=torch.long)
    tags[2:4] = 0
    want = diffusers_ref2va(tags, REFERENCES[name], 3, 4, 6, 5)
    ours = packed_layout(tags, 3, 4, 6, 5, references=references(REFERENCES[name]))
    assert torch.equal(ours.positions, want[0]) and torch.equal(ours.tags, want[1])
    assert torch.equal(ours.video_rows, want[2]) and torch.equal(ours.audio_rows, want[3])
    assert (ours.video_conditions, ours.audio_conditions) == want[5:]
    assert ours.video == 3 * 2 * 3 and ours.audio == 10
    times, index = row_times(ours, 0.4, 0.55)
    expected = MiniMaxH3SetTimestepsStep.build_row_timesteps(ours.video_rows, ours.audio_rows, *want[5:], ours.text,
                                                             0.4, 0.55, 0.999, 1.0)
    assert torch.equal(times, expected[0]) and torch.equal(index, expected[1])


def test_transformer_with_references_matches_diffusers(model, files):
    """One pass with a reference image, a video with its soundtrack and an audio clip ahead of the targets: the
    output of every video and audio row (conditions too) as diffusers' model gives it on the same packed rows."""
    layout = packed_layout(5, 3, 4, 6, 4, references=references(REFERENCES["image, video with sound, audio"]))
    g = torch.Generator().manual_seed(4)
    video, audio = torch.randn(layout.video_rows.numel(), 4 * C, generator=g), \
        torch.randn(layout.audio_rows.numel(), CA, generator=g)
    text = torch.randn(layout.text, TEXT, generator=g)
    times, index = row_times(layout, 0.4, 0.55)
    assert times.tolist() == pytest.approx([0.4, 0.55, 0.999, 1.0])
    ours = MiniMaxH3.load(files / "h3_f32.safetensors")
    want_v, want_a = diffusers_out(model, layout, video, audio, text, times, index)
    v, a = ours.output(video, audio, text, layout, times, index)
    assert rel_err(v, want_v) <= 1e-4 and rel_err(a, want_a) <= 1e-4
    x0_v, x0_a = ours.denoised(video, audio, ours.text_rows(text), layout, 0.6, 0.45)
    k, m = layout.video_conditions, layout.audio_conditions
    assert torch.equal(x0_v[:k], video[:k]) and torch.equal(x0_a[:m], audio[:m])  # conditions are not stepped
    assert torch.allclose(x0_a[m:], audio[m:] + 0.45 * a[m:], atol=1e-6)


def test_reference_checks_its_latents():
    for kind, video, audio, message in [("picture", None, None, "'image', a 'video' or an 'audio'"),
                                        ("image", None, None, "a video latent for the image"),
                                        ("audio", torch.empty(1, C, 1, 2, 2), torch.empty(1, CA, 2, 3),
                                         "no video latent for the audio"),
                                        ("image", torch.empty(1, C, 2, 2, 2), None, r"\[1, C, 1, h, w\]"),
                                        ("video", torch.empty(1, C, 3, 3, 2), None, "even sides")]:
        with pytest.raises(ValueError, match=message):
            Reference(kind, video, audio)
    assert Reference("video", torch.empty(1, C, 7, 2, 4), torch.empty(1, CA, 2, 9)).span() == pytest.approx(
        5 / 3 * (1 + 4 * 4 + 1 + 4))  # spans (1, 4, 4, 4, 4) repeat
    assert Reference("video", torch.empty(1, C, 2, 2, 4), torch.empty(1, CA, 2, 9)).rows() == 2 * 2 + 18


@pytest.mark.parametrize("image, canvas, sizing, want", [
    ((1080, 1920), (768, 1344), "match", (768, 1344)),  # scaled down to the canvas's area, sides to 32s
    ((100, 100), (768, 1344), "match", (96, 96)),       # never up
    ((80, 208), (768, 1344), "max", (64, 192)),         # Python's round: 2.5 -> 2, 6.5 -> 6
    ((3000, 4000), (480, 864), "max", (2048, 2720)),    # a 2048 short edge whatever the canvas
    ((10, 10), (480, 864), "max", (32, 32))])           # at least 32
def test_reference_image_size_as_comfyui(image, canvas, sizing, want):
    """MiniMaxH3ReferenceToVideo's sizes of a reference image (ref_image_size 'match' and 'max')."""
    assert reference_image_size(*image, *canvas, sizing) == want


@pytest.mark.parametrize("video, want", [
    ((1080, 1920), (768, 1344)),   # a 768 short edge, then down to 768 x 1344 pixels, sides to 32s
    ((1920, 1080), (1344, 768)),
    ((2000, 2000), (768, 768)),
    ((40, 70), (32, 64)),          # smaller than its canvas: its own sides, rounded to 32s
    ((10, 10), (32, 32))])         # at least 32
def test_reference_video_size_as_comfyui(video, want):
    """MiniMaxH3ReferenceToVideo's frame size of a reference video (adapt_canvas, or its own rounded sides)."""
    assert reference_video_size(*video) == want


def test_reference_video_frames_as_comfyui():
    """A reference video's frames: at most the target's length, then down to 17n + 5; under 5 refused."""
    assert [reference_video_frames(n, 124) for n in (5, 21, 22, 38, 39, 200)] == [5, 5, 22, 22, 39, 124]
    assert reference_video_frames(200, 22) == 22
    with pytest.raises(ValueError, match="at least 5 frames"):
        reference_video_frames(4, 124)


def test_arch_checks_the_inner_width(model, files):
    a = MiniMaxH3.load(files / "h3_f32.safetensors").arch
    with pytest.raises(ValueError, match="attention width"):
        replace(a, inner=96)
    with pytest.raises(ValueError, match="attention width"):
        Arch(**{**a.__dict__, "inner": 0})


@pytest.mark.parametrize("linears", ["stored", "int8"])
def test_gpu_form_matches_the_host(files, linears):
    """The model as the GPU path runs it (GPU blocks with attention wider than the residual, the modulation
    linears through the GPU block's product, the token refiner's unrotated GPU blocks), run on the CPU where every
    kernel takes its reference: within 2e-2 of the host path (INT8 rows, bf16 products)."""
    host = MiniMaxH3.load(files / "h3_f32.safetensors", linears=linears)
    gpu = host.gpu_form(torch.device("cpu"), host.default_options())
    assert isinstance(gpu.blocks[0].block, GpuBlock) and isinstance(gpu.refiners[0], GpuBlock)
    layout, video, audio, text, times, index = inputs()
    for want, got in zip(host.output(video, audio, text, layout, times, index),
                         gpu.output(video, audio, text, layout, times, index)):
        assert rel_err(got, want) <= 2e-2


def test_streamed_layers_equal_resident(files):
    """Layers (a block with its modulation linear) streamed through CPU slots, none resident: the same numbers as
    the resident model."""
    host = MiniMaxH3.load(files / "h3_f32.safetensors")
    one = staged_bytes(host.blocks[0])
    assert all(host.to("cpu", budget_bytes=2 * one).blocks.resident)  # both fit: no slots
    streamed = replace(host, blocks=StreamedBlocks(host.blocks, "cpu", one, slots=1))  # one slot, nothing kept
    assert not any(streamed.blocks.resident) and streamed.blocks.slot_bytes == one
    layout, video, audio, text, times, index = inputs()
    for want, got in zip(host.output(video, audio, text, layout, times, index),
                         streamed.output(video, audio, text, layout, times, index)):
        assert torch.equal(got, want)


def test_int8_blocks_stay_near_f32(files):
    """The blocks' linears quantized at load (INT8 ConvRot, the host's exact emulation of the GPU's products): the
    attention's inner width goes through OUT's rotation groups like any other width."""
    f32, int8 = (MiniMaxH3.load(files / "h3_f32.safetensors", linears=mode) for mode in ("stored", "int8"))
    assert all(layer.block.w[i].quantized for layer in int8.blocks for i in range(4))
    layout, video, audio, text, times, index = inputs()
    (v, a), (qv, qa) = (m.output(video, audio, text, layout, times, index) for m in (f32, int8))
    assert rel_err(qv, v) <= 3e-2 and rel_err(qa, a) <= 3e-2


def test_lora_merges_in_diffusers_and_file_names(model, files, tmp_path):
    """A LoRA on k (diffusers' PEFT names: QKV's middle rows), the refiner's out projection (diffusers) and a block's
    fc2 (the file's names) gives diffusers' model with the same updates merged."""
    torch.manual_seed(5)
    inner, hidden, ffn = 128, MINIMAX_H3_TINY["hidden_size"], MINIMAX_H3_TINY["ffn_dim"]
    a_k, b_k = torch.randn(4, hidden) * 0.1, torch.randn(inner, 4) * 0.1
    a_o, b_o = torch.randn(2, inner) * 0.1, torch.randn(hidden, 2) * 0.1
    a_f, b_f = torch.randn(2, ffn) * 0.1, torch.randn(hidden, 2) * 0.1
    save_file({"transformer.transformer_blocks.1.attn.to_k.lora_A.weight": a_k,
               "transformer.transformer_blocks.1.attn.to_k.lora_B.weight": b_k,
               "transformer.token_refiner.refiner_blocks.0.attn.to_out.0.lora_A.weight": a_o,
               "transformer.token_refiner.refiner_blocks.0.attn.to_out.0.lora_B.weight": b_o,
               "diffusion_model.blocks.0.mlp.fc2.lora_A.weight": a_f,
               "diffusion_model.blocks.0.mlp.fc2.lora_B.weight": b_f}, tmp_path / "lora.safetensors")
    strength = 0.7
    merged = random_minimax_h3()
    with torch.no_grad():
        merged.transformer_blocks[1].attn.to_k.weight += strength * b_k @ a_k
        merged.token_refiner.refiner_blocks[0].attn.to_out[0].weight += strength * b_o @ a_o
        merged.transformer_blocks[0].ff.net[2].weight += strength * b_f @ a_f
    layout, video, audio, text, times, index = inputs()
    want_v, want_a = diffusers_out(merged, layout, video, audio, text, times, index)
    ours = MiniMaxH3.load(files / "h3_f32.safetensors", loras=((tmp_path / "lora.safetensors", strength),))
    v, a = ours.output(video, audio, text, layout, times, index)
    assert rel_err(v, want_v) <= 1e-4 and rel_err(a, want_a) <= 1e-4
    assert rel_err(diffusers_out(model, layout, video, audio, text, times, index)[0], want_v) > 1e-3


# A model the GPU kernels take (heads of 128, widths in ConvRot groups of 256): attention 768 wide over a residual
# of 512, as H3's 7168 over 5376, rotary on 96 of 128.
GPU_SIZES = dict(num_attention_heads=6, attention_head_dim=128, hidden_size=512, num_layers=2, num_refiner_layers=1,
                 ffn_dim=1024, in_channels=24, audio_in_channels=32, text_dim=256, freq_dim=256,
                 time_embed_hidden_dim=512, time_embed_dim=256, rope_freq_dim=16)


@pytest.fixture(scope="module")
def gpu_sized(tmp_path_factory):
    path = tmp_path_factory.mktemp("h3_gpu") / "h3.safetensors"
    save_file(minimax_h3_comfy_layout(random_minimax_h3(seed=7, **GPU_SIZES)), path)
    g = torch.Generator().manual_seed(8)
    layout = packed_layout(9, 3, 8, 6, 10, ("first",))
    video = torch.randn(layout.video_rows.numel(), 96, generator=g)
    audio, text = torch.randn(layout.audio, 32, generator=g), torch.randn(layout.text, 256, generator=g)
    return path, layout, video, audio, text, *row_times(layout, 0.4, 0.55)


def test_gpu_sized_gpu_form_on_the_cpu(gpu_sized):
    """The GPU form at sizes the kernels take, their references on the CPU, against the host's INT8 emulation in
    f64 (INT8 linears) and the host's BF16 model."""
    path, layout, video, audio, text, times, index = gpu_sized
    for linears, bound in (("bf16", 1e-2), ("int8", 2e-2)):
        host = MiniMaxH3.load(path, linears=linears)
        want = host.output(video.double(), audio.double(), text.double(), layout, times, index)
        got = host.gpu_form(torch.device("cpu"), host.default_options()).output(video, audio, text, layout, times,
                                                                                index)
        for g, w in zip(got, want):
            assert rel_err(g, w.float()) <= bound, linears


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matches_host(gpu_sized):
    """MiniMaxH3.to('cuda'): the GPU block's kernels at an attention wider than the residual, the modulation linears
    through the GPU product, against the host's INT8 emulation in f64 (2e-2); streamed layers (one slot) equal to
    resident ones."""
    path, layout, video, audio, text, times, index = gpu_sized
    host = MiniMaxH3.load(path, linears="int8")
    want = host.output(video.double(), audio.double(), text.double(), layout, times, index)
    cuda = [t.cuda() for t in (video, audio, text)]
    got = host.to("cuda").output(*cuda, layout, times, index)
    for g, w in zip(got, want):
        assert rel_err(g.cpu(), w.float()) <= 2e-2
    one = staged_bytes(host.blocks[0])
    streamed = replace(host.to("cuda", budget_bytes=2 * one),
                       blocks=StreamedBlocks(host.blocks, "cuda", one, form=lambda layer, where: layer.on(where),
                                             slots=1))
    for s, g in zip(streamed.output(*cuda, layout, times, index), got):
        assert torch.equal(s, g)
