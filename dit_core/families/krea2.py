"""Krea 2 (Turbo and base) on the shared block: the original single file -> text fusion, blocks, final layer.

Facts: reference/families/krea2.md (diffusers 0.42.1 transformer_krea2.py; single_file_utils.py
convert_krea2_transformer_checkpoint_to_diffusers for the names). The layout is converted once, here, at load:
q, k, v and the attention gate stack into QKV (grouped-query: 48 query heads share 12 key heads), gate and up
interleave into UP, the zero-centred norm weights become gains 1 + w in f32, and each head's q and k rows turn
from adjacent-pair rotary to split halves. On a GPU the blocks' linears run on the INT8 kernels and their attention
by the plain path (block_gpu._plain_heads: the fused QKV and attention kernels take neither shared key heads nor a
gate yet). The style reference's latents (issue 38) join the sequence after the image as ComfyUI's newest Krea 2
places them with the index_timestep_zero method (comfy/ldm/krea2/model.py; diffusers 0.42.1 has no reference path).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import Block, NormStats, rms_norm
from ..linear import float_on, linear
from ..modulation import Modulation, sinusoids
from .loading import Detection, OpenedFile
from ..sequence import Sequence, halves_permutation, sequence_of
from ..weights import Checkpoint, Linear, WeightsError, glu_rows, read_tensor, stack_rows

PREFIXES = ("model.diffusion_model.", "")
# ComfyUI's Wan21 latent format (Krea 2's; section 5, VAE): the model sees (z - mean) / std of the raw VAE
# latent.
LATENT_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517, -0.3632,
               -0.1922, -0.9497, 0.2503, -0.2921)
LATENT_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579, 1.6382,
              1.1253, 2.8251, 1.9160)
SAMPLING_MU = 1.15  # ModelSamplingFlux's shift for Krea 2 (Turbo and, in ComfyUI, base): schedules.flux_sigma_table
MARKER = "txtfusion.projector.weight"
PATCH = 2
ROPE_THETA = 1000.0
TIME_SCALE = 1000.0
EPS = 1e-5
# diffusers' names of the file's linears (LoRAs trained on diffusers): single_file_utils.py's converter, reversed
# only in direction (section 3's table of checkpoint tensor names).
DIFFUSERS_PREFIXES = (("first", "img_in"), ("tmlp.0", "time_embed.linear_1"), ("tmlp.2", "time_embed.linear_2"),
                      ("tproj.1", "time_mod_proj"), ("txtmlp.1", "txt_in.linear_1"), ("txtmlp.3", "txt_in.linear_2"),
                      ("txtfusion.", "text_fusion."), ("blocks.", "transformer_blocks."),
                      ("last.linear", "final_layer.linear"))
DIFFUSERS_LINEARS = {"attn.wq": "attn.to_q", "attn.wk": "attn.to_k", "attn.wv": "attn.to_v", "attn.wo": "attn.to_out.0",
                     "attn.gate": "attn.to_gate", "mlp.gate": "ff.gate", "mlp.up": "ff.up", "mlp.down": "ff.down"}
# Rows of a block's modulation (shared time rows + the block's table), in the file's order (section 2, forward
# math).
SCALE1, SHIFT1, GATE1, SCALE2, SHIFT2, GATE2 = range(6)


def pack_tokens(z: torch.Tensor) -> torch.Tensor:
    """VAE latent [C, H, W] -> tokens [H/2 W/2, 4C], row-major, values channel-major: c*4 + ph*2 + pw."""
    if z.dim() != 3 or z.shape[1] % PATCH or z.shape[2] % PATCH:
        raise ValueError(f"Krea2: latent {tuple(z.shape)} is not [C, H, W] on the 2x2 patch grid (H and W even: "
                         f"image sizes multiples of 16 pixels)")
    c, h, w = z.shape
    return z.reshape(c, h // 2, 2, w // 2, 2).permute(1, 3, 0, 2, 4).reshape((h // 2) * (w // 2), c * 4)


def unpack_tokens(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """pack_tokens' inverse for a latent of h x w."""
    c = tokens.shape[1] // 4
    return tokens.reshape(h // 2, w // 2, c, 2, 2).permute(2, 0, 3, 1, 4).reshape(c, h, w)


def reference_tokens(z: torch.Tensor) -> torch.Tensor:
    """A reference latent [C, h, w] -> its tokens, an odd side first padded circularly to the 2 x 2 patch grid
    (ComfyUI's pad_to_patch_size, as its Krea 2 pads each reference: TextEncodeQwenImageEditPlus makes sides of
    multiples of 8 pixels, so a latent side can be odd)."""
    pad_h, pad_w = -z.shape[-2] % PATCH, -z.shape[-1] % PATCH
    return pack_tokens(F.pad(z[None], (0, pad_w, 0, pad_h), mode="circular")[0] if pad_h or pad_w else z)


def latent_format() -> tuple[torch.Tensor, torch.Tensor]:
    """ksample's latent_shift and latent_scale for Krea 2's VAE latents [B, 16, H, W]: ComfyUI's Wan21 format,
    (z - mean) / std, as a product with 1 / std (within an f32 rounding of ComfyUI's quotient)."""
    return torch.tensor(LATENT_MEAN).view(1, -1, 1, 1), 1 / torch.tensor(LATENT_STD).view(1, -1, 1, 1)


DETECTION = Detection((MARKER,), PREFIXES, "a Krea 2 diffusion model",
                      "a Krea 2 file such as krea2_turbo_int8_convrot.safetensors")


def lora_aliases(names: set[str]) -> dict[str, tuple[str, int]]:
    """diffusers' names of Krea 2's linears -> (the file's name, first row): LoRAs merge into each linear as it is
    read, before QKV and UP are stacked, so every name maps whole."""
    aliases = {}
    for name in names:
        alias = name
        for old, new in DIFFUSERS_PREFIXES:
            if alias.startswith(old):
                alias = new + alias[len(old):]
                break
        for old, new in DIFFUSERS_LINEARS.items():
            if alias.endswith("." + old):
                alias = alias[: -len(old)] + new
                break
        if alias != name:
            aliases[alias] = (name, 0)
    return aliases


def _attention_arch(ckpt: Checkpoint, stem: str, family: str, **sizes) -> Arch:
    """An Arch of the blocks under stem from their own shapes: width, heads, key heads, MLP width."""
    hidden = ckpt.shape(f"{stem}attn.wq.weight")[1]
    head = ckpt.shape(f"{stem}attn.qknorm.qnorm.scale")[0]
    return Arch(family=family, hidden=hidden, heads=hidden // head, head=head,
                kv_heads=ckpt.shape(f"{stem}attn.wk.weight")[0] // head, attn_gate=True,
                ffn=ckpt.shape(f"{stem}mlp.gate.weight")[0], eps=EPS, qk_eps=EPS, final_eps=EPS,
                rope_theta=ROPE_THETA, **sizes)


def read_arch(ckpt: Checkpoint, p: str) -> tuple[Arch, Arch]:
    """(the main blocks' Arch, the text fusion blocks' Arch) from the file's shapes (section 1, sizes). The
    rotary covers the whole head in three axes (t, h, w) of a quarter and three eighths each (32, 48, 48 of
    128)."""
    hidden, channels = ckpt.shape(f"{p}first.weight")
    head = ckpt.shape(f"{p}blocks.0.attn.qknorm.qnorm.scale")[0]
    text_dim = ckpt.shape(f"{p}txtmlp.1.weight")[1]
    time_hidden, freq_dim = ckpt.shape(f"{p}tmlp.0.weight")
    common = dict(latents=channels // PATCH ** 2, patch=(PATCH, PATCH), text_dim=text_dim, freq_dim=freq_dim,
                  time_hidden=time_hidden, time_dim=ckpt.shape(f"{p}tmlp.2.weight")[0])
    main = _attention_arch(ckpt, f"{p}blocks.0.", "krea2", layers=ckpt.numbered(f"{p}blocks.", ".attn.wq.weight"),
                           refiner=0, rope_axes=(head // 4, 3 * head // 8, 3 * head // 8), **common)
    if main.hidden != hidden or sum(main.rope_axes) != head:
        raise WeightsError(f"{ckpt.path.name}: blocks of width {main.hidden} and head {head} do not fit a model of "
                           f"width {hidden}")
    fusion = f"{p}txtfusion."
    layerwise = ckpt.numbered(f"{fusion}layerwise_blocks.", ".attn.wq.weight")
    refiners = ckpt.numbered(f"{fusion}refiner_blocks.", ".attn.wq.weight")
    text = _attention_arch(ckpt, f"{fusion}layerwise_blocks.0.", "krea2_text", layers=layerwise + refiners,
                           refiner=refiners, rope_axes=(), **common)
    if text.hidden != text_dim:
        raise WeightsError(f"{ckpt.path.name}: text fusion blocks of width {text.hidden} for text rows of {text_dim}")
    return main, text


def _read_block(ckpt: Checkpoint, stem: str, a: Arch, lin) -> Block:
    """Block `stem` (full key prefix, e.g. 'blocks.3.'): QKV = [q; k; v; gate], q's and k's rows per head in split
    halves where the block rotates; UP = gluRows(gate, up); norm gains 1 + w."""
    perm = halves_permutation(a.rotary, a.head) if a.rotary else torch.arange(a.head)
    q_rows = (torch.arange(a.heads)[:, None] * a.head + perm).reshape(-1)
    k_rows = (torch.arange(a.key_width // a.head)[:, None] * a.head + perm).reshape(-1)
    parts = [lin(f"{stem}attn.{n}") for n in ("wq", "wk", "wv", "gate")]
    shape = (sum(p.out_features for p in parts), *{p.in_features for p in parts})
    if shape != (a.qkv_width, a.hidden):
        raise WeightsError(f"{ckpt.path.name}: '{stem}attn.wq/wk/wv/gate' give {shape}, expected "
                           f"{(a.qkv_width, a.hidden)}")
    k0, v0 = a.width, a.width + a.key_width
    qkv = stack_rows(parts, torch.cat([q_rows, k0 + k_rows, torch.arange(v0, a.qkv_width)]))
    gain = lambda key, n: 1.0 + read_tensor(ckpt, f"{stem}{key}", (n,))  # noqa: E731 - zero-centred, in f32
    return Block((qkv, lin(f"{stem}attn.wo"), glu_rows(lin(f"{stem}mlp.gate"), lin(f"{stem}mlp.up")),
                  lin(f"{stem}mlp.down"), gain("prenorm.scale", a.hidden), gain("postnorm.scale", a.hidden),
                  gain("attn.qknorm.qnorm.scale", a.head)[perm], gain("attn.qknorm.knorm.scale", a.head)[perm],
                  None, None))


def unrotated(rows: int, group: int = 0) -> Sequence:
    """rows that attend with no rotary (the text fusion blocks), within groups of `group` rows when given."""
    empty = torch.zeros(rows, 0)
    return Sequence(torch.zeros(rows, dtype=torch.long), empty, empty, group)


def _grid_positions(index: int, hp: int, wp: int) -> torch.Tensor:
    """Positions [hp wp, 3] of an hp x wp token grid, row-major: (index, i, j)."""
    grid = torch.stack(torch.meshgrid(torch.arange(hp), torch.arange(wp), indexing="ij"), -1).reshape(-1, 2)
    return torch.cat([torch.full((hp * wp, 1), index, dtype=torch.long), grid], 1)


@functools.lru_cache(maxsize=8)
def _sequence(a: Arch, n_txt: int, hp: int, wp: int, device: torch.device,
              refs: tuple[tuple[int, int], ...] = ()) -> Sequence:
    """The [text | image | references] rows' Sequence: text at (0, 0, 0), image token (i, j) of the hp x wp grid at
    (0, i, j), token (i, j) of reference k (grids refs, k = 1, 2, ...) at (k, i, j); image and text rows take
    modulation row 0, reference rows row 1 (ComfyUI's Krea 2 with the index_timestep_zero method:
    comfy/ldm/krea2/model.py process_img and SingleStreamBlock). cos/sin of float64 angles, then f32 (diffusers'
    Krea2RotaryPosEmbed). Built once per shape."""
    parts = [torch.zeros(n_txt, 3, dtype=torch.long), _grid_positions(0, hp, wp)]
    parts += [_grid_positions(k, rh, rw) for k, (rh, rw) in enumerate(refs, 1)]
    positions = torch.cat(parts)
    n_refs = sum(rh * rw for rh, rw in refs)
    map_ = torch.cat([torch.zeros(positions.shape[0] - n_refs, dtype=torch.long), torch.ones(n_refs, dtype=torch.long)])
    seq = sequence_of(positions, map_, a.rope_axes, a.rope_theta, torch.float64)
    return replace(seq, cos=seq.cos.float(), sin=seq.sin.float(), angles=None).to(device)


def sigma_row(sigma: float, device: torch.device) -> torch.Tensor:
    """sigma as the model takes it: [1] f32 on device (velocity_at's input)."""
    return torch.full((1,), float(sigma), dtype=torch.float32, device=device)


@dataclass(frozen=True)
class Krea2:
    """Krea 2 where it runs: time MLP and modulation, the text fusion (layerwise blocks across each token's tapped
    layers, projector, refiner blocks across tokens), the text and image embedders, the blocks with their tables,
    and the final layer."""
    arch: Arch
    text_arch: Arch
    time: tuple[Linear, Linear]
    time_mod: Linear
    layerwise: tuple[Block, ...]
    projector: torch.Tensor     # [taps] f32
    refiners: tuple[Block, ...]
    text_norm: torch.Tensor     # gain 1 + w
    text_in: tuple[Linear, Linear]
    image_in: Linear
    blocks: tuple[Block, ...]
    tables: torch.Tensor        # [layers, 6, hidden] f32: each block's addition to the shared modulation rows
    final_table: torch.Tensor   # [2, hidden] f32: scale, shift
    final_norm: torch.Tensor
    final_out: Linear
    # The GPU path's options (dit_core/gpu/options.py), passed to each block: set by to(), default_options()'s
    # unless given; None on a model never moved (the host blocks read none).
    options: object = field(default=None, compare=False)

    @staticmethod
    def default_options():
        """Krea 2's GPU options: the engine's defaults (its attention, grouped-query heads with a gate, takes the
        plain path, cuDNN's bf16 scores)."""
        from ..gpu.options import Options
        return Options(int8_attention=False)

    @staticmethod
    def load(path: str | Path | Checkpoint, linears: str = "stored",
             loras: tuple[tuple[str | Path, float], ...] = (),
             compute_on: torch.device | None = None, blocks_on_use: bool = False) -> Krea2:
        """Krea 2 from its original single file (BF16, INT8 ConvRot, FP8; optional model.diffusion_model. prefix).
        linears: 'stored' keeps each block linear as stored, 'int8' quantizes float ones to INT8 ConvRot, 'bf16'
        dequantizes INT8 ones. loras: (file, strength) pairs merged into the linears as they load (the file's names
        or diffusers'). compute_on: the device that quantizes and merges them (OpenedFile). blocks_on_use: the main
        blocks read as they are placed (OpenedFile.blocks; for a model bound for a card)."""
        opened = OpenedFile.open(path, DETECTION, linears, compute_on)
        ckpt, p = opened.ckpt, opened.prefix
        a, t = read_arch(ckpt, p)
        opened = opened.with_loras(loras, lora_aliases)
        lin = lambda key: opened.linear(key[len(p):])  # noqa: E731 (key: the full prefix, less .weight)

        def block(stem: str, arch: Arch, source: OpenedFile, i: int) -> Block:
            return source.convert(_read_block(source.ckpt, f"{p}{stem}{i}.", arch,
                                              lambda key: source.linear(key[len(p):])))

        def blocks(stem: str, n: int, arch: Arch, on_use: bool = False):
            return opened.blocks(functools.partial(block, stem, arch), n, on_use)
        taps = ckpt.shape(f"{p}{MARKER}")[1]
        return Krea2(
            arch=a, text_arch=t, time=(lin(f"{p}tmlp.0"), lin(f"{p}tmlp.2")), time_mod=lin(f"{p}tproj.1"),
            layerwise=blocks("txtfusion.layerwise_blocks.", t.layers - t.refiner, t),
            projector=read_tensor(ckpt, f"{p}{MARKER}", (1, taps))[0],
            refiners=blocks("txtfusion.refiner_blocks.", t.refiner, t),
            text_norm=1.0 + read_tensor(ckpt, f"{p}txtmlp.0.scale", (a.text_dim,)),
            text_in=(lin(f"{p}txtmlp.1"), lin(f"{p}txtmlp.3")), image_in=lin(f"{p}first"),
            blocks=blocks("blocks.", a.layers, a, blocks_on_use),
            tables=torch.stack([read_tensor(ckpt, f"{p}blocks.{i}.mod.lin", (6 * a.hidden,)).reshape(6, a.hidden)
                                for i in range(a.layers)]),
            final_table=read_tensor(ckpt, f"{p}last.modulation.lin", (2, a.hidden)),
            final_norm=1.0 + read_tensor(ckpt, f"{p}last.norm.scale", (a.hidden,)), final_out=lin(f"{p}last.linear"))

    def to(self, device: str | torch.device, budget_bytes: int | Callable[[int], int] | None = None,
           options=None) -> Krea2:
        """Krea 2 where it runs: on a CUDA device the blocks and text fusion blocks become GpuBlocks (INT8 ConvRot
        linears on the matrix cores, or BF16; attention by the plain path, block_gpu._plain_heads), the small
        linears and tensors f32 there. With budget_bytes the main blocks take at most that much device memory: those
        that do not fit stream from host memory (dit_core/gpu/streaming.py; on the CPU through CPU slots, the same
        numerics); a function of the main blocks' total bytes is asked once the rest is on the device. options: the
        GPU path's (dit_core/gpu/options.py; by default the model's, else default_options())."""
        dev = torch.device(device)
        options = options or self.options or self.default_options()
        from ..gpu.streaming import streamed_blocks  # the GPU path: imported where used
        streamed = lambda: streamed_blocks(self.blocks, dev, budget_bytes)  # noqa: E731
        if dev.type == "cpu":
            return replace(self, options=options) if budget_bytes is None else \
                replace(self, blocks=streamed(), options=options)
        from ..gpu.block import GpuBlock
        small = lambda lin: float_on(lin, dev)  # noqa: E731
        gpu = lambda blocks: tuple(GpuBlock.of(b, dev) for b in blocks)  # noqa: E731
        return replace(self, time=tuple(map(small, self.time)), time_mod=small(self.time_mod),
                       layerwise=gpu(self.layerwise), projector=self.projector.to(dev), refiners=gpu(self.refiners),
                       text_norm=self.text_norm.to(dev), text_in=tuple(map(small, self.text_in)),
                       image_in=small(self.image_in), tables=self.tables.to(dev),
                       final_table=self.final_table.to(dev), final_norm=self.final_norm.to(dev),
                       final_out=small(self.final_out), blocks=gpu(self.blocks) if budget_bytes is None else streamed(),
                       options=options)

    def time_embedding(self, sigma: float | torch.Tensor, device: torch.device) -> torch.Tensor:
        """temb [1, hidden] f32: the model is fed sigma (a number, or a [1] f32 tensor on device: a graphed step's
        input) and embeds 1000 sigma as [cos | sin] (section 2, forward math)."""
        t = (sigma if isinstance(sigma, torch.Tensor) else sigma_row(sigma, device)) * TIME_SCALE  # f32, as diffusers
        return linear(F.gelu(linear(sinusoids(t, self.arch.freq_dim), self.time[0]), approximate="tanh"), self.time[1])

    def text_rows(self, text: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tapped text rows [L, taps, text_dim] (the text encoder's layers per token) -> [valid L, hidden] f32: the
        layerwise blocks attend across each token's taps, the projector sums them, the refiners attend across the
        valid tokens (rows mask False are dropped: they are never keys, so this is exact), then the projection."""
        t = self.text_arch
        taps = self.projector.shape[0]
        if text.dim() != 3 or text.shape[1:] != (taps, t.hidden):
            raise ValueError(f"Krea2: text rows {tuple(text.shape)} are not [tokens, {taps}, {t.hidden}] (the text "
                             f"encoder's {taps} tapped layers per token)")
        if mask is not None:
            text = text[mask.to(text.device, torch.bool)]
        n = text.shape[0]
        dtype = torch.promote_types(text.dtype, torch.float32)  # f32, or f64 for an exact host reference
        x = text.to(dtype, copy=True).reshape(n * taps, t.hidden)  # a GPU block updates its rows in place
        identity = Modulation.identity(t.hidden, device=x.device)
        options = self.options and self.options.for_prompt_rows()
        for block in self.layerwise:
            x = block.forward(t, x, identity, unrotated(n * taps, taps).to(x.device), options=options)
        x = x.reshape(n, taps, t.hidden).transpose(1, 2) @ self.projector.to(x.dtype)
        for block in self.refiners:
            x = block.forward(t, x, identity, unrotated(n).to(x.device), options=options)
        x = linear(rms_norm(x, self.text_norm, EPS), self.text_in[0])
        return linear(F.gelu(x, approximate="tanh"), self.text_in[1])

    def output(self, latent: torch.Tensor, sigma: float, text: torch.Tensor, mask: torch.Tensor | None = None,
               check: Callable[[], None] | None = None, *,
               refs: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
        """The velocity [C, H, W] for the VAE latent [C, H, W] at sigma, conditioned on the tapped text rows
        [L, taps, text_dim] (mask [L] bool: the valid ones; None: all) and reference latents refs (each [C, h, w],
        in the model's latent format as the latent: the style reference's); f32, or f64 where the text rows are.
        check() runs after each block (ComfyUI's cancel within a step)."""
        return self.velocity(latent, sigma, self.text_rows(text, mask), check, refs=refs)

    def velocity(self, latent: torch.Tensor, sigma: float, txt: torch.Tensor,
                 check: Callable[[], None] | None = None, *,
                 refs: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
        """output() from text_rows' fused rows txt [L, hidden]: they do not change between steps, so a sampler
        fuses them once. Reference latents join the sequence after the image as ComfyUI's Krea 2 places them with
        FluxKontextMultiReferenceLatentMethod("index_timestep_zero"): their tokens at positions (k, i, j) for
        reference k = 1, 2, ..., modulated as at sigma 0 (time embedding of 0, the blocks' tables added alike);
        only the image rows reach the final layer."""
        return self.velocity_at(latent, sigma_row(sigma, latent.device), txt, check, refs=refs)

    def graphed(self, capture: str = "always") -> Callable[..., torch.Tensor]:
        """velocity() replayed from one CUDA graph a step (dit_core/gpu/step_graph.py) on a CUDA device, else
        velocity() itself; with reference latents, or while some blocks stream, the step runs eagerly (once the
        blocks have moved the graphs are captured again: ModelGraphs.usable). check() is asked before a replayed
        step, not within it. step.clear() drops the graphs and their memory pool: call it before the blocks move
        or the model goes (LoadedModels.attached); step.graphs: the GraphedStep; step.text_rows(text, dtype):
        text_rows' fusion of a conditioning's tapped rows, made once per tensor and kept across sampler runs (a new
        seed of the same prompt fuses nothing: step_graph.KeptRows; dtype is the kept rows' key only).
        capture: GraphedStep's ("host_bound": captured only where a graph pays)."""
        if self.final_norm.device.type != "cuda":
            return self.velocity
        from ..gpu.step_graph import KeptRows, ModelGraphs
        graphs = ModelGraphs(lambda latent, sigma, txt: self.velocity_at(latent, sigma, txt), capture=capture)
        fused = KeptRows(lambda text, dtype: self.text_rows(text))

        def step(latent: torch.Tensor, sigma: float, txt: torch.Tensor, check: Callable[[], None] | None = None, *,
                 refs: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
            if refs or not graphs.usable(self.blocks):
                return self.velocity(latent, sigma, txt, check, refs=refs)
            if check is not None:
                check()
            return graphs.steps[0](latent, sigma_row(sigma, latent.device), txt)
        step.clear, step.graphs, step.text_rows = lambda: (graphs.clear(), fused.clear()), graphs.steps, fused
        return step

    def velocity_at(self, latent: torch.Tensor, sigma: torch.Tensor, txt: torch.Tensor,
                    check: Callable[[], None] | None = None, *,
                    refs: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
        """velocity() at sigma given as a [1] f32 tensor on the latent's device: with every block resident nothing
        in it waits for the host or copies from it (the sequence's tables are made once per shape), so a CUDA graph
        can capture it."""
        a = self.arch
        for z in (latent, *refs):
            if z.dim() != 3 or z.shape[0] != a.latents:
                raise ValueError(f"Krea2: latent {tuple(z.shape)} is not [{a.latents}, H, W]")
        c, h, w = latent.shape
        ref_tokens = [reference_tokens(z) for z in refs]
        x = torch.cat([txt, linear(torch.cat([pack_tokens(latent), *ref_tokens]), self.image_in).to(txt.dtype)])
        temb = self.time_embedding(sigma, latent.device)
        times = [temb] + ([self.time_embedding(0.0, latent.device)] if refs else [])
        # [6, times, hidden]: modulation row 0 for the text and image rows, row 1 for the references
        shared = torch.stack([linear(F.gelu(t, approximate="tanh"), self.time_mod).reshape(6, a.hidden)
                              for t in times], dim=1)
        grids = tuple(((z.shape[1] + 1) // PATCH, (z.shape[2] + 1) // PATCH) for z in refs)
        seq = _sequence(a, txt.shape[0], h // PATCH, w // PATCH, latent.device, grids)
        carry = NormStats.of(x) if self.options is None or self.options.carry_norms else None
        for block, table in zip(self.blocks, self.tables):
            m = shared + table[:, None]  # [6, times, hidden]
            x = block.forward(a, x, Modulation(attn_scale=m[SCALE1], attn_gate=m[GATE1], mlp_scale=m[SCALE2],
                                               mlp_gate=m[GATE2], attn_shift=m[SHIFT1], mlp_shift=m[SHIFT2]), seq,
                              carry, options=self.options)
            if check is not None:
                check()
        scale, shift = (temb + self.final_table).unsqueeze(1)
        image = x[txt.shape[0]:txt.shape[0] + (h // PATCH) * (w // PATCH)]
        y = linear(rms_norm(image, self.final_norm, EPS) * (1 + scale) + shift, self.final_out)
        return unpack_tokens(y, h, w)

    def dry_pass(self, pixels: int = 1024, text_rows: int = 77) -> torch.Tensor:
        """One pass as the sampler makes it (the text fused, then denoised over a batch of one) of a pixels x pixels
        image and a prompt of text_rows tokens, on zeros: the kernels a first step launches, for a stand-in built
        beside the load (builds.built_beside)."""
        device, side = self.projector.device, pixels // 8  # the Qwen-Image VAE: a latent cell is 8x8 pixels
        txt = self.text_rows(torch.zeros(text_rows, self.projector.shape[0], self.text_arch.hidden, device=device))
        return self.denoised(torch.zeros(1, self.arch.latents, side, side, device=device), 1.0, txt[None])

    def denoised(self, x: torch.Tensor, sigma: float, txt: torch.Tensor,
                 check: Callable[[], None] | None = None, *,
                 refs: tuple[torch.Tensor, ...] = (), step: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
        """x0 for a batch of normalized latents x [B, C, H, W] and fused text rows txt [B or 1, L, hidden]
        (text_rows of each conditioning), with reference latents refs (each [C, h, w], for every latent of the
        batch, as ComfyUI repeats them to the batch): x0 = x - sigma v, v the velocity (ComfyUI's CONST sampling;
        timestep = sigma). step: velocity or its graphed twin (graphed())."""
        step = step or self.velocity
        outs = [step(x[i], sigma, txt[min(i, txt.shape[0] - 1)], check, refs=refs) for i in range(x.shape[0])]
        return x - float(sigma) * torch.stack(outs).to(x.dtype)
