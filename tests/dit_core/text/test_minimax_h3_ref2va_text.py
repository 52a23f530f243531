"""MiniMax H3's ref2va presentation (dit_core/text/qwen3_vl_video.py read_references, MiniMaxH3TextEncoder
.encode_references): images, audios and videos with their soundtracks in packed order, the videos read at 2 fps into
timestamped vision blocks, as ComfyUI's MiniMaxH3Tokenizer (minimax_ref_items) and MiniMaxQwen3VL (process_video_block)
present them. Where diffusers 0.42.1's MiniMaxH3Ref2VATextEncoderStep agrees (frames on the vision grid, a video long
enough for its sampler), vs it on a tiny random Qwen3-VL: its _build_presentation ids and tags, its prompt_embeds
through transformers' Qwen3-VL. Where they differ (a frame off the grid: ComfyUI resizes it bilinear in float, each
pair alone, diffusers bicubic on 8-bit frames with bounds on the whole video; a video of under 13 frames: ComfyUI
repeats its one frame read, diffusers refuses), the expected values are written here by hand from ComfyUI's code
(comfy/text_encoders/minimax.py, comfy_extras/nodes_minimax_h3.py), as there is no newer ComfyUI to run."""
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import COMFYUI_TREE, rel_err
from PIL import Image
from safetensors.torch import save_file
from tiny_models import QWEN3_VL_TEXT_TINY, QWEN3_VL_VISION_TINY, qwen3_vl_layout, random_qwen3_vl
from transformers import Qwen2Tokenizer

from dit_core.families.minimax_h3 import TEXT, VIDEO
from dit_core.text.qwen3_vl import MiniMaxH3TextEncoder
from dit_core.text.qwen3_vl_video import PromptReference, read_references, sampled_frames, video_patches
from dit_core.text.qwen3_vl_vision import (IMAGE_PAD_ID, VIDEO_PAD_ID, VISION_END_ID, VISION_MAX_PIXELS,
                                           VISION_MIN_PIXELS, VISION_START_ID)
from dit_core.weights import WeightsError

TOKENIZER_DIR = COMFYUI_TREE / "comfy" / "text_encoders" / "qwen25_tokenizer"
TINY_LAYER = 6  # of 8, as test_minimax_h3_text.py
PATCH, MERGE = QWEN3_VL_VISION_TINY["patch_size"], QWEN3_VL_VISION_TINY["spatial_merge_size"]
TEMPORAL = QWEN3_VL_VISION_TINY["temporal_patch_size"]
PROMPT = "The man from <Picture 1> sings the melody of <Audio 2> while moving as in <Video 1>."
# diffusers' side: Qwen3-VL-32B's video_preprocessor_config.json size bounds (on all sampled frames' pixels together)
DIFFUSERS_VIDEO_MIN_PIXELS, DIFFUSERS_VIDEO_MAX_PIXELS = 4096, 25165824


@pytest.fixture(scope="module")
def reference():
    return random_qwen3_vl(seed=7, num_hidden_layers=8)


@pytest.fixture(scope="module")
def tiny_file(reference, tmp_path_factory):
    path = tmp_path_factory.mktemp("h3_ref2va_text") / "qwen3vl_tiny.safetensors"
    save_file(qwen3_vl_layout(reference, "comfy"), str(path))
    return path


def load(path, **kw):
    return MiniMaxH3TextEncoder.load(path, TOKENIZER_DIR, layer=TINY_LAYER,
                                     expected_hidden=QWEN3_VL_TEXT_TINY["hidden_size"],
                                     vision_heads=QWEN3_VL_VISION_TINY["num_heads"],
                                     deepstack_layers=tuple(QWEN3_VL_VISION_TINY["deepstack_visual_indexes"]), **kw)


@pytest.fixture(scope="module")
def encoder(tiny_file):
    return load(tiny_file)


@pytest.fixture(scope="module")
def media():
    """8-bit media as diffusers' setup step leaves them: a 64 x 96 picture; 30 frames at 24 fps (read: frames 0,
    12, 24, the last repeated: blocks at 0.25 s and 1.0 s) on the tiny tower's grid (56 x 72: over ComfyUI's 3136
    pixels a frame, so neither resizes), and 30 off it (36 x 52: ComfyUI resizes each pair to 48 x 72, bilinear);
    a stereo soundtrack and an audio (their samples never reach the encoder)."""
    g = torch.Generator().manual_seed(5)
    byte = lambda *shape: torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)  # noqa: E731
    return {"image": byte(64, 96, 3), "video": byte(30, 56, 72, 3), "video_off_grid": byte(30, 36, 52, 3),
            "audio": torch.randn(2, 100, generator=g)}


