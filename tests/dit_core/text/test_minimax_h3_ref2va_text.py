"""MiniMax H3's ref2va presentation (dit_core/text/qwen3_vl_video.py read_references, MiniMaxH3TextEncoder
.encode_references): images, audios and videos with their soundtracks in packed order, the videos read at 2 fps into
timestamped vision blocks, vs diffusers 0.42.1's MiniMaxH3Ref2VATextEncoderStep (its _build_presentation ids and
tags, its prompt_embeds through transformers' Qwen3-VL with Qwen3VLVideoProcessor's patches) on a tiny random
Qwen3-VL; the frame sampling and the video size rule vs diffusers' and transformers' own functions."""
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
from dit_core.text.qwen3_vl_video import (VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS, PromptReference, read_references,
                                          sampled_frames, video_size)
from dit_core.text.qwen3_vl_vision import IMAGE_PAD_ID, VIDEO_PAD_ID, VISION_MAX_PIXELS, VISION_MIN_PIXELS
from dit_core.weights import WeightsError

TOKENIZER_DIR = COMFYUI_TREE / "comfy" / "text_encoders" / "qwen25_tokenizer"
TINY_LAYER = 6  # of 8, as test_minimax_h3_text.py
PATCH, MERGE = QWEN3_VL_VISION_TINY["patch_size"], QWEN3_VL_VISION_TINY["spatial_merge_size"]
TEMPORAL = QWEN3_VL_VISION_TINY["temporal_patch_size"]
PROMPT = "The man from <Picture 1> sings the melody of <Audio 2> while moving as in <Video 1>."


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
    12, 24, the last repeated: blocks at 0.25 s and 1.0 s) on the tiny tower's grid, and 30 off it (36 x 52: resized
    to 32 x 48 bicubic); a stereo soundtrack and an audio (their samples never reach the encoder)."""
    g = torch.Generator().manual_seed(5)
    byte = lambda *shape: torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)  # noqa: E731
    return {"image": byte(64, 96, 3), "video": byte(30, 32, 48, 3), "video_off_grid": byte(30, 36, 52, 3),
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
                                              size={"shortest_edge": VIDEO_MIN_PIXELS,
                                                    "longest_edge": VIDEO_MAX_PIXELS}),
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


@pytest.mark.parametrize("order,video", [("image,audio,video", "video"), ("image,video,audio", "video"),
                                         ("video,image,audio", "video_off_grid")],
                         ids=["diffusers_order", "node_order", "off_grid_video_first"])
def test_presentation_and_rows_match_diffusers(order, video, encoder, reference, media):
    """Token ids and tags equal; rows within 1e-4 relative (f32; measured ~1e-7: the same modules on the same
    patches). An off-grid video is resized as torchvision does (8-bit bicubic, antialiased)."""
    tokenizer = Qwen2Tokenizer.from_pretrained(str(TOKENIZER_DIR))
    theirs, ours = requests(media, order, video)
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


def test_too_short_video_is_refused():
    with pytest.raises(ValueError, match=r"at least 13 frames at 24 fps .*got 12; use a longer video"):
        sampled_frames(12)


@pytest.mark.parametrize("frames,height,width", [(4, 32, 48), (3, 36, 52), (30, 768, 1344), (26, 768, 1344),
                                                 (2, 20, 20), (8, 5, 300), (31, 1088, 1920)])
@pytest.mark.parametrize("factor", [PATCH * MERGE, 32])
def test_video_size_is_transformers_smart_resize(frames, height, width, factor):
    """H3's bounds: a 15 s reference at 2 fps on the 768 x 1344 canvas (30 frames) is scaled down, 26 frames is
    not quite (26 x 1,032,192 > 25,165,824 too), fewer keep the canvas."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize
    want = smart_resize(frames, height, width, 2, factor, VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS)
    assert video_size(frames, height, width, factor) == want


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
