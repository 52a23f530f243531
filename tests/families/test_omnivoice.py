"""OmniVoice on the shared block and its unmasking sampler vs the omnivoice 0.2.1 package, on a tiny random
model saved in the real folder layout (save_pretrained: config.json + model.safetensors) and a tiny byte-level
tokenizer with the package's special tokens."""
import types

import pytest
import torch
from conftest import rel_err
from tiny_models import randomize_language_model, torchaudio_stand_in

from dit_core.families.omnivoice import (
    OmniVoice,
    Speech,
    char_weight,
    generate_codes,
    prompt_rows,
    speech_codes,
    target_frames,
    text_chunks,
)
from dit_core.sampling.ksampler import SamplingCancelled
from dit_core.sampling.omnivoice import Unmasking, reveal_counts, shifted_times

# omnivoice imports torchaudio only to resample reference audio
with torchaudio_stand_in():
    package = pytest.importorskip("omnivoice.models.omnivoice")

from omnivoice.utils import duration as package_duration  # noqa: E402
from omnivoice.utils import text as package_text  # noqa: E402
from tiny_models import byte_tokenizer  # noqa: E402
from transformers import Qwen3Config  # noqa: E402

SPECIAL = ["<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>", "<|instruct_end|>",
           "<|text_start|>", "<|text_end|>"]
# vocab_size above 1024: the package also looks audio ids up in the text table (section 11, item 4)
TINY = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6,
            max_position_embeddings=512)
C, MASK = 8, 1024


@pytest.fixture(scope="module")
def tokenizer():
    """Byte-level BPE without merges (one token a byte) and the package's seven special tokens."""
    return byte_tokenizer(SPECIAL)


@pytest.fixture(scope="module")
def reference(tokenizer):
    torch.manual_seed(0)
    cfg = Qwen3Config(**TINY)
    cfg._attn_implementation = "sdpa"
    model = package.OmniVoice(package.OmniVoiceConfig(llm_config=cfg)).eval()
    randomize_language_model(model)
    # what generate's length rule and chunking read besides the model: the estimator, the codec's frame rate
    model.text_tokenizer, model.duration_estimator = tokenizer, package_duration.RuleDurationEstimator()
    model.audio_tokenizer = types.SimpleNamespace(config=types.SimpleNamespace(frame_rate=25))
    return model


@pytest.fixture(scope="module")
def folder(reference, tmp_path_factory):
    d = tmp_path_factory.mktemp("omnivoice")
    reference.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def ours(folder):
    return OmniVoice.load(folder)


def ref_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, MASK, (C, frames), generator=torch.Generator().manual_seed(seed))


# (text, target frames, lang, instruct, ref_text, ref_codes frames)
ITEMS = [("Hi [sigh] you.", 9, None, None, None, 0),
         ("Two,\n  ok 你好 x", 6, "en", "male", "Ref  said.", 5)]


def prompts_of(tokenizer, items):
    return [prompt_rows(tokenizer, text, target, lang=lang, instruct=instruct, ref_text=ref_text,
                        ref_codes=ref_codes(n_ref, i) if n_ref else None)
            for i, (text, target, lang, instruct, ref_text, n_ref) in enumerate(items)]


def test_loads_the_folder_layout(ours, reference):
    a = ours.arch
    assert (a.layers, a.heads, a.kv_heads, a.head, a.ffn, a.hidden) == (2, 4, 2, 16, 96, 64)
    assert (ours.codebooks, ours.audio_vocab, ours.mask_id) == (C, 1025, MASK)


def test_prompt_rows_match_the_package(tokenizer, reference):
    """Our prefix plus an all-MASK target is the package's conditional input (_prepare_inference_inputs)."""
    for i, (text, target, lang, instruct, ref_text, n_ref) in enumerate(ITEMS):
        codes = ref_codes(n_ref, i) if n_ref else None
        theirs = reference._prepare_inference_inputs(text, target, ref_text, codes, lang, instruct, True)
        p = prompt_rows(tokenizer, text, target, lang=lang, instruct=instruct, ref_text=ref_text,
                        ref_codes=codes)
        target_audio = torch.ones(target, dtype=torch.bool)
        assert torch.equal(torch.cat([p.ids, torch.full((C, target), MASK)], 1), theirs["input_ids"][0])
        assert torch.equal(torch.cat([p.audio, target_audio]), theirs["audio_mask"][0])


