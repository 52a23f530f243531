"""OmniVoice's codec (Higgs audio v2 tokenizer) and its audio handling vs the oracles: a tiny random
HiggsAudioV2TokenizerModel of transformers 5.24 saved in the real folder layout (save_pretrained: config.json +
model.safetensors, the real strides 8, 5, 4, 2, 3 and HuBERT's real conv strides, few channels) decoded and
encoded by both; the omnivoice 0.2.1 package's audio functions (pydub silence rules) on random audio; the
resampler against torchaudio 2.11.1's outputs."""
import importlib
import math
import types

import numpy as np
import pytest
import torch
from conftest import rel_err
from tiny_models import torchaudio_stand_in

from dit_core.codecs import omnivoice_audio as ours
from dit_core.codecs.higgs_audio import HiggsAudioCodec, resample
from dit_core.weights import TensorSource, WeightsError

# The module itself: the lazy package hands out a placeholder while torchaudio is missing.
MODELING = "transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer"
# transformers' Higgs codec and the package's audio module import torchaudio; where it stood in, the codec's call
# to torchaudio's resample is served by ours, which the last tests hold to torchaudio.
with torchaudio_stand_in() as stood_in:
    package_audio = pytest.importorskip("omnivoice.utils.audio")
    higgs = importlib.import_module(MODELING)
if stood_in:
    higgs.torchaudio = types.SimpleNamespace(functional=types.SimpleNamespace(resample=resample))

from transformers import DacConfig, HiggsAudioV2TokenizerConfig, HubertConfig