def diffusers_processor():
    """Qwen3VLProcessor's parts diffusers' step calls, at the tiny tower's patch sizes: the image processor (PIL
    backend, ComfyUI's pixel bounds as test_minimax_h3_text.py), the video processor with H3's
    video_preprocessor_config.json bounds, and its token types (image pads 1, video pads 2, the rest 0)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    sizes = dict(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL, image_mean=[0.5] * 3,
                 image_std=[0.5] * 3)
    return SimpleNamespace(
        image_processor=Qwen2VLImageProcessorPil(**sizes, min_pixels=VISION_MIN_PIXELS, max_pixels=VISION_MAX_PIXELS),
        video_processor=Qwen3VLVideoProcessor(**sizes, cap_pixels_per_frame=False,
                                              size={"shortest_edge": DIFFUSERS_VIDEO_MIN_PIXELS,
                                                    "longest_edge": DIFFUSERS_VIDEO_MAX_PIXELS}),
        create_mm_token_type_ids=lambda batch: [[{IMAGE_PAD_ID: 1, VIDEO_PAD_ID: 2}.get(t, 0) for t in ids]
                                                for ids in batch])


def requests(media, order: str, video: str = "video"):
    """One image, one audio and one video with its soundtrack, in the order given ("image,audio,video": diffusers'
    free order; "image,video,audio": the node's, ComfyUI's block order): diffusers' references and ours."""
    from diffusers.modular_pipelines.minimax_h3.references import (MiniMaxH3AudioReference, MiniMaxH3ImageReference,
                                                                   MiniMaxH3VideoReference)
    theirs = {"image": MiniMaxH3ImageReference(image=Image.fromarray(media["image"].numpy())),
              "audio": MiniMaxH3AudioReference(audio=media["audio"]),
              "video": MiniMaxH3VideoReference(frames=media[video].numpy(), fps=24.0, audio=media["audio"])}
    ours = {"image": PromptReference("image", (media["image"].float() / 255)[None]),
            "audio": PromptReference("audio"),
            "video": PromptReference("video", media[video].float() / 255, has_audio=True)}
    kinds = order.split(",")
    return [theirs[k] for k in kinds], [ours[k] for k in kinds]


def diffusers_ref2va(reference, tokenizer, prompt, refs):
    """MiniMaxH3Ref2VATextEncoderStep on the reference model: (token ids of _build_presentation, prompt_embeds,
    text_token_tags)."""
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3Ref2VATextEncoderStep
    step, processor = MiniMaxH3Ref2VATextEncoderStep(), diffusers_processor()
    _, images, blocks, stamps = step._gather_vision_features(processor, refs, 24.0)
    ids, _ = step._build_presentation(tokenizer, prompt, refs, images, blocks, stamps, TEXT, VIDEO)
    components = SimpleNamespace(tokenizer=tokenizer, processor=processor, text_encoder=reference,
                                 text_encoder_layer=TINY_LAYER, _execution_device=torch.device("cpu"), fps=24.0,
                                 text_tag=TEXT, video_tag=VIDEO)
    state = PipelineState()
    state.set("prompt", prompt)
    state.set("normalized_references", refs)
    with torch.no_grad():
        _, state = step(components, state)
    return ids, state.get("prompt_embeds"), state.get("text_token_tags")


# numbered per modality in packed order; a video's soundtrack labelled before it
LABELS = {"image,audio,video": ["Picture 1", "Audio 1", "Audio 2", "Video 1"],
          "image,video,audio": ["Picture 1", "Audio 1", "Video 1", "Audio 2"],
          "video,image,audio": ["Audio 1", "Video 1", "Picture 1", "Audio 2"]}


@pytest.mark.parametrize("order", ["image,audio,video", "image,video,audio", "video,image,audio"],
                         ids=["diffusers_order", "node_order", "video_first"])