def package_batch(prompts, codes):
    """The package's padded batch of a step (_generate_iterative): cond rows 0..B-1, uncond rows B..2B-1;
    an uncond row's padding attends to itself only."""
    B, n = len(prompts), max(p.ids.shape[1] + c.shape[1] for p, c in zip(prompts, codes))
    ids = torch.full((2 * B, C, n), MASK)
    audio = torch.zeros(2 * B, n, dtype=torch.bool)
    mask = torch.zeros(2 * B, 1, n, n, dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, codes)):
        t, L = c.shape[1], p.ids.shape[1] + c.shape[1]
        ids[i, :, :L], audio[i, :L], mask[i, :, :L, :L] = torch.cat([p.ids, c], 1), True, True
        audio[i, :p.ids.shape[1]] = p.audio
        ids[B + i, :, :t], audio[B + i, :t], mask[B + i, :, :t, :t] = c, True, True
        mask[B + i, :, torch.arange(t, n), torch.arange(t, n)] = True
    return ids, audio, mask


def test_packed_logits_match_the_package(ours, reference, tokenizer):
    """Both items' conditional and unconditional rows packed in one forward, some target codes already
    revealed: float32 within 1e-5 of the package's padded batch (2e-7 measured); every row of a conditional
    segment too, its prefix included."""
    prompts = prompts_of(tokenizer, ITEMS)
    g = torch.Generator().manual_seed(3)
    codes = [torch.where(torch.rand(C, p.target, generator=g) < 0.4,
                         torch.randint(0, MASK, (C, p.target), generator=g), MASK) for p in prompts]
    ids, audio, mask = package_batch(prompts, codes)
    with torch.no_grad():
        theirs = reference(input_ids=ids, audio_mask=audio, attention_mask=mask).logits
    for i, (p, (cond, uncond)) in enumerate(zip(prompts, ours.target_logits(prompts, codes, guided=True))):
        L, t = p.ids.shape[1] + p.target, p.target
        assert rel_err(cond, theirs[i, :, L - t:L]) <= 1e-5
        assert rel_err(uncond, theirs[len(prompts) + i, :, :t]) <= 1e-5
    p, L = prompts[1], prompts[1].ids.shape[1] + prompts[1].target
    whole = ours.logits(ids[1, :, :L], audio[1, :L], (L,))
    assert rel_err(whole, theirs[1, :, :L]) <= 1e-5


def test_schedule_matches_the_package():
    """The shifted times bit for bit; the reveal counts of the reference's worked example (800 codes, 32
    steps: 3, 3, 3, 4, ..., 87, 125, 182)."""
    for steps, shift in [(4, 0.1), (32, 0.1), (12, 0.5), (7, 1.0)]:
        assert torch.equal(shifted_times(steps, shift), package._get_time_steps(0.0, 1.0, steps, shift))
        assert sum(reveal_counts(8 * 13, steps, shift)) == 8 * 13
    counts = reveal_counts(800, 32, 0.1)
    assert counts[:4] == [3, 3, 3, 4] and counts[-3:] == [87, 125, 182] and sum(counts[:16]) == 81


@pytest.mark.parametrize("references, u", [
    (False, Unmasking(steps=4)), (False, Unmasking(steps=32)), (True, Unmasking(steps=4)),
    (True, Unmasking(steps=32)), (True, Unmasking(steps=4, class_temperature=1.0, t_shift=0.5)),
    (False, Unmasking(steps=4, guidance=0.0, position_temperature=0.0, layer_penalty=2.0))])
def test_generate_matches_the_package(ours, reference, tokenizer, references, u):
    """The whole loop, two items of different lengths together: the same codes as the package's
    _generate_iterative after torch.manual_seed(seed), ours drawing from a generator seeded with seed."""
    items = [item if references else item[:4] + (None, 0) for item in ITEMS]
    seed = 1234 + u.steps
    task = package.GenerationTask(
        batch_size=len(items), texts=[it[0] for it in items], target_lens=[it[1] for it in items],
        langs=[it[2] for it in items], instructs=[it[3] for it in items], ref_texts=[it[4] for it in items],
        ref_audio_tokens=[ref_codes(it[5], i) if it[5] else None for i, it in enumerate(items)],
        ref_rms=[None] * len(items))
    config = package.OmniVoiceGenerationConfig(
        num_step=u.steps, guidance_scale=u.guidance, t_shift=u.t_shift, layer_penalty_factor=u.layer_penalty,
        position_temperature=u.position_temperature, class_temperature=u.class_temperature)
    torch.manual_seed(seed)
    with torch.no_grad():
        theirs = reference._generate_iterative(task, config)
    codes = generate_codes(ours, prompts_of(tokenizer, items), u, torch.Generator().manual_seed(seed))
    for mine, their in zip(codes, theirs):
        assert (mine != MASK).all()
        assert torch.equal(mine, their)


