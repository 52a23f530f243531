"""dit_core/gpu/text_decoder.py: a Qwen3 / Qwen3-VL text model's layers on the engine's kernels, against transformers'
f32 forward (the reference), on the CPU where the kernels run their references (pytest -m gpu: on CUDA)."""
import pytest
import torch
from conftest import COMFYUI_TREE, interpreted_only, rel_err
from safetensors.torch import save_file
from tiny_models import int8_convrot_state, qwen3_comfy_layout, qwen3_vl_layout, random_qwen3, random_qwen3_vl

from dit_core.gpu.text_decoder import FusedDecoder
from dit_core.text.qwen3 import Qwen3TextEncoder
from dit_core.text.loading import STAND_IN_VOCAB
from dit_core.text.qwen3_vl import LAYERS, PAD_POSITION, Qwen3VLTextEncoder

TOKENIZER_DIR = COMFYUI_TREE / "comfy" / "text_encoders" / "qwen25_tokenizer"
PROMPT = "A photo of a cat sitting on a windowsill at golden hour, 35mm, shallow depth of field."
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """(the f32 reference model, its file, its INT8 ConvRot file)."""
    root, model = tmp_path_factory.mktemp("text_decoder"), random_qwen3()
    paths = root / "qwen3.safetensors", root / "qwen3_int8.safetensors"
    sd = qwen3_comfy_layout(model)
    save_file(sd, str(paths[0]))
    save_file(int8_convrot_state(sd, lambda k: k.startswith("model.layers.") and "_proj" in k), str(paths[1]))
    return model, *paths


def fused_of(encoder) -> FusedDecoder:
    fused = FusedDecoder.of(encoder.model, anywhere=True)
    assert fused is not None
    return fused


@pytest.mark.parametrize("device", DEVICES)
def test_qwen3_features_near_the_f32_reference(qwen3, device):
    """Z-Image's features (the residual stream after all but the last layer): within BF16's error of the f32
    model, no farther than transformers' own BF16 forward of the same weights; that forward is unchanged once
    the fused form's stacks hold the weights (views, no second copy)."""
    reference, path, _ = qwen3
    encoder = Qwen3TextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, device=device, int8_linears=False)
    ids = encoder.tokenize(PROMPT)
    with torch.no_grad():
        want = reference(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-2]
        theirs = encoder.model(input_ids=torch.tensor([ids], device=device)).last_hidden_state.float().cpu()
    fused = fused_of(encoder)
    last = len(encoder.model.layers)
    got = fused.states(torch.tensor([ids], device=device), (last,))[last].cpu()
    assert got.shape == want.shape and got.dtype == torch.float32
    assert rel_err(got, want) <= max(1e-2, 1.2 * rel_err(theirs, want))
    with torch.no_grad():
        again = encoder.model(input_ids=torch.tensor([ids], device=device)).last_hidden_state.float().cpu()
    assert torch.equal(again, theirs)
    layer = encoder.model.layers[0].self_attn
    assert layer.k_proj.weight.data_ptr() == layer.q_proj.weight.data_ptr() + layer.q_proj.weight.numel() * 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("int8", [False, True])
def test_kernels_built_ahead_leave_the_features(qwen3, device, int8):
    """build_ahead's dry encode runs through (nothing stops it) and the encode after it gives the features of one
    with nothing built ahead; off a Hopper GPU it refuses and the kernels build as the encode runs."""
    _, path, int8_path = qwen3
    encoder = Qwen3TextEncoder.load(int8_path if int8 else path, TOKENIZER_DIR, dtype=torch.bfloat16, device=device,
                                    int8_linears=int8)
    ids = torch.tensor([encoder.tokenize(PROMPT)], device=device)
    fused, last = fused_of(encoder), len(encoder.model.layers)
    want = fused.states(ids, (last,))[last]
    built = fused.build_ahead()
    assert built.stopped is None
    if device == "cpu":
        assert built.kernels == 0 and built.refused
    assert torch.equal(fused.states(ids, (last,))[last], want)