def test_presentation_and_rows_match_diffusers(order, encoder, reference, media):
    """Where ComfyUI and diffusers agree (frames on the vision grid, 30 frames at 24 fps: frames 0, 12, 24 read, the
    last repeated): token ids and tags equal; rows within 1e-4 relative (f32: the same modules on the same patches,
    the pairs through the tower one by one here, all at once there; measured 2.3e-7 to 3.0e-7)."""
    tokenizer = Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR))
    theirs, ours = requests(media, order)
    want_ids, want_rows, want_tags = diffusers_ref2va(reference, tokenizer, PROMPT, theirs)
    read = read_references(encoder.vision, ours, "no tower")
    assert encoder.tokenizer.shown(PROMPT, read.pieces, read.grids).ids == want_ids
    rows, tags = encoder.encode_references(PROMPT, ours)
    assert torch.equal(tags, want_tags) and rows.dtype == torch.float32
    assert rel_err(rows, want_rows) <= 1e-4, rel_err(rows, want_rows)
    text = tokenizer.decode(want_ids)
    assert "<Video 1>: <0.2 seconds><|vision_start|>" in text and "<1.0 seconds>" in text
    assert re.findall(r"<(\w+ \d)>: ", text.removesuffix(PROMPT)) == LABELS[order]


@pytest.mark.parametrize("count,fps", [(30, 24.0), (22, 24.0), (13, 24.0), (124, 24.0), (37, 24.0), (50, 30.0),
                                       (7, 2.0), (2, 2.0)])
def test_sampled_frames_match_diffusers(count, fps):
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3Ref2VATextEncoderStep
    frames = np.arange(count)
    want_frames, want_stamps = MiniMaxH3Ref2VATextEncoderStep._sample_video_condition_frames(frames, fps, 2.0, 2)
    indices, stamps = sampled_frames(count, fps)
    assert indices == [int(f) for f in want_frames] and stamps == want_stamps


@pytest.mark.parametrize("count,want", [(5, ([0], [0.0])), (12, ([0], [0.0])), (13, ([0, 12], [0.25])),
                                        (22, ([0, 12], [0.25])), (30, ([0, 12, 24], [0.25, 1.0])),
                                        (39, ([0, 12, 24, 36], [0.25, 1.25])), (1, ([0], [0.0])), (2, ([0], [0.0]))])
def test_sampled_frames_are_comfyuis(count, want):
    """By hand from ComfyUI: the node reads range(0, n, FPS // 2) with timestamps i / 2; the tokenizer repeats an
    odd count's last frame and timestamp and labels a pair with their mean. Under 13 frames diffusers refuses;
    ComfyUI reads the first frame twice (its node takes 5 or more)."""
    assert sampled_frames(count) == want
    with pytest.raises(ValueError, match="at least one frame, got 0"):
        sampled_frames(0)