def test_length_rule_matches_the_package(reference):
    """Frames of texts in several scripts (digits, marks, punctuation, Han, kana, Hangul, Arabic, Devanagari,
    Thai, an emoji, a CJK extension character), with and without a reference, at several speeds."""
    texts = ["Hello, world.", "你好，世界！ 123", "こんにちは 안녕하세요", "مَرْحَبًا بِالْعَالَم", "नमस्ते दुनिया",
             "สวัสดี 🌍 \U00020000\u0640", "Chào thế giới\tok\n", "x"]
    references = [(None, None), ("Ref said.", 20), ("", 7), ("A much longer reference.", 3)]
    for t in texts:
        for ref_text, ref_frames in references:
            for speed in (1.0, 1.3, 0.7):
                assert target_frames(t, ref_text, ref_frames, speed) == \
                    reference._estimate_target_tokens(t, ref_text, ref_frames, speed)


def test_char_weights_match_the_package():
    """Every code point below U+30000: the merged block table gives the package's weights."""
    estimator = package_duration.RuleDurationEstimator()
    ours = [char_weight(chr(c)) for c in range(0x30000)]
    assert ours == [estimator._get_char_weight(chr(c)) for c in range(0x30000)]


def test_text_chunks_match_the_package():
    texts = ["Dr. Smith went home. It rained, and rained; then stopped! Was it over? Yes.",
             "A. Bb, cc. \"Quoted.\" (Paren.) Mr. X and e.g. this, vs. that... end",
             "你好。我们走吧！「好」。然后呢？", "no marks at all in this one", "Hi. " * 30, ", .", ""]
    for t in texts:
        for chunk_len in (1, 2, 5, 15, 40, 1000):
            assert text_chunks(t, chunk_len) == package_text.chunk_text_punctuation(t, chunk_len, 3)


LONG = "Dr. Smith went home. It rained, and rained; then stopped! Was it over? Yes, it was."


def package_generate_codes(reference, config, seed, **inputs):
    """generate's path to the codes (short items together, then the long ones chunked), without the codec."""
    task = reference._preprocess_all(**inputs)
    short, long = task.get_indices(config, 25)
    torch.manual_seed(seed)
    out = [None] * task.batch_size
    with torch.no_grad():
        if short:
            for i, codes in zip(short, reference._generate_iterative(task.slice_task(short), config)):
                out[i] = [codes]
        if long:
            for i, codes in zip(long, reference._generate_chunked(task.slice_task(long), config)):
                out[i] = codes
    return task, out


@pytest.mark.parametrize("references", [False, True])
def test_speech_codes_match_the_package(ours, reference, tokenizer, references):
    """Short and long items as generate makes them (chunks of 1 s over a threshold of 2 s, so that the tiny
    texts are long): a speed, a fixed duration, the first chunk as the later chunks' reference without a voice
    reference; the same codes chunk for chunk, the same lengths."""
    texts = ["Short one.", LONG, LONG[:60]]
    prompts = [package.VoiceClonePrompt(ref_codes(20, i), f"Ref {i} said.", 0.1) for i in range(3)]
    config = package.OmniVoiceGenerationConfig(num_step=4, audio_chunk_duration=1.0,
                                               audio_chunk_threshold=2.0)
    task, theirs = package_generate_codes(
        reference, config, 99, text=texts, language=["en", None, "fr"], instruct=[None, "male", None],
        voice_clone_prompt=prompts if references else None, speed=[1.0, 1.3, 1.0], duration=[None, None, 3.0])
    items = [Speech(t, lang, instruct, p.ref_text if references else None,
                    p.ref_audio_tokens if references else None, speed, frames)
             for t, lang, instruct, p, speed, frames in zip(texts, task.langs, task.instructs, prompts,
                                                          (1.0, 1.3, 1.0), (None, None, 75))]
    assert [it.target() for it in items] == task.target_lens
    mine = speech_codes(ours, tokenizer, items, Unmasking(steps=4), 99, chunk_seconds=1.0,
                        threshold_seconds=2.0)
    assert [len(m) for m in mine] == [len(t) for t in theirs] and len(theirs[1]) > 2
    for m, t in zip(mine, theirs):
        assert all(torch.equal(a, b) for a, b in zip(m, t))


def test_callback_and_cancel(ours, tokenizer):
    """callback(step, steps, codes) after every step; should_stop cancels before the step it says so for."""
    seen = []
    prompts = prompts_of(tokenizer, ITEMS[:1])
    generate_codes(ours, prompts, Unmasking(steps=3), torch.Generator().manual_seed(0),
                   callback=lambda i, n, codes: seen.append((i, n, int((codes[0] == MASK).sum()))))
    assert [(i, n) for i, n, _ in seen] == [(1, 3), (2, 3), (3, 3)] and seen[-1][2] == 0
    with pytest.raises(SamplingCancelled):
        generate_codes(ours, prompts, Unmasking(steps=3), torch.Generator().manual_seed(0),
                       should_stop=lambda: len(seen) > 4, callback=lambda *args: seen.append(args))
    assert len(seen) == 5