@pytest.mark.parametrize("int8", [False, True])
def test_a_stand_in_is_the_first_layer_and_a_few_rows(qwen3, int8):
    """What builds the fused layers' kernels beside a load (TextEncoder.kernels_built_beside): the file's first layer
    as the whole model loads it, an embedding of STAND_IN_VOCAB rows; on the host no build starts."""
    _, path, int8_path = qwen3
    file = int8_path if int8 else path
    stand_in = Qwen3TextEncoder.load_model(file, torch.bfloat16, "cpu", int8_linears=int8, stand_in=True)
    whole = Qwen3TextEncoder.load_model(file, torch.bfloat16, "cpu", int8_linears=int8)
    assert len(stand_in.layers) == 1 and stand_in.embed_tokens.weight.shape[0] == STAND_IN_VOCAB
    assert stand_in.building is None and whole.building is None
    for (name, got), want in zip(stand_in.layers[0].state_dict().items(), whole.layers[0].state_dict().values()):
        assert torch.equal(got, want), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("int8", [False, True])
def test_kernels_built_beside_the_load_leave_the_features(qwen3, int8):
    """On the GPU the load starts the stand-in's build; the first encode joins it and gives the features of an
    encoder whose kernels were built as it ran."""
    _, path, int8_path = qwen3
    encoder = Qwen3TextEncoder.load(int8_path if int8 else path, TOKENIZER_DIR, dtype=torch.bfloat16,
                                    device="cuda", int8_linears=int8)
    assert encoder.model.building is not None
    ids = torch.tensor([encoder.tokenize(PROMPT)], device="cuda")
    last = len(encoder.model.layers)
    got = encoder.fused_states(ids, (last,))[last]
    assert encoder.model.building is None
    assert torch.equal(got, fused_of(encoder).states(ids, (last,))[last])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_stand_ins_builds_leave_a_real_prompt_nothing_to_build(qwen3, fresh_kernel_caches):
    """The kernels the stand-in's dry encode (16 rows) builds beside the load are every kernel a prompt's encode
    launches (its own length, the taps a family reads): a new machine's first Z-Image encode took 1.71 s in the H100
    server against 0.08 after a restart."""
    from dit_core.gpu.builds import build_ahead
    _, path, _ = qwen3
    encoder = Qwen3TextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, device="cuda", int8_linears=False)
    building = encoder.model.building
    building.join()
    assert building.built.kernels
    fused = fused_of(encoder)
    ids = torch.tensor([encoder.tokenize(PROMPT + " and a little more")], device="cuda")
    last = len(encoder.model.layers)
    after = build_ahead(lambda: fused.states(ids, (last - 1, last)), torch.device("cuda"))
    assert after.kernels == 0 and after.stopped is None, after


@pytest.mark.parametrize("device", DEVICES)
def test_int8_linears_stack_with_their_scales(qwen3, device):
    """INT8 ConvRot linears kept INT8 (Int8Linear): the stacked products equal transformers' forward through the
    same Int8Linear modules within BF16's error (the residual stream's precision differs)."""
    _, _, path = qwen3
    encoder = Qwen3TextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, device=device, int8_linears=True)
    ids = torch.tensor([encoder.tokenize(PROMPT)], device=device)
    with torch.no_grad():
        theirs = encoder.model(input_ids=ids).last_hidden_state.float()
    last = len(encoder.model.layers)
    assert rel_err(fused_of(encoder).states(ids, (last,))[last], theirs) <= 2e-2


def test_klein_taps_with_pads_masked(tmp_path):
    """Qwen3-VL (mRoPE) with FLUX.3 Klein's padding: pads unseen as keys, at PAD_POSITION; several taps, the
    embeddings' among them; check() before each layer; hidden_states[k] as transformers counts them, each no farther
    from the f32 reference than transformers' BF16 forward."""
    reference = random_qwen3_vl()
    path = tmp_path / "qwen3vl.safetensors"
    save_file(qwen3_vl_layout(reference, "hf"), str(path))
    encoder = Qwen3VLTextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, int8_linears=False)
    padded, mask = encoder.tokenizer.pad(encoder.tokenize(PROMPT))
    mask = torch.tensor([mask])
    assert not mask.all()
    positions = torch.arange(len(padded))[None].masked_fill(mask == 0, PAD_POSITION)
    ids = torch.tensor([padded])
    with torch.no_grad():
        want = reference.model.language_model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                              output_hidden_states=True).hidden_states
    theirs = encoder.hidden_states(padded, mask, positions)  # transformers' BF16 forward (no fused form on the CPU)
    calls = []
    got = fused_of(encoder).states(ids, {0, *LAYERS}, positions, mask, check=lambda: calls.append(1))
    assert len(calls) == max(LAYERS)
    assert torch.equal(got[0], encoder.model.embed_tokens(ids).float())
    for k, t in zip(LAYERS, theirs):
        assert rel_err(got[k], want[k]) <= max(1e-2, 1.2 * rel_err(t.float(), want[k])), k


