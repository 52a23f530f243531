"""MiniMax H3 (text + image to video + audio) on the shared block, on the host: the Comfy-Org single file -> text
refiner, blocks, final layer, over one packed sequence of text, condition (keyframe, reference), audio and video rows.

Facts: reference/families/minimax_h3.md (diffusers 0.42.1 transformer_minimax_h3.py; single_file_utils.py
convert_minimax_h3_transformer_checkpoint_to_diffusers for the names, whose inverse the file's names are). The layout
is converted once, here, at load: QKV as stored (the Comfy-Org files stack [q; k; v]) with each q and k head's values
reordered so that its rotary spans the whole head (head_order), fc1's [gate; value] halves interleaved into UP. The
attention is wider than the residual (56 heads x 128 = 7168 over 5376: Arch.inner) and turns 96 of a head's 128
values (three axes of 16 frequencies, split halves). Time is t = 1 - sigma (1 = clean, unscaled) and the velocity
points data-ward: x0 = x + sigma v (section 11, item 4). The packed sequence's layout: minimax_h3_layout.py.

A layer is a block with its modulation linear (40% of its bytes in the full files; 8 columns in the pruned files'
curve form), the unit that stays on the GPU or streams. sampling/minimax_h3.py runs a prompt on it (sample_t2va).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import Block, NormStats, rms_norm
from ..linear import float_on, linear
from ..modulation import Modulation, sinusoids
from ..sequence import Sequence
from ..weights import Checkpoint, Linear, WeightsError, read_tensor
from .loading import Detection, OpenedFile
from .minimax_h3_layout import (  # noqa: F401 (the layout's names, also imported from here by codecs and text)
    AUDIO, AUDIO_CONDITION_TIME, CANVAS_MULTIPLE, KEYFRAME_TIME, MODALITIES, PATCH, TEXT, VIDEO, Layout, Reference,
    audio_to_rows, packed_layout, patchify, reference_image_size, row_times, rows_to_audio, unpatchify)

PREFIXES = ("model.diffusion_model.", "")
MARKER = "token_refiner.blocks.0.attn.qkv_proj.weight"
TIME_TABLE = "adaln_t_table"  # the "pruned" files' curve form of the time embedding (section 5, variants)
EPS = 1e-5  # block, head and final norms alike (section 1)
ROPE_THETA = 10000.0
FEW_COLUMNS = 256  # a modulation linear of fewer input columns stays f32 on the GPU (Layer.on)
CURVE_GRID = 1025  # the published pruned files' table rows (curve_form's default)
# Indexes of a block's six modulation rows in adaln_proj's output (diffusers' shift, scale, gate order).
SHIFT1, SCALE1, GATE1, SHIFT2, SCALE2, GATE2 = range(6)

# The file's names of its linears -> diffusers' (LoRAs trained on diffusers): single_file_utils.py's converter, in
# the other direction. QKV's three parts map to its row blocks; fc1 has no alias, as diffusers holds its halves in
# the other order ([value; gate]), which no first row expresses.
DIFFUSERS_PREFIXES = (("blocks.", "transformer_blocks."), ("token_refiner.blocks.", "token_refiner.refiner_blocks."),
                      ("time_embedder.proj_in", "time_embedder.linear_1"),
                      ("time_embedder.proj_out", "time_embedder.linear_2"), ("video_patch_proj", "proj_in"),
                      ("audio_patch_proj", "audio_proj_in"), ("condition_proj", "context_embedder"),
                      ("final_layer.adaln_proj.linear", "norm_out.linear"), ("final_layer.video_out", "proj_out"),
                      ("final_layer.audio_out", "audio_proj_out"))
DIFFUSERS_LINEARS = {"attn.out_proj": "attn.to_out.0", "mlp.fc2": "ff.net.2", "adaln_proj.linear": "adaln_proj.linear"}

DETECTION = Detection((MARKER,), PREFIXES, "a MiniMax H3 diffusion model",
                      "a MiniMax H3 file such as minimax_h3_fl2va_pruned_int8_convrot.safetensors")


def lora_aliases(names: set[str], inner: int) -> dict[str, tuple[str, int]]:
    """diffusers' names of H3's linears -> (the file's name, first row); q, k and v land on QKV's rows 0, inner and
    2 inner (LoRAs merge into each linear as it is read, QKV as stored)."""
    aliases = {}
    for name in names:
        for old, new in DIFFUSERS_PREFIXES:
            if name.startswith(old):
                alias = new + name[len(old):]
                break
        else:
            continue
        if name.endswith(".attn.qkv_proj"):
            base = alias[: -len("qkv_proj")]
            aliases.update({f"{base}to_{n}": (name, i * inner) for i, n in enumerate("qkv")})
            continue
        for old, new in DIFFUSERS_LINEARS.items():
            if alias.endswith("." + old):
                alias = alias[: -len(old)] + new
                break
        else:
            if name.startswith(("blocks.", "token_refiner.")):
                continue  # fc1, and norms: no diffusers alias
        aliases[alias] = (name, 0)
    return aliases


def read_arch(ckpt: Checkpoint, p: str) -> Arch:
    """The blocks' Arch from the file's shapes (section 1). The rotary turns three axes of rope_freq_dim
    frequencies each (rope.inv_freq where the file keeps it, else an eighth of a head: 16 of 128, as released)."""
    hidden, video_in = ckpt.shape(f"{p}video_patch_proj.weight")
    head = ckpt.shape(f"{p}blocks.0.attn.q_norm.weight")[0]
    inner = ckpt.shape(f"{p}blocks.0.attn.out_proj.weight")[1]
    freqs = ckpt.shape(f"{p}rope.inv_freq")[0] if f"{p}rope.inv_freq" in ckpt else head // 8
    if f"{p}{TIME_TABLE}" in ckpt:
        freq_dim, time_hidden, time_dim = 0, 0, ckpt.shape(f"{p}{TIME_TABLE}")[1]
    else:
        time_hidden, freq_dim = ckpt.shape(f"{p}time_embedder.proj_in.weight")
        time_dim = ckpt.shape(f"{p}time_embedder.proj_out.weight")[0]
    if video_in % math.prod(PATCH) or inner % head:
        raise WeightsError(f"{ckpt.path.name}: video rows of {video_in} values or attention {inner} wide in heads "
                           f"of {head} do not fit MiniMax H3")
    return Arch(family="minimax_h3", hidden=hidden, layers=ckpt.numbered(f"{p}blocks.", ".attn.qkv_proj.weight"),
                refiner=ckpt.numbered(f"{p}token_refiner.blocks.", ".attn.qkv_proj.weight"), heads=inner // head,
                head=head, inner=inner, ffn=ckpt.shape(f"{p}blocks.0.mlp.fc2.weight")[1],
                latents=video_in // math.prod(PATCH), patch=PATCH,
                text_dim=ckpt.shape(f"{p}condition_proj.weight")[1], freq_dim=freq_dim, time_hidden=time_hidden,
                time_dim=time_dim, eps=EPS, qk_eps=EPS, final_eps=EPS, rope_axes=(2 * freqs,) * 3,
                rope_theta=ROPE_THETA)


def head_order(head: int, rotary: int) -> torch.Tensor:
    """A head's value order that makes a rotary over its first 2 rotary values (pairs (j, j + rotary)) one over the
    whole head (pairs (j, j + head/2)): new j < rotary takes old j, new j + head/2 old j + rotary; the unturned
    values fill the gaps, in pairs that turn by angle 0 (padded_rotary). q and k permuted alike leave q.k, the head
    norms and so the attention unchanged; the GPU block then fuses the head norm and rotary into QKV's product
    (gpu/block.py _fused_heads: cos of head/2 columns) and turns v there for OUT."""
    rest = head // 2 - rotary
    return torch.cat([torch.arange(rotary), 2 * rotary + torch.arange(rest), rotary + torch.arange(rotary),
                      2 * rotary + rest + torch.arange(rest)])


def padded_rotary(cos: torch.Tensor, sin: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [rows, r] widened to [rows, head/2] by angle-0 columns (cos 1, sin 0: an exact identity), the
    rotary of head_order's heads."""
    pad = head // 2 - cos.shape[-1]
    return (torch.cat([cos, cos.new_ones(cos.shape[0], pad)], -1),
            torch.cat([sin, sin.new_zeros(sin.shape[0], pad)], -1))


def _read_block(ckpt: Checkpoint, stem: str, a: Arch, lin, rotary: int) -> Block:
    """Block `stem` (full key prefix): QKV as stored ([q; k; v]), its q and k rows and the head norms in
    head_order(a.head, rotary) (rotary: the turned pairs, 0 in the unrotated refiner), UP = gluRows of fc1's
    [gate; value] halves."""
    qkv = lin(f"{stem}attn.qkv_proj")
    if qkv.weight.shape != (a.qkv_width, a.hidden):
        raise WeightsError(f"{ckpt.path.name}: '{stem}attn.qkv_proj' is {tuple(qkv.weight.shape)}, expected "
                           f"{(a.qkv_width, a.hidden)}")
    order = head_order(a.head, rotary)
    heads = (torch.arange(2 * a.heads)[:, None] * a.head + order).reshape(-1)  # q's and k's heads
    qkv = qkv.rows(torch.cat([heads, 2 * a.inner + torch.arange(a.inner)]))
    up = lin(f"{stem}mlp.fc1").rows(torch.stack([torch.arange(a.ffn), a.ffn + torch.arange(a.ffn)], 1).reshape(-1))
    norm = lambda key, n: read_tensor(ckpt, f"{stem}{key}.weight", (n,))  # noqa: E731
    return Block((qkv, lin(f"{stem}attn.out_proj"), up, lin(f"{stem}mlp.fc2"), norm("norm1", a.hidden),
                  norm("norm2", a.hidden), norm("attn.q_norm", a.head)[order], norm("attn.k_norm", a.head)[order],
                  None, None))


def unrotated(rows: int, head: int) -> Sequence:
    """rows that attend with no rotary (every pair turned by angle 0, padded_rotary's) and one modulation row (the
    token refiner)."""
    cos, sin = padded_rotary(torch.zeros(rows, 0), torch.zeros(rows, 0), head)
    return Sequence(torch.zeros(rows, dtype=torch.long), cos, sin)


@dataclass(frozen=True)
class Layer:
    """One block and its modulation linear (adaln_proj: 40% of the block's bytes, or the pruned files' 8 columns),
    the unit that streams."""
    block: Block
    modulation: Linear   # time_dim (or the curve's rank) -> 3 modalities x 6 x hidden

    def on(self, device: torch.device) -> Layer:
        """The layer as it runs on a CUDA device: the block through the GPU block's linears (dit_core/gpu/block.py),
        the modulation too, unless it has fewer columns than a ConvRot group (the curve form's rank 8): f32 then,
        as ComfyUI applies it (3 MB a layer; bf16 would round the curve's coordinates)."""
        from ..gpu.block import GpuBlock, GpuLinear  # the GPU path: imported where used
        few = self.modulation.in_features < FEW_COLUMNS
        return Layer(GpuBlock.of(self.block, device),
                     float_on(self.modulation, device) if few else GpuLinear.of(self.modulation, device))

    def modulation_rows(self, temb: torch.Tensor, options) -> torch.Tensor:
        """adaln_proj(temb) [nT, 18 hidden] f32: the host linear, or the GPU linear's product (bf16 out)."""
        if isinstance(self.modulation, Linear):
            return linear(temb, self.modulation)
        from ..gpu.block import product
        return product(temb, self.modulation, options).float()


@dataclass(frozen=True)
class MiniMaxH3:
    """MiniMax H3 where it runs: the text embedder and token refiner, the video and audio embedders, the time
    embedding (an MLP, or the pruned files' table), the layers (blocks with their modulation linears), the final
    layer."""
    arch: Arch
    text_in: Linear
    refiners: tuple[Block, ...]
    refiner_norm: torch.Tensor
    video_in: Linear
    audio_in: Linear
    time: tuple[Linear, Linear] | None   # time_embedder: freq_dim -> time_hidden -> time_dim (SiLU between)
    time_table: torch.Tensor | None      # [grid, time_dim] f32: the curve form, already past the SiLU
    blocks: tuple[Layer, ...]            # or StreamedBlocks of them (dit_core/gpu/streaming.py)
    final_modulation: Linear             # time_dim -> [shift | scale]
    final_norm: torch.Tensor
    video_out: Linear
    audio_out: Linear
    # The GPU path's options (dit_core/gpu/options.py), passed to each block: set by to(), default_options()'s
    # unless given; None on a model never moved (the host blocks read none).
    options: object = field(default=None, compare=False)

    @staticmethod
    def default_options():
        """H3's GPU options: the engine's defaults (cuDNN's bf16 attention scores)."""
        from ..gpu.options import Options
        return Options(int8_attention=False)

    @property
    def device(self) -> torch.device:
        return self.video_in.weight.device

    @staticmethod
    def load(path: str | Path | Checkpoint, linears: str = "stored",
             loras: tuple[tuple[str | Path, float], ...] = (),
             compute_on: torch.device | None = None, blocks_on_use: bool = False) -> MiniMaxH3:
        """MiniMax H3 from the Comfy-Org single file (optional model.diffusion_model. prefix; the time embedding as
        time_embedder or as the pruned files' adaln_t_table). linears: 'stored' keeps each block linear as stored,
        'int8' quantizes float ones to INT8 ConvRot, 'bf16' dequantizes INT8 ones. loras: (file, strength) pairs in
        the file's own names, merged into the linears as they load. compute_on: the device that quantizes and
        merges them (OpenedFile). blocks_on_use: the layers read as they are placed (OpenedFile.blocks; for a model
        bound for a card: a 33 B model streamed keeps only its page-locked copy on the host)."""
        opened = OpenedFile.open(path, DETECTION, linears, compute_on)
        ckpt, p = opened.ckpt, opened.prefix
        a = read_arch(ckpt, p)
        opened = opened.with_loras(loras, lambda names: lora_aliases(names, a.inner))
        lin = lambda key: opened.linear(key[len(p):])  # noqa: E731 (key: the full prefix, less .weight)

        def block(stem: str, rotary: int, source: OpenedFile, i: int) -> Block:
            return source.convert(_read_block(source.ckpt, f"{p}{stem}{i}.", a,
                                              lambda key: source.linear(key[len(p):]), rotary))

        def layer(source: OpenedFile, i: int) -> Layer:
            return Layer(block("blocks.", a.rotary // 2, source, i), source.linear(f"blocks.{i}.adaln_proj.linear"))
        curve = f"{p}{TIME_TABLE}" in ckpt
        return MiniMaxH3(
            arch=a, text_in=lin(f"{p}condition_proj"),
            refiners=opened.blocks(functools.partial(block, "token_refiner.blocks.", 0), a.refiner),
            refiner_norm=read_tensor(ckpt, f"{p}token_refiner.final_norm.weight", (a.hidden,)),
            video_in=lin(f"{p}video_patch_proj"), audio_in=lin(f"{p}audio_patch_proj"),
            time=None if curve else (lin(f"{p}time_embedder.proj_in"), lin(f"{p}time_embedder.proj_out")),
            time_table=read_tensor(ckpt, f"{p}{TIME_TABLE}") if curve else None,
            blocks=opened.blocks(layer, a.layers, blocks_on_use),
            final_modulation=lin(f"{p}final_layer.adaln_proj.linear"),
            final_norm=read_tensor(ckpt, f"{p}final_layer.norm.weight", (a.hidden,)),
            video_out=lin(f"{p}final_layer.video_out"), audio_out=lin(f"{p}final_layer.audio_out"))

    def to(self, device: str | torch.device, budget_bytes: int | Callable[[int], int] | None = None,
           options=None) -> MiniMaxH3:
        """H3 where it runs: on a CUDA device the layers and the token refiner become GPU blocks (INT8 ConvRot
        linears on the matrix cores, or BF16; the modulation linears too), the small linears and tensors f32 there.
        With budget_bytes the layers take at most that much device memory: those that do not fit stream from host
        memory (dit_core/gpu/streaming.py; on the CPU through CPU slots, the same numerics); a function of the
        layers' total bytes is asked once the rest is on the device. options: the GPU path's (by default the
        model's, else default_options())."""
        from ..gpu.streaming import placed  # the GPU path: imported where used
        return placed(self, torch.device(device), budget_bytes, options or self.options or self.default_options())

    def gpu_form(self, device: torch.device, options, with_layers: bool = True) -> MiniMaxH3:
        """The model as the GPU path runs it on `device` (a CUDA device; on the CPU the kernels' references run,
        as the tests use it): GPU blocks and linears for the layers (unless with_layers is False) and the token
        refiner, the small linears and tensors f32."""
        from ..gpu.block import GpuBlock
        small = lambda lin: float_on(lin, device)  # noqa: E731
        return replace(self, text_in=small(self.text_in),
                       refiners=tuple(GpuBlock.of(b, device) for b in self.refiners),
                       refiner_norm=self.refiner_norm.float().to(device), video_in=small(self.video_in),
                       audio_in=small(self.audio_in), time=None if self.time is None else tuple(map(small, self.time)),
                       time_table=None if self.time_table is None else self.time_table.float().to(device),
                       blocks=tuple(layer.on(device) for layer in self.blocks) if with_layers else self.blocks,
                       final_modulation=small(self.final_modulation), final_norm=self.final_norm.float().to(device),
                       video_out=small(self.video_out), audio_out=small(self.audio_out), options=options)

    def curve_form(self, rank: int = 8, grid: int = CURVE_GRID) -> MiniMaxH3:
        """This (loaded, unpruned) model in the pruned files' curve form (section 5, variants): the time
        embedding's activation g(t) at `grid` times in [0, 1], centred, kept on its leading `rank` right singular
        vectors V: the table (G - mean) V, each modulation linear W V with bias b + W mean. Lossy by the truncation
        only (g is one smooth curve); the published files are made so. For benchmarks and tests of that form."""
        if self.time_table is not None or not isinstance(self.blocks, tuple):
            raise ValueError("MiniMaxH3.curve_form: a loaded model with its time embedder (not already a curve, not "
                             "streamed) is reduced")
        g = self.time_rows(torch.linspace(0, 1, grid, device=self.device)).double()
        mean = g.mean(0)
        basis = torch.linalg.svd(g - mean, full_matrices=False).Vh[:rank].T  # [time_dim, rank]

        def reduced(lin: Linear) -> Linear:
            w = lin.dequantized()
            bias = (w.double() @ mean).float() + (0 if lin.bias is None else lin.bias.float())
            return Linear((w @ basis.float()).contiguous(), bias)
        return replace(self, arch=replace(self.arch, freq_dim=0, time_hidden=0, time_dim=rank), time=None,
                       time_table=((g - mean) @ basis).float(),
                       blocks=tuple(replace(layer, modulation=reduced(layer.modulation)) for layer in self.blocks),
                       final_modulation=reduced(self.final_modulation))

    def time_rows(self, times: torch.Tensor) -> torch.Tensor:
        """The modulation linears' input [nT, time_dim] f32 for times t = 1 - sigma [nT]: silu(time_embedder(
        [cos | sin] of t)), t unscaled; or, in the curve form, the table at clamp(t, 0, 1) by linear interpolation
        between its grid points (ComfyUI's rule, section 5: the table already holds the activation)."""
        if self.time_table is None:
            first, second = self.time
            return F.silu(linear(F.silu(linear(sinusoids(times, self.arch.freq_dim), first)), second))
        grid = self.time_table.shape[0]
        pos = times.float().clamp(0, 1) * (grid - 1)
        i0 = pos.floor().long().clamp(max=grid - 2)
        table = self.time_table.to(times.device)
        return torch.lerp(table[i0], table[i0 + 1], (pos - i0)[:, None])

    def text_rows(self, text: torch.Tensor) -> torch.Tensor:
        """Text features [Nt, text_dim] -> refined rows [Nt, hidden]: context embedder, the unmodulated refiner
        blocks (no rotary), their final norm. They do not change between steps, so a sampler refines them once."""
        a = self.arch
        x = linear(text.to(self.device), self.text_in).to(torch.promote_types(text.dtype, torch.float32))
        seq, m = unrotated(x.shape[0], a.head).to(x.device), Modulation.identity(a.hidden, dtype=x.dtype, device=x.device)
        options = self.options and self.options.for_prompt_rows()
        for block in self.refiners:
            x = block.forward(a, x, m, seq, options=options)
        return rms_norm(x, self.refiner_norm, a.final_eps)

    def sequence(self, layout: Layout, time_index: torch.Tensor) -> Sequence:
        """The packed rows' Sequence: modulation row time_index * 3 + tag; angles of fp32 positions times the fp32
        frequencies, per axis, as diffusers and ComfyUI compute them (positions cast from float64 first)."""
        a = self.arch
        freqs = a.rope_axes[0] // 2
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, 2 * freqs, 2, dtype=torch.float32) / (2 * freqs)))
        angles = (layout.positions.float()[:, :, None] * inv_freq).reshape(layout.rows, -1)
        return Sequence(time_index.long() * MODALITIES + layout.tags, *padded_rotary(angles.cos(), angles.sin(),
                                                                                     a.head))

    def velocity(self, video: torch.Tensor, audio: torch.Tensor, txt: torch.Tensor, layout: Layout,
                 times: torch.Tensor, time_index: torch.Tensor, check: Callable[[], None] | None = None,
                 ranks=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(video velocity [video rows, 4C], audio velocity [audio rows, C_audio]) of one packed sequence: video rows
        [condition + target rows, 4C] (patchify's), audio rows [condition + target rows, C_audio] (channel-major),
        refined text rows txt [Nt, hidden] (text_rows'), the distinct times [nT] (t = 1 - sigma) and each row's
        index into them (row_times'). Condition rows' output is returned too; they are not stepped. check() runs
        after each block (ComfyUI's cancel within a step). ranks: the blocks run sequence-parallel across them
        (dit_core/parallel: each rank its share of the rows, gathered before the final layer); None: here alone."""
        a = self.arch
        want = (layout.video_rows.shape[0], layout.audio_rows.shape[0], layout.text)
        if (video.shape[0], audio.shape[0], txt.shape[0]) != want:
            raise ValueError(f"MiniMaxH3: {video.shape[0]} video, {audio.shape[0]} audio and {txt.shape[0]} text rows "
                             f"for a layout of {want[0]}, {want[1]} and {want[2]}")
        video_rows, audio_rows = layout.video_rows.to(txt.device), layout.audio_rows.to(txt.device)
        x = txt.new_zeros(layout.rows, a.hidden)
        x[:layout.text] = txt
        x[video_rows] = linear(video, self.video_in).to(x.dtype)
        x[audio_rows] = linear(audio, self.audio_in).to(x.dtype)
        temb = self.time_rows(times.to(txt.device))
        seq = self.sequence(layout, time_index).to(txt.device)
        shards = None
        if ranks is not None:
            from ..parallel import SequenceShards  # the sequence-parallel path: imported where used
            shards = SequenceShards.split(ranks, seq.map, (a.heads, a.kv_heads or a.heads))
            x, seq = shards.take(x), shards.sequence(seq)
        split = {} if shards is None else {"shards": shards}
        # the next norm's row statistics, carried between GPU blocks where a block's last kernel writes them
        carry = NormStats.of(x) if self.options is None or self.options.carry_norms else None
        for layer in self.blocks:
            # [nT, 18 hidden] -> rows t0m0, t0m1, t0m2, t1m0, ... of six [3 nT, hidden] parts, each contiguous
            # once here (the GPU kernels read them so: one copy a layer, not one a launch)
            rows = layer.modulation_rows(temb, self.options).reshape(-1, 6, a.hidden).transpose(0, 1).contiguous()
            x = layer.block.forward(a, x, Modulation(attn_scale=rows[SCALE1], attn_gate=rows[GATE1],
                                                     mlp_scale=rows[SCALE2], mlp_gate=rows[GATE2],
                                                     attn_shift=rows[SHIFT1], mlp_shift=rows[SHIFT2]), seq,
                                    carry, options=self.options, **split)
            if check is not None:
                check()
        if shards is not None:
            x = shards.gather(x)
        shift, scale = linear(temb, self.final_modulation).chunk(2, dim=-1)
        index = time_index.long().to(txt.device)
        y = rms_norm(x, self.final_norm, a.final_eps) * (1 + scale[index]) + shift[index]
        return linear(y[video_rows], self.video_out), linear(y[audio_rows], self.audio_out)

    def output(self, video: torch.Tensor, audio: torch.Tensor, text: torch.Tensor, layout: Layout,
               times: torch.Tensor, time_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """velocity() from the text encoder's features text [Nt, text_dim]."""
        return self.velocity(video, audio, self.text_rows(text), layout, times, time_index)

    def denoised(self, video: torch.Tensor, audio: torch.Tensor, txt: torch.Tensor, layout: Layout,
                 sigma_video: float, sigma_audio: float, check: Callable[[], None] | None = None,
                 ranks=None) -> tuple[torch.Tensor, torch.Tensor]:
        """x0 of the target rows, x + sigma v (H3's velocity points data-ward), each stream at its own sigma; the
        condition rows come back as given. Rows, txt and ranks as velocity's."""
        times, index = row_times(layout, 1.0 - sigma_video, 1.0 - sigma_audio)
        v_video, v_audio = self.velocity(video, audio, txt, layout, times, index, check, ranks)
        x0_video = video + sigma_video * v_video.to(video.dtype)
        x0_audio = audio + sigma_audio * v_audio.to(audio.dtype)
        x0_video[:layout.video_conditions] = video[:layout.video_conditions]
        x0_audio[:layout.audio_conditions] = audio[:layout.audio_conditions]
        return x0_video, x0_audio
