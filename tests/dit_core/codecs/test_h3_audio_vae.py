"""dit_core/codecs/h3_audio_vae.py (and bigvgan.py) against diffusers 0.42.1 AutoencoderKLMiniMaxH3Audio: a tiny
random model saved in diffusers' (= the original checkpoint's) names, weight-normed and folded; decoder and encoder."""
import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file

from dit_core.codecs import bigvgan
from dit_core.codecs.h3_audio_vae import RATES, AudioDecoder, AudioEncoder
from dit_core.families.minimax_h3 import audio_to_rows
from dit_core.weights import TensorSource, WeightsError

pytest.importorskip("diffusers")
from diffusers.models.autoencoders import autoencoder_kl_minimax_h3_audio as ref

# Two stages (an odd rate with kernel 9, then 2 with 4: both of H3's kinds), two AMP kernels with unequal dilation
# counts, hop 10; the encoder's strides 2 and 5 (H3's two kinds: even and odd padding) also make hop 10.
TINY = {"encoder_dim": 4, "encoder_rates": (2, 5), "latent_dim": 16, "latent_channels": 8, "num_attention_heads": 2,
        "decoder_dim": 16, "decoder_rates": (5, 2), "decoder_kernel_sizes": (9, 4), "resblock_kernel_sizes": (3, 5),
        "resblock_dilation_sizes": ((1, 3), (1, 2))}
RATES_TINY, DIL_TINY = TINY["decoder_rates"], TINY["resblock_dilation_sizes"]
T = 12


def tiny_vae() -> ref.AutoencoderKLMiniMaxH3Audio:
    torch.manual_seed(0)
    vae = ref.AutoencoderKLMiniMaxH3Audio(**TINY).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in vae.named_parameters():  # every parameter random (SnakeBeta's default 0 would hide alpha/beta)
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if "weight_g" in name or "act." in name else 1.0))
    return vae


def folded() -> dict[str, torch.Tensor]:
    """The same weights with weight norm removed by torch itself, and no filter buffers (a file that folds them)."""
    plain = tiny_vae()  # rebuilt, not deep-copied: weight norm's computed weight is not a leaf after a forward
    for m in plain.modules():
        if hasattr(m, "weight_g"):
            torch.nn.utils.remove_weight_norm(m)
    return {k: v for k, v in plain.state_dict().items() if not k.endswith(".filter")}


@pytest.fixture(scope="module")
def vae():
    return tiny_vae()


@pytest.fixture(scope="module")
def latents():
    return torch.randn(2, TINY["latent_channels"], T, generator=torch.Generator().manual_seed(2))


def save(state: dict, path, prefix: str = "") -> None:
    save_file({prefix + k: v.contiguous() for k, v in state.items()}, path)


# --- the anti-aliased activation, bit for bit ------------------------------------------------------------

@pytest.mark.parametrize("cutoff,half_width,taps", [(0.25, 0.3, 12), (0.5 / 3, 0.2, 12), (0.25, 0.3, 11),
                                                    (0.1, 0.05, 6)])
def test_filter_is_diffusers_bit_for_bit(cutoff, half_width, taps):
    assert torch.equal(bigvgan.kaiser_sinc_filter(cutoff, half_width, taps),
                       ref.kaiser_sinc_filter1d(cutoff, half_width, taps))


def test_activation_is_diffusers_bit_for_bit():
    c = 6
    act = ref.MiniMaxH3AudioActivation1d(ref.MiniMaxH3AudioSnakeBeta(c))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        act.act.alpha.copy_(torch.randn(c, generator=g))
        act.act.beta.copy_(torch.randn(c, generator=g))
    x = torch.randn(3, c, 37, generator=g)
    filt = bigvgan.activation_filter()
    assert torch.equal(filt, act.upsample.filter) and torch.equal(filt, act.downsample.lowpass.filter)
    with torch.no_grad():
        assert torch.equal(bigvgan.upsample(x, filt), act.upsample(x))
        assert torch.equal(bigvgan.downsample(x, filt), act.downsample(x))
        w = {"a.upsample.filter": filt, "a.downsample.lowpass.filter": filt, "a.act.alpha": act.act.alpha,
             "a.act.beta": act.act.beta}
        assert torch.equal(bigvgan.activation(x, w, "a"), act(x))


