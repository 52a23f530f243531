"""The GPU block (kernels/) against the host block: INT8 emulation within 1e-2, the BF16 block within 3e-2; a whole
Z-Image step on the GPU against the host path, and replayed from a CUDA graph over resident or streamed blocks;
the parallel block (FLUX.3) at FLUX.3 Klein's sizes, with and without the keys_values hook. Runs on the device
only (pytest -m gpu)."""
import os
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from conftest import rel_err
from tiny_models import random_block, random_z_image, z_image_comfy_layout

from dit_core.arch import Arch
from dit_core.gpu import block as block_gpu
from dit_core.block import OUT, QKV, Block
from dit_core.gpu.block import GpuBlock, GpuLinear, NormStats
from dit_core.gpu.options import Options
from dit_core.families.z_image import ZImage
from dit_core.linear import float_on
from dit_core.modulation import Modulation
from dit_core.sequence import sequence_of
from dit_core.gpu.streaming import StreamedBlocks
from dit_core.weights import Linear, TensorSource, quantize_convrot
from kernels.int8.quant_turned import turned_rows

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


H3_LIKE = dict(heads=10, inner=1280, rope_axes=(32, 32, 32))  # MiniMax H3's shape: attention wider than the
# residual (7168 over 5376 there), rotary on 96 of each head's 128 values


@pytest.mark.parametrize("sandwich", [True, False], ids=["sandwich", "plain"])
@pytest.mark.parametrize("rows,group,shape", [(4608, 0, {}), (1000, 0, {}), (512, 128, {}), (2000, 0, H3_LIKE)],
                         ids=["4608", "1000", "grouped", "h3-like"])
