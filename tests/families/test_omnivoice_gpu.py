"""OmniVoice's device form (dit_core/gpu/omnivoice.py) against the host path (families/omnivoice.py, itself checked
against the omnivoice package in test_omnivoice.py): run on the CPU in float32, the same codes for a seed and the
same logits; in BF16 (and INT8 ConvRot linears), logits within BF16 bounds. The gpu-marked tests run the same on
CUDA: varlen FlashAttention against the masked form, the graphed step against the eager one, and how many codes a
BF16 run shares with the host's."""
import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from tiny_models import byte_tokenizer, random_qwen3

from dit_core.families.omnivoice import SPECIAL_TOKENS, WEIGHTS_FILE, OmniVoice, Speech, generate_codes, \
    prompt_rows, speech_codes
from dit_core.gpu.omnivoice import GpuOmniVoice, layout, row_bucket
from dit_core.sampling.omnivoice import Unmasking, knobs

C, MASK, VOCAB = 8, 1024, 1025
# test_omnivoice.py's tiny sizes (there against the package); here the host path is the reference, so the folder
# is written without the package (the device may lack it)
TINY = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=512)
# (text, target frames, lang, instruct, ref_text, ref_codes frames)
ITEMS = [("Hi [sigh] you.", 9, None, None, None, 0), ("Two,\n  ok 你好 x", 6, "en", "male", "Ref  said.", 5)]
SETTINGS = [Unmasking(steps=4), Unmasking(steps=12), Unmasking(steps=4, class_temperature=1.0, t_shift=0.5),
            Unmasking(steps=4, guidance=0.0, position_temperature=0.0, layer_penalty=2.0)]


@pytest.fixture(scope="module")
def tokenizer():
    """Byte-level BPE without merges (one token a byte) and OmniVoice's seven special tokens."""
    return byte_tokenizer(SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random OmniVoice model.safetensors in the package's names."""
    llm = random_qwen3(0, **TINY)
    g = torch.Generator().manual_seed(1)
    tensors = {f"llm.{k}": v.contiguous() for k, v in llm.state_dict().items()}
    tensors["audio_embeddings.weight"] = torch.randn(C * VOCAB, 64, generator=g)
    tensors["audio_heads.weight"] = torch.randn(C * VOCAB, 64, generator=g) / 8
    tensors["codebook_layer_offsets"] = torch.arange(C) * VOCAB
    d = tmp_path_factory.mktemp("omnivoice_gpu")
    save_file(tensors, str(d / WEIGHTS_FILE))
    return d


def ref_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, MASK, (C, frames), generator=torch.Generator().manual_seed(seed))


def prompts_of(tokenizer, items):
    return [prompt_rows(tokenizer, text, target, lang=lang, instruct=instruct, ref_text=ref_text,
                        ref_codes=ref_codes(n_ref, i) if n_ref else None)
            for i, (text, target, lang, instruct, ref_text, n_ref) in enumerate(items)]


@pytest.fixture(scope="module")
def host(folder):
    return OmniVoice.load(folder)


@pytest.fixture(scope="module")
def exact(host):
    """The device form on the CPU in float32: host linears, masked attention, no graphs."""
    return GpuOmniVoice.of(host, "cpu", torch.float32)


def revealed_codes(prompts, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.where(torch.rand(C, p.target, generator=g) < 0.4, torch.randint(0, MASK, (C, p.target), generator=g),
                        MASK) for p in prompts]


def with_references(items):
    return [(text, 40 + 3 * i, lang, instruct, ref_text, n_ref)
            for i, (text, _, lang, instruct, ref_text, n_ref) in enumerate(items)]


def test_layout_packs_segments_and_pads_to_buckets(tokenizer):
    """Rows: [prefix | target] and [target] per item, then padding to the row bucket as one more segment; target
    rows padded to the width bucket point at the last (padding) row."""
    prompts = prompts_of(tokenizer, ITEMS)
    lay = layout(prompts, True, MASK, "cpu")
    lengths = [p.ids.shape[1] + p.target for p in prompts]
    real = lengths[0] + prompts[0].target + lengths[1] + prompts[1].target
    assert lay.ids.shape == (C, row_bucket(real + 1)) and lay.offsets.tolist()[:5] == [
        0, lengths[0], lengths[0] + prompts[0].target, real - prompts[1].target, real]
    assert lay.offsets[-1] == lay.ids.shape[1] and lay.cond.shape == lay.uncond.shape == (2, 32)
    assert lay.cond[0, :9].tolist() == list(range(lengths[0] - 9, lengths[0])) and lay.cond[0, 9:].eq(
        lay.ids.shape[1] - 1).all()
    assert lay.valid.sum(1).tolist() == [9, 6] and lay.positions[lengths[0]] == 0
    assert layout(prompts, False, MASK, "cpu").uncond.shape == (2, 0)