@pytest.fixture
def eager_graphs(monkeypatch):
    """step_graph.GraphedStep as its step run eagerly (the CPU has no CUDA graphs): replayed()'s own work, the pads
    and the cut, alone."""
    import dit_core.gpu.step_graph as step_graph
    monkeypatch.setattr(step_graph, "GraphedStep", lambda step, **_: lambda *inputs, **fixed: step(*inputs, **fixed))


@pytest.mark.parametrize("device", DEVICES)
def test_a_replayed_encode_pads_rows_the_prompt_never_sees(qwen3, device, request):
    """FusedDecoder.replayed: the prompt's ids padded to REPLAY_ROWS behind it (causal: no row sees a later one), its
    taps cut back to the prompt's rows: the features of states() on the prompt alone, within the products' sums at
    another row count; on a GPU from a CUDA graph, a second encode replaying it bit for bit."""
    if device == "cpu":
        request.getfixturevalue("eager_graphs")
    _, path, _ = qwen3
    encoder = Qwen3TextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, device=device, int8_linears=False)
    ids = torch.tensor([encoder.tokenize(PROMPT)], device=device)
    fused, last = fused_of(encoder), len(encoder.model.layers)
    want = fused.states(ids, (0, last))
    got = fused.replayed(ids, (last, 0))
    assert set(got) == {0, last} and got[last].shape == want[last].shape
    assert torch.equal(got[0], want[0]) and rel_err(got[last], want[last]) <= 2e-3
    assert torch.equal(fused.replayed(ids, (0, last))[last], got[last])
    if device == "cuda":  # the encoder's own path (fused_states; on the CPU its transformers model runs)
        encoder.replayed_encodes = True
        assert torch.equal(encoder.encode(PROMPT), got[last])


@pytest.mark.parametrize("device", DEVICES)
def test_a_replayed_encode_keeps_klein_pads_masked(tmp_path, device, request):
    """Qwen3-VL with FLUX.3 Klein's masked pads and mRoPE positions, replayed: the pads grown to REPLAY_ROWS are
    masked too, the rows and taps those of states(), all of one pass through the layers (a replay ran a pass a tap
    before: eight times Klein's GPU work, H100)."""
    if device == "cpu":
        request.getfixturevalue("eager_graphs")
    reference = random_qwen3_vl()
    path = tmp_path / "qwen3vl.safetensors"
    save_file(qwen3_vl_layout(reference, "hf"), str(path))
    encoder = Qwen3VLTextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, device=device, int8_linears=False)
    padded, mask = encoder.tokenizer.pad(encoder.tokenize(PROMPT)[:5])
    ids, mask = torch.tensor([padded[:37]], device=device), torch.tensor([mask[:37]], device=device)
    positions = torch.arange(37, device=device)[None].masked_fill(mask == 0, PAD_POSITION)
    fused = fused_of(encoder)
    want = fused.states(ids, set(LAYERS), positions, mask)
    passes, states = [], fused.states
    fused.states = lambda *args, **kwargs: passes.append(1) or states(*args, **kwargs)
    got = fused.replayed(ids, set(LAYERS), positions, mask)
    assert len(passes) == 1  # (a length's first encode runs eagerly on a GPU too)
    for k in LAYERS:
        assert got[k].shape == want[k].shape and rel_err(got[k], want[k]) <= 2e-3, k


def test_clearing_an_encoder_drops_its_replay_graphs(qwen3):
    """TextEncoder.clear (the nodes' LOADED companion of a text encoder on a GPU, called before its memory moves or
    goes): its replayed encodes' graphs cleared, and nothing to do before any."""
    _, path, _ = qwen3
    encoder = Qwen3TextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, int8_linears=False)
    encoder.clear()  # no fused layers made yet

    class Graphs:
        cleared = 0

        def clear(self):
            self.cleared += 1
    encoder._fused = fused_of(encoder)
    encoder.clear()  # no graphs yet
    encoder._fused.graphed = graphs = Graphs()
    encoder.clear()
    assert graphs.cleared == 1