def test_gpu_block_matches_host(sandwich, rows, group, shape):
    a = Arch(family="test", hidden=1024, layers=1, refiner=0, heads=8, head=128, ffn=2816, latents=16,
             patch=(2, 2), text_dim=64, freq_dim=256, time_hidden=1024, time_dim=256, eps=1e-5, qk_eps=1e-5,
             final_eps=1e-6, rope_axes=(32, 48, 48), rope_theta=256.0)
    a = replace(a, **shape)
    host = random_block(a, sandwich, seed=rows)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, a.hidden, generator=g)
    mods = Modulation(*(0.3 * torch.randn(2, a.hidden, generator=g) for _ in range(4)),
                      attn_shift=0.1 * torch.randn(2, a.hidden, generator=g))
    row_map = (torch.arange(rows) >= rows // 3).long()
    pos = torch.randint(0, 64, (rows, 3), generator=g)
    seq = sequence_of(pos, row_map, a.rope_axes, a.rope_theta, group=group)
    emulated = host.quantized().forward(a, x.double(), mods, seq).float()
    bf16 = host.dequantized(torch.bfloat16).forward(a, x, mods, seq)
    cuda = lambda t: None if t is None else t.cuda()  # noqa: E731
    gpu_mods = Modulation(*(cuda(getattr(mods, f)) for f in mods.__dataclass_fields__))
    out = GpuBlock.of(host.quantized(), torch.device("cuda")).forward(a, x.cuda(), gpu_mods, seq.to("cuda"))
    assert rel_err(out.cpu(), emulated) <= 1e-2
    assert rel_err(out.cpu(), bf16) <= 3e-2
    gpu_bf16 = GpuBlock.of(host.dequantized(torch.bfloat16), torch.device("cuda"))
    assert rel_err(gpu_bf16.forward(a, x.cuda(), gpu_mods, seq.to("cuda")).cpu(), bf16) <= 1e-2


def test_z_image_step_on_gpu_matches_host():
    state = z_image_comfy_layout(random_z_image(dim=768, n_heads=6, axes_dims=[32, 48, 48]).state_dict())
    latent, caption = torch.randn(4, 32, 24), torch.randn(77, 32)
    host = ZImage.load(TensorSource(state), linears="int8")
    gpu = host.to("cuda")
    ref = host.output(latent.double(), 0.5, caption.double()).float()
    assert rel_err(gpu.output(latent.cuda(), 0.5, caption.cuda()).cpu(), ref) <= 1e-2


def test_z_image_graphed_step_equals_eager():
    """ZImage.graphed: the step replayed from a CUDA graph equals the eager step bit for bit, at two sigmas (a
    value baked into the capture would show) and a second caption length (a second capture)."""
    state = z_image_comfy_layout(random_z_image(dim=768, n_heads=6, axes_dims=[32, 48, 48]).state_dict())
    gpu = ZImage.load(TensorSource(state), linears="int8").to("cuda")
    step = gpu.graphed()
    latent = torch.randn(4, 32, 24, device="cuda")
    for sigma, rows in ((0.7, 77), (0.3, 77), (0.5, 40), (0.2, 40)):  # each shape's first call is its warm-up
        caption = torch.randn(rows, 32, device="cuda")
        assert torch.equal(step(latent, sigma, caption), gpu.output(latent, sigma, caption)), (sigma, rows)
    graphs = step.graphs[0].graphs
    assert len(graphs) == 2 and None not in graphs.values()  # captured, not run eagerly after a failed capture


def test_z_image_graphed_step_follows_the_streamed_blocks():
    """ZImage.graphed over StreamedBlocks (as the nodes place the DiT): replayed while every block is
    resident, eager while one streams, captured again once they have moved, each step equal to output() bit
    for bit."""
    state = z_image_comfy_layout(random_z_image(dim=768, n_heads=6, axes_dims=[32, 48, 48]).state_dict())
    gpu = ZImage.load(TensorSource(state), linears="int8").to("cuda", budget_bytes=10**12)
    blocks, step = gpu.blocks, gpu.graphed()
    (replay,) = step.graphs  # the GraphedStep: which graphs it holds shows capture and fallback
    latent, caption = torch.randn(4, 32, 24, device="cuda"), torch.randn(77, 32, device="cuda")
    graphs = lambda: [entry[0] for entry in replay.graphs.values()]  # noqa: E731

    assert isinstance(blocks, StreamedBlocks) and all(blocks.resident)
    for sigma in (0.7, 0.6):  # the warm-up's output, then a replay
        assert torch.equal(step(latent, sigma, caption), gpu.output(latent, sigma, caption))
    (first,) = graphs()
    blocks.free(1)  # one block leaves: it streams through a slot within the step, which a graph cannot hold
    assert not all(blocks.resident)
    assert torch.equal(step(latent, 0.7, caption), gpu.output(latent, 0.7, caption)) and graphs() == []
    blocks.refill()
    assert all(blocks.resident) and torch.equal(step(latent, 0.5, caption), gpu.output(latent, 0.5, caption))
    (second,) = graphs()
    blocks.free(1)
    blocks.refill()  # moved and back between two steps: the generation tells
    for sigma in (0.3, 0.2):
        assert torch.equal(step(latent, sigma, caption), gpu.output(latent, sigma, caption))
    (third,) = graphs()
    assert second is not first and third is not second


def test_graphed_steps_under_cuda_malloc_async():
    """ComfyUI's default allocator (cudaMallocAsync; chosen before CUDA starts, so in processes of their own): the
    graph tests of Z-Image (streamed blocks too), FLUX.3 Klein (its text's mode blocks on a side stream), Krea 2,
    LTX-2.5, OmniVoice and a BF16 product (cuBLAS keeps a workspace per stream) pass, no capture fails (one that
    does ends the captures of its process: step_graph.capture_refusal) and no graph memory is freed outside its
    graph (in a server such a free aborted ComfyUI)."""
    if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
        pytest.skip("this process is the one under cudaMallocAsync")
    root = Path(__file__).resolve().parents[2]
    tests = [f"{Path(__file__).relative_to(root)}::{name}" for name in (
        "test_z_image_graphed_step_equals_eager", "test_z_image_graphed_step_follows_the_streamed_blocks")]
    tests += ["tests/families/test_flux3_klein_sampling.py::test_concurrent_mode_blocks_on_gpu",
              "tests/families/test_krea2.py::test_graphed_step_replays_the_eager_step",
              "tests/families/test_ltx25_gpu.py::test_graphed_step_equals_eager",
              "tests/families/test_omnivoice_gpu.py::test_cuda_one_graph_per_bucket",
              "tests/dit_core/test_step_graph.py::test_graphed_products_drop_and_capture_again"]
    failed = {}
    for test in tests:  # a process a test: an abort ends only its own
        # -s: the allocator's and the log's warnings reach this process's capture
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-rs", "-m", "gpu", "-p",
                               "no:cacheprovider", "--log-level=WARNING", test], cwd=root, capture_output=True,
                              text=True, timeout=600,
                              env=dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync"))
        said = done.stdout + done.stderr
        if done.returncode or "skipped" in done.stdout.lower() or any(
                bad in said for bad in ("uncaptured free", "could not be captured", "without CUDA graphs")):
            # an abort's dump ends with the Python frames and the extension modules, which say little
            failed[test] = said.split("\nExtension modules:")[0].split("\nCurrent thread")[0][-3000:]
    assert not failed, "\n\n".join(f"{test}:\n{said}" for test, said in failed.items())


KLEIN = Arch(family="test", hidden=3072, layers=1, refiner=0, heads=24, head=128, ffn=9216, latents=128,
             patch=(1, 1), text_dim=64, freq_dim=256, time_hidden=3072, time_dim=3072, eps=1e-6, qk_eps=1e-6,
             final_eps=1e-6, rope_axes=(32,) * 4, rope_theta=10000.0, norm="layer")
DEV = torch.device("cuda")