@pytest.mark.parametrize("guided", [True, False])
def test_float32_logits_equal_the_host(host, exact, tokenizer, guided):
    """Both items' packed rows, some codes revealed: the device form's logits within 1e-5 of the host's."""
    prompts = prompts_of(tokenizer, with_references(ITEMS))
    codes = revealed_codes(prompts)
    for (c, u), (hc, hu) in zip(exact.target_logits(prompts, codes, guided), host.target_logits(prompts, codes, guided)):
        assert rel_err(c, hc) <= 1e-5
        assert (u is None) == (hu is None) and (u is None or rel_err(u, hu) <= 1e-5)


@pytest.mark.parametrize("u", SETTINGS)
def test_float32_codes_equal_the_host_loop(host, exact, tokenizer, u):
    """The loop over device tensors (padded items, counts as tensors, noise drawn ahead) gives the host loop's
    codes for a seed: with and without guidance, class and position noise, two items of unequal lengths."""
    prompts = prompts_of(tokenizer, ITEMS)
    ours = generate_codes(exact, prompts, u, torch.Generator().manual_seed(7))
    theirs = generate_codes(host, prompts, u, torch.Generator().manual_seed(7))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs)) and all((a != MASK).all() for a in ours)


def test_float32_chunked_speech_equals_the_host(host, exact, tokenizer):
    """speech_codes (long texts in chunks, the first chunk the later ones' reference) through the device form."""
    text = "Dr. Smith went home. It rained, and rained; then stopped!"
    items = [Speech(text), Speech("Short one.", ref_text="Ref said.", ref_codes=ref_codes(12, 0))]
    args = dict(u=Unmasking(steps=4), seed=5, chunk_seconds=1.5, threshold_seconds=2.0)
    ours, theirs = speech_codes(exact, tokenizer, items, **args), speech_codes(host, tokenizer, items, **args)
    assert [len(c) for c in ours] == [len(c) for c in theirs] and len(ours[0]) > 1
    assert all(torch.equal(a, b) for x, y in zip(ours, theirs) for a, b in zip(x, y))


def test_callback_sees_every_step(exact, tokenizer):
    seen = []
    generate_codes(exact, prompts_of(tokenizer, ITEMS[:1]), Unmasking(steps=3), torch.Generator().manual_seed(0),
                   callback=lambda i, n, codes: seen.append((i, n, int((codes[0] == MASK).sum()))))
    assert [(i, n) for i, n, _ in seen] == [(1, 3), (2, 3), (3, 3)] and seen[-1][2] == 0


@pytest.mark.parametrize("linears, bound", [("stored", 1e-2), ("int8", 2e-2)])  # measured 4.2e-3, 7.6e-3
def test_bf16_logits_within_bf16_bounds(folder, tokenizer, linears, bound):
    """BF16 tables and linears (split SwiGLU rows; INT8 ConvRot codes through the kernels' references), f32
    residual: within BF16 bounds of the host's f32 logits of the same stored linears."""
    host = OmniVoice.load(folder, linears)
    bf16 = GpuOmniVoice.of(host, "cpu", torch.bfloat16)
    assert all(w.qkv.gpu.int8 == w.down.gpu.int8 == (linears == "int8") for w in bf16.layers)  # groups 64, 16 kept
    prompts = prompts_of(tokenizer, with_references(ITEMS))
    codes = revealed_codes(prompts)
    for (c, u), (hc, hu) in zip(bf16.target_logits(prompts, codes, True), host.target_logits(prompts, codes, True)):
        assert rel_err(c, hc) <= bound and rel_err(u, hu) <= bound


def test_to_places_the_device_form(host):
    assert host.to("cpu") is host
    form = host.to("cpu", dtype=torch.bfloat16)
    assert isinstance(form, GpuOmniVoice) and form.text_embedding.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        GpuOmniVoice.of(host, "cpu", torch.float16)


# --- on CUDA ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_forms(host):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return {name: GpuOmniVoice.of(host, "cuda", torch.bfloat16, attention=name, graphs=graphs)
            for name, graphs in (("flash", True), ("masked", False))}


@pytest.mark.gpu
def test_cuda_flash_equals_masked_attention(cuda_forms, host, tokenizer):
    """Varlen FlashAttention over the segments vs SDPA with the segment mask: the same logits within BF16
    rounding; both within BF16 bounds of the host's f32."""
    prompts = prompts_of(tokenizer, with_references(ITEMS))
    codes = revealed_codes(prompts)
    flash, masked = (cuda_forms[n].target_logits(prompts, codes, True) for n in ("flash", "masked"))
    for (fc, fu), (mc, mu), (hc, hu) in zip(flash, masked, host.target_logits(prompts, codes, True)):
        assert rel_err(fc, mc) <= 1e-2 and rel_err(fu, mu) <= 1e-2
        assert rel_err(fc, hc) <= 2e-2 and rel_err(fu, hu) <= 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("u", SETTINGS[:3])