# --- decode ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["weight_norm", "folded"])
def test_decode_matches_diffusers(vae, latents, layout, tmp_path):
    path = tmp_path / "minimax_h3_audio_vae_fp32.safetensors"
    if layout == "weight_norm":
        save(vae.state_dict(), path)  # diffusers' names = the original checkpoint's (weight_g/_v, filter buffers)
    else:
        save(folded(), path, prefix="vae.")
    dec = AudioDecoder.load(path, rates=RATES_TINY, dilations=DIL_TINY)
    assert dec.shape.channels == (16, 8, 4) and dec.shape.hop == 10 and dec.latent_channels == 8
    with torch.no_grad():
        want = vae.decode(latents).sample
    got = dec.decode(latents)
    assert got.shape == want.shape == (2, 1, T * 10)
    assert (want.abs() < 1).float().mean() > 0.5  # mostly inside the clamp: the comparison sees the network
    assert rel_err(got, want) <= 1e-4


def test_audio_dict_from_stereo_latents(vae, latents, tmp_path):
    save(vae.state_dict(), tmp_path / "a.safetensors")
    dec = AudioDecoder.load(tmp_path / "a.safetensors", rates=RATES_TINY, dilations=DIL_TINY)
    with torch.no_grad():
        want = vae.decode(latents).sample  # the pipeline's stereo: left and right as batch items
    out = dec.audio(latents)
    assert set(out) == {"waveform", "sample_rate"} and out["sample_rate"] == 32000
    assert out["waveform"].shape == (1, 2, T * 10) and out["waveform"].dtype == torch.float32
    assert rel_err(out["waveform"][0], want[:, 0]) <= 1e-4
    two = dec.audio(torch.stack([latents, latents.flip(0)]))["waveform"]  # [B=2, 2, C, T]: per-item channels kept
    assert two.shape == (2, 2, T * 10)
    assert rel_err(two[1], want[:, 0].flip(0)) <= 1e-4
    with pytest.raises(ValueError, match="stereo"):
        dec.audio(latents[:1, None])


def test_latent_stats_from_the_file(vae, tmp_path):
    c = TINY["latent_channels"]
    mean, std = torch.linspace(-1, 1, c), torch.linspace(0.5, 2, c)
    save({**vae.state_dict(), "latents_mean": mean, "latents_std": std}, tmp_path / "a.safetensors")
    dec = AudioDecoder.load(tmp_path / "a.safetensors", rates=RATES_TINY, dilations=DIL_TINY)
    n = torch.randn(2, c, 5)
    assert torch.allclose(dec.raw_latents(n), n * std.view(1, -1, 1) + mean.view(1, -1, 1))
    save(vae.state_dict(), tmp_path / "b.safetensors")
    with pytest.raises(ValueError, match="latents_mean"):
        AudioDecoder.load(tmp_path / "b.safetensors", rates=RATES_TINY, dilations=DIL_TINY).raw_latents(n)


# --- the file --------------------------------------------------------------------------------------------

def test_errors_name_the_file(vae, tmp_path):
    save({"decoder.conv_in.weight": torch.zeros(4, 4, 3, 3)}, tmp_path / "ae.safetensors")
    with pytest.raises(WeightsError, match=r"ae\.safetensors: no 'dec_in_proj\.weight'.*MiniMax H3 audio VAE"):
        AudioDecoder.load(tmp_path / "ae.safetensors")
    save(vae.state_dict(), tmp_path / "a.safetensors")
    with pytest.raises(WeightsError, match=r"a\.safetensors: 2 upsampling stages"):
        AudioDecoder.load(tmp_path / "a.safetensors")  # H3's seven rates on a two-stage file
    state = {k: v for k, v in vae.state_dict().items() if "resblocks.1.convs2.0" not in k}
    save(state, tmp_path / "c.safetensors")
    with pytest.raises(WeightsError, match=r"c\.safetensors: tensor 'decoder\.resblocks\.1\.convs2\.0\.weight'"):
        AudioDecoder.load(tmp_path / "c.safetensors", rates=RATES_TINY, dilations=DIL_TINY)


def test_real_size_layout_reads_with_h3_defaults():
    """The released sizes (diffusers' defaults), shapes only: H3's rates and dilations fit the file's counts."""
    with torch.device("meta"):
        real = ref.AutoencoderKLMiniMaxH3Audio()
    src = TensorSource({k: v for k, v in real.state_dict().items() if k.startswith(("dec_in_proj", "decoder."))})
    shape = bigvgan.read_shape(src, "decoder.", RATES, ((1, 3, 5),) * 3, WeightsError)
    assert shape.in_channels == 2048 and shape.channels[0] == 1024 and shape.channels[-1] == 8
    assert shape.kernels == (9, 9, 4, 4, 4, 4, 4) and shape.resblock_kernels == (3, 7, 11) and shape.hop == 800
    names = {k[len("decoder."):] for k in src.keys() if k.startswith("decoder.")}  # noqa: SIM118
    folded_names = {k.replace(".weight_v", ".weight") for k in names if not k.endswith((".weight_g", ".filter"))}
    assert folded_names == set(bigvgan.expected(shape))


