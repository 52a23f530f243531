"""FLUX.3 Klein on the shared parallel block vs diffusers 0.42.1 Flux3Transformer2DModel, tiny and random."""

import pytest
import torch
from conftest import rel_err
from safetensors.torch import load_file, save_file
from tiny_models import FLUX3_TINY, flux3_bfl_layout, int8_convrot_state, random_flux3

from dit_core import load_family
from dit_core.families.flux3_klein import Flux3Klein, pack_latent, unpack_latent
from dit_core.sampling.schedules import klein_sigmas
from dit_core.weights import FirstBlocks, WeightsError

diffusers = pytest.importorskip("diffusers")
from diffusers.loaders.single_file_utils import convert_flux3_transformer_checkpoint_to_diffusers
from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel

C = FLUX3_TINY["in_channels"]
TEXT = FLUX3_TINY["joint_attention_dim"]


@pytest.fixture(scope="module")
def models():
    return {"flow_map": random_flux3(), "base": random_flux3(seed=2, flow_map=False)}


@pytest.fixture(scope="module")
def files(models, tmp_path_factory):
    d = tmp_path_factory.mktemp("flux3")
    for name, model in models.items():
        save_file(flux3_bfl_layout(model.state_dict()), d / f"flux3_{name}.safetensors")
    state = flux3_bfl_layout(models["flow_map"].state_dict())
    save_file({k: v.bfloat16() for k, v in flux3_bfl_layout(models["flow_map"].state_dict(),
                                                             "model.diffusion_model.").items()},
              d / "flux3_bf16.safetensors")
    int8 = int8_convrot_state(state, lambda key: "_blocks." in key)
    save_file(int8, d / "flux3_int8_convrot.safetensors")
    return d


def _ids(h, w, layer, scale=0.5):
    ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.tensor([layer]))
    ids = ids.float()
    ids[:, 1:3] *= scale
    return ids


def diffusers_out(model, latent, sigma, sigma_next, text, refs=()):
    """diffusers' velocity for packed latent [C, h, w] as the modular pipeline feeds it (section 4)."""
    c, h, w = latent.shape
    kw = {}
    if refs:
        ids = [_ids(r.shape[1], r.shape[2], -(1 + i)) for i, r in enumerate(refs)]
        kw = {"image_cond_hidden_states": torch.cat([r.flatten(1).T for r in refs])[None],
              "image_cond_ids": torch.cat(ids)}
    if model.config.flow_map:
        kw["target_timestep"] = torch.tensor([sigma_next])
    txt_ids = torch.zeros(text.shape[0], 4)
    txt_ids[:, 3] = torch.arange(text.shape[0])
    with torch.no_grad():
        out = model(hidden_states=latent.flatten(1).T[None], encoder_hidden_states=text[None],
                    timestep=torch.tensor([sigma]), img_ids=_ids(h, w, 0), txt_ids=txt_ids, return_dict=False,
                    **kw)[0]
    return out[0].T.reshape(c, h, w)


def test_mapping_round_trips_through_diffusers_converter(models):
    for model in models.values():
        converted = convert_flux3_transformer_checkpoint_to_diffusers(flux3_bfl_layout(model.state_dict()))
        fresh = Flux3Transformer2DModel(**{**FLUX3_TINY, "flow_map": model.config.flow_map})
        fresh.load_state_dict(converted, strict=True)
        for k, v in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[k], v), k


@pytest.mark.parametrize("variant", ["flow_map", "base"])
@pytest.mark.parametrize("size,text_len,ref_sizes", [
    ((4, 4), 9, ()),                    # text to image
    ((4, 6), 7, ((3, 5), (4, 4))),      # two reference images, non-square
    ((5, 3), 1, ()),                    # non-square, odd grid, one text row
    ((2, 8), 12, ((2, 2),)),
])
def test_forward_matches_diffusers(models, files, variant, size, text_len, ref_sizes):
    model = models[variant]
    ours = Flux3Klein.load(files / f"flux3_{variant}.safetensors")
    assert ours.flow_map == (variant == "flow_map")
    torch.manual_seed(1)
    latent, text = torch.randn(C, *size), torch.randn(text_len, TEXT)
    refs = [torch.randn(C, *s) for s in ref_sizes]
    for sigma, sigma_next in ((1.0, 0.9959), (0.5161, 0.0)):
        expected = diffusers_out(model, latent, sigma, sigma_next, text, refs)
        got = ours.output(latent, sigma, sigma_next, text, refs)
        assert rel_err(got, expected) <= 1e-5