RATE, HOP = 24000, 960


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random codec saved as an OmniVoice model folder's audio_tokenizer/."""
    torch.manual_seed(0)
    acoustic = DacConfig(encoder_hidden_size=2, downsampling_ratios=[8, 5, 4, 2, 3], decoder_hidden_size=64,
                         upsampling_ratios=[8, 5, 4, 2, 3], hidden_size=16)
    semantic = HubertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                            conv_dim=(8,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    # 0.5 and 1 kbps: 1000 / (25 frames x 5 bits) = 8 codebooks of 32 codes, as OmniVoice's 8 of 1024
    cfg = HiggsAudioV2TokenizerConfig(acoustic_model_config=acoustic, semantic_model_config=semantic,
                                      codebook_size=32, codebook_dim=8, target_bandwidths=[0.5, 1.0])
    model = higgs.HiggsAudioV2TokenizerModel(cfg).eval()
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("alpha"):
                t.uniform_(0.5, 1.5)
            elif "norm" in name and t.dim() == 1:
                t.copy_(1 + 0.1 * torch.randn_like(t) if name.endswith("weight") else 0.1 * torch.randn_like(t))
            elif t.dim() > 1 and "codebook" not in name:
                fan_in = t[0].numel() if "conv_t" not in name else t.shape[0] * t.shape[-1]
                t.normal_(0, 1 / math.sqrt(fan_in))
            else:
                t.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("omnivoice") / "audio_tokenizer"
    model.save_pretrained(path)
    return path.parent, model


@pytest.fixture(scope="module")
def codec(folder):
    return HiggsAudioCodec.load(folder[0])


def test_layout_read(folder, codec):
    model = folder[1]
    assert codec.decoder_strides == codec.encoder_strides == (8, 5, 4, 2, 3)
    assert (codec.hop, codec.frame_rate, codec.codebooks, codec.hubert_layers) == (HOP, 25, 8, 2)
    # HuBERT's positional conv is stored weight-normed over the kernel axis; folded at load as torch computes it
    pos = model.semantic_model.encoder.pos_conv_embed.conv.weight
    assert rel_err(codec.w["semantic_model.encoder.pos_conv_embed.conv.weight"], pos) < 1e-6


def test_real_sizes_on_meta():
    """The released tokenizer's sizes (transformers' converter config; OmniVoice's 2 kbps top bandwidth -> 8
    codebooks) read and chain through decode and encode, on meta tensors."""
    cfg = HiggsAudioV2TokenizerConfig(
        acoustic_model_config=DacConfig(encoder_hidden_size=64, downsampling_ratios=[8, 5, 4, 2, 3],
                                        decoder_hidden_size=1024, upsampling_ratios=[8, 5, 4, 2, 3], hidden_size=256),
        target_bandwidths=[0.5, 1, 1.5, 2])
    with torch.device("meta"):
        model = higgs.HiggsAudioV2TokenizerModel(cfg)
    codec = HiggsAudioCodec.from_checkpoint(TensorSource(dict(model.state_dict())), cfg.to_dict())
    assert (codec.hop, codec.codebooks, codec.hubert_layers, codec.cfg.hubert_heads) == (HOP, 8, 12, 12)
    assert codec.w["semantic_model.encoder.pos_conv_embed.conv.weight"].shape == (768, 48, 128)
    assert codec.w["acoustic_decoder.conv1.weight"].shape == (1024, 256, 7)


def test_decode(folder, codec):
    """Equal to transformers' decode (measured 0.0: the same ops in the same order). Between batch sizes both
    drift by 1.8e-5 (f32 vs f64: 1.5e-5): the random decoder's gain magnifies rounding."""
    model = folder[1]
    codes = torch.randint(0, 32, (2, 8, 7))
    with torch.no_grad():
        want, want_one = model.decode(codes).audio_values, model.decode(codes[1:]).audio_values
    got = codec.decode(codes)
    assert got.shape == want.shape == (2, 1, 7 * HOP)
    assert rel_err(got, want) < 1e-6
    assert rel_err(codec.decode(codes[1]), want_one) < 1e-6  # [8, T] alone


def test_encode(folder, codec):
    model = folder[1]
    torch.manual_seed(1)
    wave = 0.3 * torch.randn(2, 1, 6 * HOP)
    with torch.no_grad():
        want = model.encode(wave).audio_codes
    got = codec.encode(wave)
    assert got.shape == want.shape == (2, 8, 6)
    assert torch.equal(got, want)
    # half a hop more: HuBERT gives a frame more than the DAC, so the DAC's input is padded by half a hop a side
    odd = 0.3 * torch.randn(1, 1, 6 * HOP + HOP // 2)
    with torch.no_grad():
        want = model.encode(odd).audio_codes
    assert want.shape == (1, 8, 7) and torch.equal(codec.encode(odd), want)
    # HuBERT's mean state (the semantic input) to 1e-5 too, so equal codes do not hide a drifting branch
    with torch.no_grad():
        feats = model._extract_semantic_features(wave)
    mine = codec._hubert(torch.nn.functional.pad(resample(wave, 24000, 16000)[:, 0], (160, 160)))[:, ::2]
    assert rel_err(mine, feats) < 1e-5


def test_decode_only_and_errors(folder, tmp_path):
    small = HiggsAudioCodec.load(folder[0] / "audio_tokenizer", encoder=False)
    assert not small.can_encode and "semantic_model.encoder.layers.0.layer_norm.weight" not in small.w
    with pytest.raises(ValueError, match="decoding only"):
        small.encode(torch.zeros(1, 1, HOP))
    with pytest.raises(ValueError, match=r"codes \[B, 8, T\]"):
        small.decode(torch.zeros(1, 4, 3, dtype=torch.long))
    with pytest.raises(WeightsError, match="no model.safetensors"):
        HiggsAudioCodec.load(tmp_path)
    from safetensors.torch import load_file, save_file
    state = load_file(folder[0] / "audio_tokenizer" / "model.safetensors")
    del state["acoustic_decoder.block.2.res_unit3.conv2.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(WeightsError, match="missing or of another size"):
        HiggsAudioCodec.load(tmp_path / "model.safetensors")


# --- the package's audio handling -----------------------------------------------------------------------

def speech_like(seed: int, seconds: float, gaps: list[tuple[float, float]], level: float = 0.3) -> torch.Tensor:
    """Noise bursts at random levels with silent or near-silent gaps ([1, S] f32): both sides of pydub's
    -50 dBFS line, runs shorter and longer than each rule's minimum, lengths not whole milliseconds."""
    g = torch.Generator().manual_seed(seed)
    n = int(seconds * RATE) + int(torch.randint(0, 24, (1,), generator=g))
    wave = level * torch.randn(n, generator=g) * torch.rand(n // 240 + 1, generator=g).repeat_interleave(240)[:n]
    for start, length in gaps:
        a, b = int(start * RATE), int((start + length) * RATE)
        wave[a:b] *= 1e-4 * float(torch.rand(1, generator=g))  # -80 dB to silence: well under the line
    return wave[None]


CASES = [
    (0, 3.0, [(0.0, 0.3), (1.0, 0.7), (2.2, 0.05), (2.7, 0.3)]),
    (1, 2.5, [(0.5, 0.21), (1.2, 0.55), (2.3, 0.2)]),
    (2, 1.5, [(0.0, 1.5)]),                   # all silence
    (3, 2.0, []),                             # no silence
    (4, 4.0, [(0.02, 0.61), (1.9, 0.499), (2.5, 0.501), (3.4, 0.6)]),
]


@pytest.mark.parametrize("seed,seconds,gaps", CASES)
@pytest.mark.parametrize("mid,lead,trail", [(500, 100, 100), (200, 100, 200), (0, 100, 300)])
def test_remove_silence(seed, seconds, gaps, mid, lead, trail):
    wave = speech_like(seed, seconds, gaps)
    want = package_audio.remove_silence(wave.numpy(), RATE, mid_sil=mid, lead_sil=lead, trail_sil=trail)
    got = ours.remove_silence(wave, RATE, mid, lead, trail)
    assert got.shape == want.shape and torch.equal(got, torch.from_numpy(want))


@pytest.mark.parametrize("seed,seconds,gaps", [(5, 24.0, [(2.0, 0.3), (9.5, 0.4), (14.2, 0.5), (18.0, 1.0)]),
                                               (6, 21.0, [(1.0, 0.3), (2.5, 0.2)]),
                                               (7, 22.0, [])])
def test_trim_long(seed, seconds, gaps):
    wave = speech_like(seed, seconds, gaps)
    want = package_audio.trim_long_audio(wave.numpy(), RATE, trim_threshold=20.0)
    got = ours.trim_long(wave, RATE)
    assert torch.equal(got, torch.from_numpy(want))


@pytest.mark.parametrize("n", [0, 1, 5, 2399, 4800, 20000])
def test_fade_and_pad(n):
    wave = torch.randn(1, n)
    want = package_audio.fade_and_pad_audio(wave.numpy(), pad_duration=0.1, fade_duration=0.1, sample_rate=RATE)
    assert torch.equal(ours.fade_and_pad(wave, RATE, 0.1, 0.1), torch.from_numpy(want))


@pytest.mark.parametrize("lengths", [[5000], [9000, 12000, 3000], [100, 30000], [0, 4000]])
def test_join_chunks(lengths):
    chunks = [torch.randn(1, n) for n in lengths]
    want = package_audio.cross_fade_chunks([c.numpy().copy() for c in chunks], RATE)
    assert torch.equal(ours.join_chunks(chunks, RATE), torch.from_numpy(want))


@pytest.mark.parametrize("ref_rms", [None, 0.03, 0.25])
def test_finish_speech(ref_rms):
    """Decoded speech through the package's _post_process_audio (one tensor and chunks): equal to f32 rounding
    of the loudness factor (ref_rms x wave / 0.1 in f32, as numpy)."""
    package = pytest.importorskip("omnivoice.models.omnivoice")
    cfg = package.OmniVoiceGenerationConfig()
    post = types.SimpleNamespace(sampling_rate=RATE)
    chunks = [speech_like(8, 1.2, [(0.1, 0.6)]), speech_like(9, 0.9, [(0.5, 0.2)])]
    for speech in (chunks[0], chunks):
        joined = package_audio.cross_fade_chunks([c.numpy().copy() for c in chunks], RATE) \
            if isinstance(speech, list) else speech.numpy()
        want = torch.from_numpy(package.OmniVoice._post_process_audio(post, joined, ref_rms, cfg))
        got = ours.finish_speech(speech, RATE, ref_rms)
        assert got.shape == want.shape and (got - want).abs().max() <= 1e-6 * want.abs().max()


@pytest.mark.parametrize("channels,rate,level", [(1, 24000, 0.3), (2, 16000, 0.02), (1, 44100, 0.2)])
def test_prepare_reference(channels, rate, level):
    """create_voice_clone_prompt's steps up to the codec's input, on random stereo/mono audio at other rates."""
    waves = [speech_like(10 + c, 2.5, [(0.2, 0.5), (1.5, 0.3)], level) for c in range(channels)]
    wave = torch.cat([w[:, : min(w.shape[-1] for w in waves)] for w in waves])
    got, got_rms = ours.prepare_reference(wave, rate, RATE, HOP)
    ref = wave.mean(dim=0, keepdim=True).numpy() if channels > 1 else wave.numpy()
    ref = resample(torch.from_numpy(ref), rate, RATE).numpy()  # torchaudio's, bit for bit (below)
    ref_rms = float(np.sqrt(np.mean(ref ** 2)))
    if 0 < ref_rms < 0.1:
        ref = ref * 0.1 / ref_rms
    ref = package_audio.remove_silence(ref, RATE, mid_sil=200, lead_sil=100, trail_sil=200)
    ref = ref[:, : ref.shape[-1] - ref.shape[-1] % HOP]
    assert abs(got_rms - ref_rms) <= 1e-6 * ref_rms
    assert got.shape == ref.shape and (got - torch.from_numpy(ref)).abs().max() <= 1 / 32768


# --- the resampler --------------------------------------------------------------------------------------

# torchaudio 2.11.1 functional.resample of x = sin(0.05 i) + 0.3 cos(0.31 i), i < 97, f32 (measured once:
# torchaudio has no build for our torch); our resample gave the same bits at every rate pair tried on that machine,
# within 2 f32 steps on others (the convolution's sums run in an order that follows the CPU's vector width).
TORCHAUDIO = {(24000, 16000): (65, {0: "0x1.03ec1ap-2", 1: "0x1.6e138ap-2", 10: "0x1.538f06p-1",
                                    31: "0x1.4b3848p-1", 50: "-0x1.53de66p-1", -1: "-0x1.b71a58p-1"}),
              (22050, 24000): (106, {0: "0x1.31cbf6p-2", 1: "0x1.5cfa9cp-2", 10: "0x1.405a82p-3",
                                     31: "0x1.7bcde4p-1", 50: "0x1.6f0a92p-1", -1: "-0x1.145a98p-1"})}


@pytest.mark.parametrize("rates", list(TORCHAUDIO))
def test_resample_torchaudio_values(rates):
    i = torch.arange(97, dtype=torch.float32)
    out = resample(torch.sin(0.05 * i) + 0.3 * torch.cos(0.31 * i), *rates)
    length, values = TORCHAUDIO[rates]
    assert out.shape == (length,)
    torch.testing.assert_close(torch.stack([out[k] for k in values]),
                               torch.tensor([float.fromhex(v) for v in values.values()]), rtol=5e-7, atol=0)


def test_resample_against_torchaudio():
    torchaudio = pytest.importorskip("torchaudio")
    x = torch.randn(2, 12345)
    for orig, new in [(24000, 16000), (44100, 24000), (8000, 24000)]:
        assert torch.equal(resample(x, orig, new), torchaudio.functional.resample(x, orig, new))


def test_resample_band_limited_tone():
    """A 1 kHz tone at 24 kHz lands on the 16 kHz tone away from the edges (the sinc's passband)."""
    t24, t16 = torch.arange(4800, dtype=torch.float64) / 24000, torch.arange(3200, dtype=torch.float64) / 16000
    out = resample(torch.sin(2 * math.pi * 1000 * t24), 24000, 16000)
    assert (out - torch.sin(2 * math.pi * 1000 * t16))[100:-100].abs().max() < 1e-3