def test_cuda_graphed_loop_equals_eager_and_mostly_the_host(cuda_forms, host, tokenizer, u):
    """The graphed loop gives the eager loop's codes (same kernels; >= 95 % allows a cuBLAS algorithm that differs
    under capture); against the host's f32 codes BF16 flips some near ties, and each flip changes what later steps
    see: measured share of equal codes >= 50 %."""
    prompts = prompts_of(tokenizer, ITEMS)
    graphed = cuda_forms["flash"]
    eager = GpuOmniVoice.of(host, "cuda", torch.bfloat16, attention="flash", graphs=False)
    a = generate_codes(graphed, prompts, u, torch.Generator().manual_seed(11))
    b = generate_codes(eager, prompts, u, torch.Generator().manual_seed(11))
    same = sum(int((x == y).sum()) for x, y in zip(a, b)) / sum(x.numel() for x in b)
    assert same >= 0.95 and all((x != MASK).all() for x in a)
    ref = generate_codes(host, prompts, u, torch.Generator().manual_seed(11))
    share = sum(int((x == y).sum()) for x, y in zip(a, ref)) / sum(x.numel() for x in ref)
    print(f"graphed = eager: {same:.1%}; BF16 CUDA codes equal to the host's f32: {share:.1%} ({u})")
    assert share >= 0.5


@pytest.mark.gpu
def test_cuda_one_graph_per_bucket(cuda_forms, tokenizer):
    """Two texts of nearby lengths replay one captured graph (their rows and frames fall in one bucket); the
    callback sees every step in order (one step behind the queue) and the last codes unmasked."""
    form, seen = cuda_forms["flash"], []
    form.clear()
    for text in ("Hello there.", "Hello there!!"):
        prompts = prompts_of(tokenizer, [(text, 20, None, None, None, 0)])
        generate_codes(form, prompts, Unmasking(steps=4), torch.Generator().manual_seed(0),
                       callback=lambda i, n, codes: seen.append((i, n, int((codes[0] == MASK).sum()))))
    assert len(form.graphs.graphs) == 1 and next(iter(form.graphs.graphs.values())) is not None
    assert [(i, n) for i, n, _ in seen] == [(i, 4) for i in range(1, 5)] * 2 and seen[-1][2] == 0


@pytest.mark.gpu
def test_cuda_int8_linears(folder, tokenizer):
    """INT8 ConvRot linears on the kernels inside the graphed step: logits within 2e-2 of the host's f32 of the same
    INT8 weights (7.6e-3 on the kernels' references), and a whole graphed loop unmasks every code."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    host = OmniVoice.load(folder, "int8")
    form = GpuOmniVoice.of(host, "cuda", torch.bfloat16)
    prompts = prompts_of(tokenizer, with_references(ITEMS))
    codes = revealed_codes(prompts)
    for (c, u), (hc, hu) in zip(form.target_logits(prompts, codes, True), host.target_logits(prompts, codes, True)):
        assert rel_err(c, hc) <= 2e-2 and rel_err(u, hu) <= 2e-2
    out = generate_codes(form, prompts_of(tokenizer, ITEMS), Unmasking(steps=4), torch.Generator().manual_seed(2))
    assert all((c != MASK).all() for c in out)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["flash", "masked"])
def test_cuda_step_never_waits_for_the_host(cuda_forms, tokenizer, attention):
    """A whole step (forward, heads, guided log probabilities, reveal) with CUDA's sync debug mode raising on any
    wait for the device: nothing in it reads a value back (so a graph can hold it and the host runs ahead)."""
    form, u = cuda_forms[attention], Unmasking(steps=4)
    prompts = prompts_of(tokenizer, ITEMS)
    lay = layout(prompts, True, MASK, "cuda")
    codes = torch.full((2, C, lay.cond.shape[1]), MASK, dtype=torch.long, device="cuda")
    reveal = torch.tensor([5, 3], device="cuda")
    noise = torch.rand(codes.shape, device="cuda")
    k, empty = knobs(u, "cuda"), torch.empty(0, device="cuda")
    form._step(codes, *lay.tensors(), reveal, k, empty, noise)  # kernels compiled (and tuned) before the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = form._step(codes, *lay.tensors(), reveal, k, empty, noise)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert (out != MASK).sum(dim=(1, 2)).tolist() == [5, 3]