def test_text_pad_rows_are_attended(models, files):
    """Text rows right-padded to a multiple of 80 (Flux3TextEncoderStep pad_multiple): the transformer has no
    mask, so the pad rows are real rows (section 3); ours equals diffusers with them, and they change the
    output."""
    ours, model = Flux3Klein.load(files / "flux3_flow_map.safetensors"), models["flow_map"]
    torch.manual_seed(4)
    latent, prompt = torch.randn(C, 4, 4), torch.randn(11, TEXT)
    padded = torch.cat([prompt, torch.randn(1, TEXT).expand(80 - 11, -1)])  # the pad token's row, repeated
    expected = diffusers_out(model, latent, 0.8, 0.7, padded)
    assert rel_err(ours.output(latent, 0.8, 0.7, padded), expected) <= 1e-5
    assert rel_err(ours.output(latent, 0.8, 0.7, prompt), expected) > 1e-3


def test_arch_read_from_file(files):
    a = Flux3Klein.load(files / "flux3_flow_map.safetensors").arch
    sizes = (a.hidden, a.heads, a.head, a.layers, a.refiner, a.ffn, a.latents, a.text_dim)
    assert sizes == (64, 2, 32, 2, 2, 192, 16, 48)
    constants = (a.rope_axes, a.rope_theta, a.norm, a.freq_dim, a.patch)
    assert constants == ((8, 8, 8, 8), 10000.0, "layer", 256, (1, 1))
    assert isinstance(load_family("flux3_klein", files / "flux3_base.safetensors"), Flux3Klein)


def test_a_stand_in_of_first_blocks_runs_a_dry_pass(files, monkeypatch):
    """What builds the first step's kernels beside a load (nodes/base.dit_loader): the file's first block of each
    stack (weights.FirstBlocks: a mode block each, one joint block), through one pass as the sampler makes it; then
    its joint block as the later ones run, with the norm statistics carried between blocks (the first takes none:
    on an H100 the sampler still built the product that writes them)."""
    from dit_core.block import Block
    path = files / "flux3_int8_convrot.safetensors"
    whole, stand_in = Flux3Klein.load(path), Flux3Klein.load(FirstBlocks(path))
    assert len(stand_in.blocks) == 1 and all(len(b) == 1 for b in stand_in.mode_blocks.values())
    assert len(whole.blocks) > 1
    joint, carried, parallel = next(iter(stand_in.blocks)), [], Block.parallel

    def recorded(block, *args, **kw):  # whether the joint block's calls carry statistics
        if block is joint:
            carried.append(kw.get("carry") is not None)
        return parallel(block, *args, **kw)
    monkeypatch.setattr(Block, "parallel", recorded)
    assert stand_in.dry_pass(pixels=64, text_rows=5).shape == (1, whole.arch.latents, 4, 4)
    assert carried == [False, True, True]


def test_prefixed_bf16_file_loads(models, files):
    ours = Flux3Klein.load(files / "flux3_bf16.safetensors")
    latent, text = torch.randn(C, 4, 4), torch.randn(6, TEXT)
    expected = diffusers_out(models["flow_map"], latent, 0.6, 0.4, text)
    assert rel_err(ours.output(latent, 0.6, 0.4, text), expected) < 2e-2


def test_int8_close_to_float(files):
    torch.manual_seed(5)
    latent, text, refs = torch.randn(C, 4, 6), torch.randn(10, TEXT), [torch.randn(C, 4, 4)]
    plain = Flux3Klein.load(files / "flux3_flow_map.safetensors")
    quantized = Flux3Klein.load(files / "flux3_flow_map.safetensors", linears="int8")
    stored = Flux3Klein.load(files / "flux3_int8_convrot.safetensors")
    blocks = stored.blocks + sum(stored.mode_blocks.values(), ())
    assert all(b.w[i].quantized for b in blocks for i in range(4))
    ref = plain.output(latent, 0.75, 0.5, text, refs)
    assert 1e-4 < rel_err(stored.output(latent, 0.75, 0.5, text, refs), ref) <= 3e-2
    # The file's q, k, v (and mlp_in halves) quantized row by row, then fused at load, equal the fused linears
    # quantized (row-wise scales).
    int8_out = stored.output(latent, 0.75, 0.5, text, refs)
    assert torch.equal(quantized.output(latent, 0.75, 0.5, text, refs), int8_out)
    back = Flux3Klein.load(files / "flux3_int8_convrot.safetensors", linears="bf16")
    assert not back.blocks[0].w[0].quantized
    assert rel_err(back.output(latent, 0.75, 0.5, text, refs), ref) <= 3e-2


def test_pack_latent_is_channel_major():
    z = torch.randn(32, 6, 10)
    x = pack_latent(z)
    assert x.shape == (128, 3, 5)
    c, ph, pw, i, j = 7, 1, 0, 2, 3
    assert x[c * 4 + ph * 2 + pw, i, j] == z[c, 2 * i + ph, 2 * j + pw]
    assert torch.equal(unpack_latent(x), z)