def on_gpu(block: Block) -> Block:
    """The host block's tensors on the GPU (its f64 reference runs there: the host would take minutes)."""
    move = lambda t: t.to(DEV) if isinstance(t, torch.Tensor) else t  # noqa: E731
    return Block(tuple(replace(t, **{f.name: move(getattr(t, f.name)) for f in fields(t)}) if isinstance(t, Linear)
                       else move(t) for t in block.w))


@pytest.mark.parametrize("hook", [None, "record", "extend"])
@pytest.mark.parametrize("rows,group", [(4608, 0), (1000, 0), (1024, 256)])
@pytest.mark.parametrize("int8_attention", [False, True])
def test_gpu_parallel_block_matches_host(hook, rows, group, int8_attention):
    """int8_attention: the attention's scores on the INT8 matrix cores (kernels/int8/attention.py), as FLUX.3
    Klein's blocks take them; the bounds are the same."""
    if hook == "extend" and group:
        pytest.skip("keys from another step extend the ungrouped sequence only (FLUX.3's joint blocks)")
    options = Options(int8_attention=int8_attention)
    a, host = KLEIN, random_block(KLEIN, sandwich=False, seed=rows)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, a.hidden, generator=g).to(DEV)
    mods = Modulation(*(0.3 * torch.randn(3, a.hidden, generator=g).to(DEV) for _ in range(4)),
                      attn_shift=0.1 * torch.randn(3, a.hidden, generator=g).to(DEV))
    row_map = (torch.arange(rows) >= rows // 8).long() + (torch.arange(rows) >= rows // 2).long()
    seq = sequence_of(torch.randint(0, 64, (rows, 4), generator=g), row_map, a.rope_axes, a.rope_theta,
                      group=group).to(DEV)
    extra = [torch.randn(512, a.heads, a.head, generator=g).to(DEV) for _ in range(2)]
    seen = []
    int8 = GpuBlock.of(host.quantized(), DEV)
    turned = block_gpu._turns_v(a, int8.w[QKV], int8.w[OUT], seq, options)  # the INT8 block's v turned (Klein: yes)

    def keys_values(turn):
        """The hook as a block sees it: v turned where the block turns it, so rows kept from it come turned."""
        def recorded(k, v):
            seen.append((k.float(), v.float()))
            if hook == "extend":
                v_extra = turned_rows(extra[1]) if turn else extra[1]
                return torch.cat([k, extra[0].to(k.dtype)]), torch.cat([v, v_extra.to(v.dtype)])
            return k, v
        return None if hook is None else recorded

    emulated = on_gpu(host.quantized()).parallel(a, x.double(), mods, seq, keys_values(False)).float()
    bf16 = on_gpu(host.dequantized(torch.bfloat16)).parallel(a, x, mods, seq, keys_values(False))
    out = int8.parallel(a, x, mods, seq, keys_values(turned), options=options)
    assert rel_err(out, emulated) <= 1e-2
    assert rel_err(out, bf16) <= 3e-2
    assert rel_err(GpuBlock.of(host.dequantized(torch.bfloat16), DEV).parallel(a, x, mods, seq, keys_values(False),
                                                                               options=options), bf16) <= 1e-2
    for i, (ours, theirs) in enumerate(zip(seen[2], seen[0]) if hook else ()):  # k, then v
        theirs = turned_rows(theirs).float() if turned and i == 1 else theirs
        assert ours.shape == theirs.shape == (rows, a.heads, a.head) and rel_err(ours, theirs) <= 1e-2
    if hook is None:  # the next block's norm statistics from this block's gated DOWN product (the Hopper parts)
        carry = NormStats.of(x)
        gpu = GpuBlock.of(host.quantized(), DEV)
        first = gpu.parallel(a, x, mods, seq, carry=carry, options=options)
        assert carry.ready and rel_err(first, out) <= 1e-6
        # Statistics a few f32 ulps from the second block's own (kernels/int8/row_stats.py) move a few of its codes by
        # one, which its linears spread over the rows: measured 2e-4, 50x inside the INT8 block's 1e-2.
        assert rel_err(gpu.parallel(a, first, mods, seq, carry=carry, options=options),
                       gpu.parallel(a, out, mods, seq, options=options)) <= 1e-3


def test_float_linears_move_as_stored_and_convert_on_the_card_as_on_the_host():
    g, cuda = torch.Generator().manual_seed(5), torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        lin = Linear(torch.randn(64, 256, generator=g).to(dtype), torch.randn(64, generator=g).to(dtype))
        small = float_on(lin, cuda)  # a model's small linears, kept in f32
        assert torch.equal(small.weight.cpu(), lin.dequantized()) and torch.equal(small.bias.cpu(), lin.bias.float())
        assert torch.equal(GpuLinear.of(lin, cuda).weight.cpu(), lin.dequantized().to(torch.bfloat16))
    codes, scale = quantize_convrot(torch.randn(64, 256, generator=g), 64)
    rotated = Linear(codes, None, scale, 64)  # rotated back on the host, as the reference does
    assert torch.equal(float_on(rotated, cuda).weight.cpu(), rotated.dequantized())