def comfyui_pair_patches(pair: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """ComfyUI's process_video_block rule, written out here: a pair [2, H, W, 3] in [0, 1], each side rounded to a
    multiple of patch x merge; under 3136 pixels a frame, both sides scaled up by sqrt(3136 / (H W)) and rounded up
    to multiples (the 12845056 cap is far above these sizes); bilinear (align_corners False) in float,
    (x - 0.5) / 0.5, then patches (merge blocks consecutive; a patch's values channel, frame, row, column)."""
    factor, height, width = PATCH * MERGE, pair.shape[1], pair.shape[2]
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w < 3136:
        up = math.sqrt(3136 / (height * width))
        h, w = math.ceil(height * up / factor) * factor, math.ceil(width * up / factor) * factor
    x = torch.nn.functional.interpolate(pair.permute(0, 3, 1, 2), size=(h, w), mode="bilinear", align_corners=False)
    x = (x - 0.5) / 0.5
    gh, gw = h // PATCH, w // PATCH
    out = torch.empty(gh // MERGE, gw // MERGE, MERGE, MERGE, 3, TEMPORAL, PATCH, PATCH)
    for bi in range(gh // MERGE):
        for bj in range(gw // MERGE):
            for i in range(MERGE):
                for j in range(MERGE):
                    r, c = (bi * MERGE + i) * PATCH, (bj * MERGE + j) * PATCH
                    out[bi, bj, i, j] = x[:, :, r:r + PATCH, c:c + PATCH].transpose(0, 1)
    return out.reshape(gh * gw, -1), (gh, gw)


def test_video_patches_are_comfyuis_blocks(media):
    """Three read frames off the grid (36 x 52, 1872 pixels: scaled up to 48 x 72): padded to 4 with the last,
    each pair resized and patched as ComfyUI's process_video_block does (comfyui_pair_patches, written out by hand),
    group after group."""
    frames = media["video_off_grid"][:3].float() / 255
    patches, (gt, gh, gw) = video_patches(frames, PATCH, TEMPORAL, MERGE)
    first, grid = comfyui_pair_patches(frames[:2])
    second, _ = comfyui_pair_patches(frames[[2, 2]])
    assert (gt, gh, gw) == (2, 12, 18) == (2, *grid) and torch.equal(patches, torch.cat([first, second]))


def test_short_video_presentation_is_comfyuis(encoder, media):
    """By hand from ComfyUI's MiniMaxH3Tokenizer: a 5-frame video (the fewest stock's node takes) with its
    soundtrack shows "<Audio 1>: ", "<Video 1>: ", "<0.0 seconds>" (its first frame read, repeated into a pair) and
    one vision block, then the prompt, each piece tokenized alone; the block's rows, <|vision_start|> and
    <|vision_end|> tagged video, the rest text; the block's rows the tower's on that pair alone, grid (1, gh, gw)."""
    tokenizer = Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR))
    frames = media["video_off_grid"][:5].float() / 255
    video = [PromptReference("video", frames, has_audio=True)]
    read = read_references(encoder.vision, video, "no tower")
    patches, (gh, gw) = comfyui_pair_patches(frames[[0, 0]])
    n = gh * gw // MERGE ** 2
    seg = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    label = seg("<Audio 1>: ") + seg("<Video 1>: ") + seg("<0.0 seconds>")
    want_ids = label + [VISION_START_ID] + [VIDEO_PAD_ID] * n + [VISION_END_ID] + seg(PROMPT)
    want_tags = [TEXT] * len(label) + [VIDEO] * (n + 2) + [TEXT] * len(seg(PROMPT))
    assert encoder.tokenizer.shown(PROMPT, read.pieces, read.grids).ids == want_ids
    rows, tags = encoder.encode_references(PROMPT, video)
    assert tags.tolist() == want_tags and rows.shape[1] == len(want_ids)
    tower = encoder.vision(patches, torch.tensor([[1, gh, gw]]))
    assert torch.equal(read.embeds, tower.pooler_output)
    assert all(torch.equal(a, b) for a, b in zip(read.deepstack, tower.deepstack_features))


def test_videos_need_the_vision_tower(encoder, media):
    """Labels alone need no tower; a video without one is refused with the loader's reason."""
    no_tower = MiniMaxH3TextEncoder(encoder.model, encoder.tokenizer, encoder.layers, None, "file.safetensors: none")
    rows, tags = no_tower.encode_references("x", [PromptReference("audio")])
    assert torch.equal(rows, encoder.encode_tagged("x", audios=1)[0]) and tags.tolist().count(VIDEO) == 0
    with pytest.raises(WeightsError, match=r"file\.safetensors: none; cannot read the 1 video\(s\) given"):
        no_tower.encode_references("x", [PromptReference("video", media["video"].float() / 255)])


def test_frames_read_beforehand_give_the_same_rows(encoder, media):
    """The node passes only the frames read at 2 fps (fps=2.0: each read again, at i / 2 s): the same rows."""
    frames = media["video"].float() / 255
    read, _ = sampled_frames(frames.shape[0])
    full = encoder.encode_references("x", [PromptReference("video", frames, True)])
    sampled = encoder.encode_references("x", [PromptReference("video", frames[read], True, 2.0)])
    assert torch.equal(full[0], sampled[0]) and torch.equal(full[1], sampled[1])


def test_cancel_before_each_reference_read_and_layer(encoder, media):
    _, ours = requests(media, "image,audio,video")
    calls = []
    encoder.encode_references("x", ours, lambda: calls.append(1))
    assert len(calls) == 2 + TINY_LAYER  # the image, the video, then each layer


def test_typed_video_pad_stays_text(encoder, media):
    _, ours = requests(media, "video")
    rows, tags = encoder.encode_references("a <|video_pad|> b", ours)
    typed = encoder.tokenize("a <|video_pad|> b")
    assert VIDEO_PAD_ID in typed and tags[-len(typed):].tolist() == [TEXT] * len(typed)
    assert torch.isfinite(rows).all()


def test_unknown_kind_is_refused(encoder):
    with pytest.raises(ValueError, match="an image, a video or an audio, got kind 'music'"):
        encoder.encode_references("x", [PromptReference("music")])


@pytest.mark.gpu
def test_on_the_card_matches_the_host(tiny_file, encoder, media):
    """The encoder on CUDA (f32; the patch embedding's conv without TF32) gives the host's rows and tags: the frames
    are resized on the host either way."""
    card = load(tiny_file, device="cuda")
    _, ours = requests(media, "image,video,audio", "video_off_grid")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        rows, tags = card.encode_references(PROMPT, ours)
    want_rows, want_tags = encoder.encode_references(PROMPT, ours)
    assert torch.equal(tags, want_tags) and rel_err(rows.cpu(), want_rows) <= 1e-4