def test_denoised_is_x_minus_sigma_v(files):
    ours = Flux3Klein.load(files / "flux3_flow_map.safetensors")
    x, cond = torch.randn(2, C, 4, 4), torch.randn(1, 5, TEXT)
    x0 = ours.denoised(x, 0.3, 0.1, cond)
    assert torch.allclose(x0[1], x[1] - 0.3 * ours.output(x[1], 0.3, 0.1, cond[0]))


def test_lora_in_diffusers_names_merges(files, tmp_path):
    state = load_file(files / "flux3_base.safetensors")
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g) * 0.05
    a_q, b_q, a_m, b_m = r(4, 64), r(64, 4), r(4, 64), r(384, 4)
    lora = {  # diffusers' names (PEFT), BFL's names (kohya pairs)
        "transformer.single_transformer_blocks.1.attn.to_k.lora_A.weight": a_q,
        "transformer.single_transformer_blocks.1.attn.to_k.lora_B.weight": b_q,
        "diffusion_model.content_mode_blocks.image.0.mlp_in.lora_down.weight": a_m,
        "diffusion_model.content_mode_blocks.image.0.mlp_in.lora_up.weight": b_m}
    save_file(lora, tmp_path / "lora.safetensors")
    merged = dict(state)
    for key, down, up in (("single_blocks.1.k_proj.weight", a_q, b_q),
                          ("content_mode_blocks.image.0.mlp_in.weight", a_m, b_m)):
        merged[key] = state[key] + 0.7 * up @ down
    save_file(merged, tmp_path / "merged.safetensors")
    latent, text = torch.randn(C, 4, 4), torch.randn(6, TEXT)
    base = files / "flux3_base.safetensors"
    with_lora = Flux3Klein.load(base, loras=((tmp_path / "lora.safetensors", 0.7),))
    oracle = Flux3Klein.load(tmp_path / "merged.safetensors").output(latent, 0.5, None, text)
    assert rel_err(with_lora.output(latent, 0.5, None, text), oracle) <= 1e-6
    assert rel_err(Flux3Klein.load(base).output(latent, 0.5, None, text), oracle) > 1e-3


def test_klein_sigmas_match_reference_table():
    # reference/families/flux3_klein.md section 7 (4 decimals).
    at16 = [1, .9959, .9912, .9858, .9796, .9724, .9639, .9536, .9412, .9256, .9057, .8791, .8421, .7869,
            .6957, .5161, 0]
    at693 = [1, .9905, .9798, .9678, .9541, .9384, .9203, .8991, .8739, .8435, .8061, .7590, .6979, .6153,
             .4975, .3160, 0]
    assert torch.allclose(klein_sigmas(), torch.tensor(at16), atol=6e-5, rtol=0)
    assert torch.allclose(klein_sigmas(16, 6.93), torch.tensor(at693), atol=6e-5, rtol=0)
    assert klein_sigmas(1).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="steps"):
        klein_sigmas(0)


def test_bad_inputs_name_what_is_wrong(files, tmp_path):
    ours = Flux3Klein.load(files / "flux3_flow_map.safetensors")
    text = torch.randn(3, TEXT)
    with pytest.raises(ValueError, match="patch grid"):
        pack_latent(torch.randn(4, 7, 8))
    with pytest.raises(ValueError, match="latent_image must be"):
        ours.output(torch.randn(C // 4, 8, 8), 1.0, 0.9, text)
    with pytest.raises(ValueError, match="conditioning must be"):
        ours.output(torch.randn(C, 4, 4), 1.0, 0.9, torch.randn(3, 64))
    with pytest.raises(ValueError, match="sigma_next"):
        ours.output(torch.randn(C, 4, 4), 1.0, None, text)
    with pytest.raises(ValueError, match=r"references\[1\] must be"):
        ours.output(torch.randn(C, 4, 4), 1.0, 0.9, text, [torch.randn(C, 2, 2), torch.randn(C, 2)])
    with pytest.raises(ValueError, match="linears"):
        Flux3Klein.load(files / "flux3_base.safetensors", linears="fp4")
    save_file({"decoder.conv_in.weight": torch.zeros(4, 16, 3, 3)}, tmp_path / "flux_vae.safetensors")
    with pytest.raises(WeightsError, match="flux_vae.safetensors: not a FLUX.3"):
        Flux3Klein.load(tmp_path / "flux_vae.safetensors")
    state = load_file(files / "flux3_base.safetensors")
    del state["single_blocks.1.v_proj.weight"]
    save_file(state, tmp_path / "broken.safetensors")
    missing = "broken.safetensors: tensor 'single_blocks.1.v_proj.weight' is missing"
    with pytest.raises(WeightsError, match=missing):
        Flux3Klein.load(tmp_path / "broken.safetensors")