def test_mrope_positions_reach_the_rotary_per_axis(tmp_path, monkeypatch):
    """Text rows' positions [1, L] go to a Qwen3-VL model's rotary as [3, 1, L], as its forward gives them: the
    rotary of transformers 5.17 (the GPU image's) indexes three axes and failed on [1, L] (FLUX.3 Klein and Krea 2
    fell back to transformers' layers in a real server, 2026-12-06)."""
    path = tmp_path / "qwen3vl.safetensors"
    save_file(qwen3_vl_layout(random_qwen3_vl(), "hf"), str(path))
    encoder = Qwen3VLTextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, int8_linears=False)
    ids = torch.tensor([encoder.tokenize(PROMPT)])
    fused, last = fused_of(encoder), len(encoder.model.layers)
    want = fused.states(ids, (last,))[last]
    rotary = type(encoder.model.rotary_emb).forward

    def three_axes_only(module, x, positions):
        assert positions.dim() == 3 and positions.shape[0] == 3, tuple(positions.shape)
        return rotary(module, x, positions)
    monkeypatch.setattr(type(encoder.model.rotary_emb), "forward", three_axes_only)
    assert torch.equal(fused.states(ids, (last,))[last], want)


def test_only_bf16_models_on_a_gpu_take_it(qwen3):
    """None on the CPU unless asked (the f32 host path is the reference), and for an f32 model anywhere."""
    _, path, _ = qwen3
    bf16 = Qwen3TextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, int8_linears=False)
    assert FusedDecoder.of(bf16.model) is None and bf16.fused() is None
    f32 = Qwen3TextEncoder.load(path, TOKENIZER_DIR)
    assert FusedDecoder.of(f32.model, anywhere=True) is None


def test_a_failing_fused_form_falls_back_and_a_cancel_passes(qwen3, monkeypatch, caplog):
    """An encoder whose fused layers fail (a kernel the GPU cannot build) encodes through transformers' layers from
    then on, logged; a cancel raised by check() within them is the caller's, not a failure."""
    _, path, _ = qwen3
    encoder = Qwen3TextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, int8_linears=False)
    want = encoder.encode(PROMPT)  # transformers' layers: no fused form on the CPU

    class Broken:
        def states(self, *args):
            raise RuntimeError("no kernel for this GPU")

    monkeypatch.setattr(encoder, "fused", lambda: Broken() if encoder.fused_layers else None)
    assert torch.equal(encoder.encode(PROMPT), want) and not encoder.fused_layers
    assert "fused layers failed (RuntimeError: no kernel for this GPU)" in caplog.text

    class Cancelled(Exception):
        pass

    def cancel():
        raise Cancelled()

    encoder.fused_layers = True
    fused = fused_of(encoder)
    monkeypatch.setattr(encoder, "fused", lambda: fused)
    with pytest.raises(Cancelled):
        encoder.encode(PROMPT, cancel)
    assert encoder.fused_layers


@interpreted_only
def test_the_kernels_compose_as_their_references(qwen3, monkeypatch):
    """The fused layers through the Triton kernels themselves (interpreted on the CPU) rather than their references:
    the layouts between them (head_norm_rope's rows-major q, k, v with k and v per query head, SDPA on its views,
    the stacked [gate | up] halves) as the GPU runs them; the same features within a bf16 step or so. (The INT8
    products autotune, which the interpreter cannot: their stacks are held to transformers' forward above.)"""
    import kernels
    _, path, _ = qwen3
    encoder = Qwen3TextEncoder.load(path, TOKENIZER_DIR, dtype=torch.bfloat16, int8_linears=False)
    ids = torch.tensor([encoder.tokenize(PROMPT)])
    last = len(encoder.model.layers)
    fused = fused_of(encoder)
    want = fused.states(ids, (last,))[last]
    from dit_core.gpu import text_decoder
    monkeypatch.setattr(text_decoder, "run", lambda op, *args, **kwargs: kernels.OPS[op].launcher(*args, **kwargs))
    assert rel_err(fused.states(ids, (last,))[last], want) <= 5e-3  # (interpreted: equal bit for bit)