# --- encode ----------------------------------------------------------------------------------------------

def waveform(b, channels, samples, seed=5):
    return 0.5 * torch.randn(b, channels, samples, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layout", ["weight_norm", "folded"])
def test_encoder_matches_diffusers(vae, layout, tmp_path):
    path = tmp_path / "minimax_h3_audio_vae_fp32.safetensors"
    save(vae.state_dict() if layout == "weight_norm" else folded(), path, prefix="" if layout == "weight_norm"
         else "vae.")
    enc = AudioEncoder.load(path, heads=TINY["num_attention_heads"])
    assert enc.strides == TINY["encoder_rates"] and enc.hop == 10 and enc.latent_channels == 8
    wave = waveform(2, 1, 10 * T + 3)  # not whole hops: right-padded to 13 latents
    with torch.no_grad():
        want = vae.encode(wave).latent_dist.mode()
    got = enc.forward(wave)
    assert got.shape == want.shape == (2, 8, T + 1)
    assert rel_err(got, want) <= 1e-4


def test_encode_gives_the_pipelines_audio_rows(vae, tmp_path):
    """encode(stereo AUDIO waveform) is the normalized AV audio latent; its packed rows are diffusers' reference
    encoder's audio_condition_latents (MiniMaxH3Ref2VAReferenceEncoderStep: the posterior mean, channel-major)."""
    c = TINY["latent_channels"]
    mean, std = torch.linspace(-1, 1, c), torch.linspace(0.5, 2, c)
    save({**vae.state_dict(), "latents_mean": mean, "latents_std": std}, tmp_path / "a.safetensors")
    enc = AudioEncoder.load(tmp_path / "a.safetensors", heads=TINY["num_attention_heads"])
    stereo = waveform(1, 2, 10 * T)
    with torch.no_grad():
        raw = vae.encode(stereo[0][:, None]).latent_dist.mode().transpose(1, 2)  # [2, T, C]
    want = ((raw - mean) / std).reshape(-1, c)
    got = enc.encode(stereo, 32000)
    assert got.shape == (1, c, 2, T)
    assert rel_err(audio_to_rows(got), want) <= 1e-4
    mono = enc.encode(stereo[:, :1], 32000)  # a mono waveform is repeated to both channels, as diffusers does
    assert torch.equal(mono[:, :, 0], mono[:, :, 1]) and torch.equal(mono[:, :, 0], got[:, :, 0])
    with pytest.raises(ValueError, match="44100 Hz"):
        enc.encode(stereo, 44100)
    save(vae.state_dict(), tmp_path / "b.safetensors")
    with pytest.raises(ValueError, match="latents_mean"):
        AudioEncoder.load(tmp_path / "b.safetensors", heads=TINY["num_attention_heads"]).encode(stereo, 32000)


def test_encoder_file_errors(vae, tmp_path):
    decoder_only = {k: v for k, v in vae.state_dict().items() if k.startswith(("decoder.", "dec_in_proj."))}
    save(decoder_only, tmp_path / "dec.safetensors")
    with pytest.raises(WeightsError, match=r"dec\.safetensors: no 'mean_proj\.weight'.*DAC"):
        AudioEncoder.load(tmp_path / "dec.safetensors")
    save(vae.state_dict(), tmp_path / "a.safetensors")
    with pytest.raises(WeightsError, match="width 16 does not split into 3 heads"):
        AudioEncoder.load(tmp_path / "a.safetensors", heads=3)
    state = {k: v for k, v in vae.state_dict().items() if k != "pre_block.mlp.w1.bias"}
    save(state, tmp_path / "c.safetensors")
    with pytest.raises(WeightsError, match=r"tensor 'pre_block\.mlp\.w1\.bias' is missing"):
        AudioEncoder.load(tmp_path / "c.safetensors", heads=2)


def test_real_size_encoder_reads_with_h3_defaults():
    """The released sizes (diffusers' defaults), shapes only: strides 2, 4, 4, 5, 5 from the kernels, hop 800."""
    with torch.device("meta"):
        real = ref.AutoencoderKLMiniMaxH3Audio()
    enc = AudioEncoder.load(TensorSource(dict(real.state_dict())))
    assert enc.strides == (2, 4, 4, 5, 5) and enc.hop == 800 and enc.latent_channels == 32
    assert enc.w["encoder.block.7.weight"].shape == (2048, 2048, 3)
