"""LTX-2.5 (audio + video, 22B distilled) on the shared block's pieces, on the host: the Comfy-Org single file ->
two streams (video, audio) through 48 blocks of six attentions and two GELU MLPs, one step over packed rows.

Facts: reference/families/ltx25.md (diffusers 0.42.1 transformer_ltx2.py; single_file_utils.py
convert_ltx2_transformer_to_diffusers for the names, whose inverse the file's names are). A block does not fit the
one-order 4-linear Block, so each stream runs the block's pieces (modulated_norm, attend, mlp) in LTX's order
(section 3): self-attention, prompt cross-attention, audio <-> video cross-attention on the time axis, MLP. Each
stream has its Arch (video 32 x 128, audio 32 x 64); A2V and V2A run in the audio stream's heads. Every head turns by
its own rotary angles (section 4: "split", the frequencies laid over all heads' values). Time is sigma * 1000 and
the velocity has the usual sign (x0 = x - sigma v).

Variants, read from the file's keys (section 9): the prompt's AdaLN (prompt_adaln_single; else the static tables),
the video MLP's biases, the keyframe marker, the per-head gates.

On a CUDA GPU (LTX25.to): a layer (both streams' parts of a block and the A<->V attentions) is the unit that stays on
the device or streams; its linears run through dit_core/gpu/block.py (INT8 ConvRot or BF16), its attentions and MLPs
as dit_core/gpu/pieces.py's pieces in this file's order (gpu_block). The rest (embedders, tables, final layers) f32.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import Attention, GroupBias, attend, layer_norm, mlp, modulated_norm
from ..linear import float_on, linear
from ..modulation import sinusoids, table_plus
from ..sequence import Sequence
from ..weights import Checkpoint, Linear, WeightsError, read_tensor
from .loading import Detection, OpenedFile
from .ltx25_positions import (
    ROPE_THETA,
    Grid,
    audio_midpoints,
    distinct,
    guide_bias,
    rotary,
    video_midpoints,
)

PREFIXES = ("model.diffusion_model.", "")
MARKER = "av_ca_a2v_gate_adaln_single.emb.timestep_embedder.linear_1.weight"
DETECTION = Detection((MARKER,), PREFIXES, "an LTX-2.5 audio-video diffusion model",
                      "an LTX-2.5 file such as ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors")
EPS = 1e-6  # block norms, q/k norms, final LayerNorm (section 1)
TIME_SCALE = 1000.0  # the model's time is sigma * 1000 (timestep_scale_multiplier)
# av_ca_timestep_scale_multiplier where the file's config does not say: the published configs' 1000 (section 9,
# item 7; ComfyUI's class default would be 1)
AV_TIME_SCALE = 1000.0
HEAD = {"video": 128, "audio": 64}  # head widths where neither gates nor the config say (section 1)
# A stream's nine modulation rows (section 3: p0..p8), and its A<->V table's five.
SHIFT_MSA, SCALE_MSA, GATE_MSA, SHIFT_MLP, SCALE_MLP, GATE_MLP, SHIFT_Q, SCALE_Q, GATE_Q = range(9)
A2V_SCALE, A2V_SHIFT, V2A_SCALE, V2A_SHIFT, AV_GATE = range(5)
PROMPT_SHIFT, PROMPT_SCALE = range(2)
# Where the A<->V modulation reads its time, as (scale/shift, gate) (section 9, item 1): "own" the stream's own
# (per-row) times, "other" the other stream's sigma. "comfyui" is ComfyUI's and ltx-core's rule; "cross" and "own"
# are diffusers' use_cross_timestep True and False.
AV_TIMES = {"comfyui": ("own", "other"), "cross": ("other", "other"), "own": ("own", "own")}


@dataclass(frozen=True)
class Side:
    """A stream's names in the file: a prefix on the names both streams share, and its words in the A<->V names."""
    name: str    # "video" | "audio"
    prefix: str  # "" | "audio_"
    gate: str    # its A<->V gate's direction: "a2v" (the video's) | "v2a"


VIDEO, AUDIO = Side("video", "", "a2v"), Side("audio", "audio_", "v2a")


@dataclass(frozen=True)
class TimeEmbedder:
    """AdaLayerNormSingle (section 2): emb = second(silu(first([cos | sin] of t))), rows = out(silu(emb))."""
    first: Linear
    second: Linear
    out: Linear

    def __call__(self, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(modulation rows [n, k D], embedding [n, D]) of times [n] (already x 1000), f32, where the weights are."""
        times = times.to(self.first.weight.device)
        emb = linear(F.silu(linear(sinusoids(times, self.first.in_features), self.first)), self.second)
        return linear(F.silu(emb), self.out), emb


@dataclass(frozen=True)
class StreamLayer:
    """One stream's part of a block: its self and prompt attentions, its MLP, and its three static tables."""
    self_attn: Attention
    text_attn: Attention
    up: Linear
    down: Linear
    table: torch.Tensor         # [9, D]: p0..p8 less the time embedding's
    prompt_table: torch.Tensor  # [2, D]: the prompt's shift, scale
    av_table: torch.Tensor      # [5, D]: A2V scale, shift, V2A scale, shift, and its A<->V gate


@dataclass(frozen=True)
class LTXBlock:
    """One layer: the unit that stays on the GPU or streams (dit_core/gpu/streaming.py)."""
    video: StreamLayer
    audio: StreamLayer
    a2v: Attention  # queries video, keys/values audio, in the audio stream's heads
    v2a: Attention  # queries audio, keys/values video

    def on(self, device: torch.device) -> LTXBlock:
        """The layer as it runs on a CUDA device: attentions and MLP linears through the GPU block's linears
        (dit_core/gpu/pieces.py), tables f32."""
        from ..gpu.block import GpuLinear  # the GPU path: imported where used
        from ..gpu.pieces import GpuAttention
        f32 = lambda t: t.float().to(device)  # noqa: E731

        def layer(s: StreamLayer) -> StreamLayer:
            return StreamLayer(GpuAttention.of(s.self_attn, device), GpuAttention.of(s.text_attn, device),
                               GpuLinear.of(s.up, device), GpuLinear.of(s.down, device), f32(s.table),
                               f32(s.prompt_table), f32(s.av_table))
        return LTXBlock(layer(self.video), layer(self.audio), GpuAttention.of(self.a2v, device),
                        GpuAttention.of(self.v2a, device))

    @property
    def gpu(self) -> bool:
        return not isinstance(self.a2v, Attention)

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> LTXBlock:
        """The layer with every INT8 linear as float weights of dtype, turned back from ConvRot's rotation (BF16 of
        the same INT8 weights: the reference INT8's fidelity is read against)."""
        def attention(w: Attention) -> Attention:
            return replace(w, **{k: float_linear(getattr(w, k), dtype) for k in ("q", "k", "v", "out")})

        def layer(s: StreamLayer) -> StreamLayer:
            return replace(s, self_attn=attention(s.self_attn), text_attn=attention(s.text_attn),
                           up=float_linear(s.up, dtype), down=float_linear(s.down, dtype))
        return LTXBlock(layer(self.video), layer(self.audio), attention(self.a2v), attention(self.v2a))


def float_linear(lin: Linear, dtype: torch.dtype) -> Linear:
    return lin.as_float(dtype) if lin.quantized else lin


@dataclass(frozen=True)
class Stream:
    """What a stream has once: its Arch, input projection, time embedders, final table and output projection."""
    arch: Arch
    proj_in: Linear
    time: TimeEmbedder
    prompt: TimeEmbedder | None  # the prompt's AdaLN (None: the blocks' static prompt tables alone)
    av_scale_shift: TimeEmbedder
    av_gate: TimeEmbedder
    out_table: torch.Tensor      # [2, D]: shift, scale
    proj_out: Linear

    def on(self, device: torch.device) -> Stream:
        """The stream's once-a-step parts f32 on device (small linears: float_on)."""
        small = lambda lin: float_on(lin, device)  # noqa: E731
        time = lambda t: None if t is None else TimeEmbedder(small(t.first), small(t.second), small(t.out))  # noqa
        return Stream(self.arch, small(self.proj_in), time(self.time), time(self.prompt), time(self.av_scale_shift),
                      time(self.av_gate), self.out_table.float().to(device), small(self.proj_out))


@dataclass(frozen=True)
class StreamStep:
    """One stream's step inputs, prepared once for all blocks: the rows' distinct times' modulation and each row's
    index into them (map), the prompt's, the A<->V scale/shift and gate rows with their maps, the rotary
    Sequences (self: all axes; cross: the time axis), the prompt rows and their key bias."""
    mod: torch.Tensor           # [nT, 9 D]
    emb: torch.Tensor           # [nT, D]
    prompt: torch.Tensor | None  # [1, 2 D]
    av: torch.Tensor            # [nA, 4 D]
    av_map: torch.Tensor
    gate: torch.Tensor          # [nG, D]
    gate_map: torch.Tensor
    seq: Sequence               # map: each row's distinct time
    cross: Sequence
    context: torch.Tensor
    key_bias: torch.Tensor | None
    self_bias: GroupBias | None = None  # on the self-attention's scores, a key bias a query group (guide_bias)
    shards: object = None  # dit_core/parallel SequenceShards: the rows are this rank's share (None: all rows here)

    def to(self, device: torch.device) -> StreamStep:
        """The step's inputs on device (maps int32 on a GPU, as the kernels read them)."""
        index = torch.int32 if device.type == "cuda" else torch.long
        on = lambda t: None if t is None else t.to(device)  # noqa: E731
        return StreamStep(on(self.mod), on(self.emb), on(self.prompt), on(self.av), self.av_map.to(device, index),
                          on(self.gate), self.gate_map.to(device, index), self.seq.to(device),
                          self.cross.to(device), on(self.context), on(self.key_bias), on(self.self_bias),
                          self.shards)

    def split(self, shards) -> StreamStep:
        """The step of this rank's share of the rows (shards: their SequenceShards): per-row maps and rotary taken;
        self_bias stays whole (the attention across ranks reads it in packed order)."""
        return replace(self, av_map=shards.take(self.av_map), gate_map=shards.take(self.gate_map),
                       seq=shards.sequence(self.seq), cross=shards.sequence(self.cross), shards=shards)


def _config(ckpt: Checkpoint) -> dict:
    """The transformer's config embedded in the file's header (ComfyUI's single files: metadata "config"), or {}."""
    raw = ckpt.metadata.get("config")
    if raw is None:
        return {}
    try:
        cfg = json.loads(raw)
    except ValueError as e:
        raise WeightsError(f"{ckpt.path.name}: the header's config is not JSON ({e})") from e
    return cfg.get("transformer", cfg) if isinstance(cfg, dict) else {}


def read_arch(ckpt: Checkpoint, p: str, side: Side, cfg: dict) -> Arch:
    """A stream's Arch from the file's shapes (section 1). Heads from the per-head gates where the file has them,
    else from its config, else the released head width (128 video, 64 audio)."""
    s, b = f"{p}{side.prefix}", f"{p}transformer_blocks.0.{side.prefix}"
    hidden, latents = ckpt.shape(f"{s}patchify_proj.weight")
    rows = ckpt.shape(f"{b}scale_shift_table")[0]
    if rows != 9:
        raise WeightsError(f"{ckpt.path.name}: the {side.name} blocks hold {rows} modulation rows, not LTX-2.5's 9 "
                           f"(LTX-2.0 files are not supported)")
    gate = f"{b}attn1.to_gate_logits.weight"
    key = "num_attention_heads" if side is VIDEO else "audio_num_attention_heads"
    heads = ckpt.shape(gate)[0] if gate in ckpt else int(cfg.get(key, hidden // HEAD[side.name]))
    if hidden % heads:
        raise WeightsError(f"{ckpt.path.name}: {heads} heads do not divide the {side.name} width {hidden}")
    time_hidden, freq_dim = ckpt.shape(f"{s}adaln_single.emb.timestep_embedder.linear_1.weight")
    return Arch(family="ltx25", hidden=hidden, layers=ckpt.numbered(f"{p}transformer_blocks.", ".attn1.to_q.weight"),
                refiner=0, heads=heads, head=hidden // heads, ffn=ckpt.shape(f"{b}ff.net.0.proj.weight")[0],
                latents=latents, patch=(1,) * (3 if side is VIDEO else 1),
                text_dim=ckpt.shape(f"{b}attn2.to_k.weight")[1], freq_dim=freq_dim, time_hidden=time_hidden,
                time_dim=hidden, eps=EPS, qk_eps=EPS, final_eps=EPS, rope_axes=(hidden // heads,),
                rope_theta=ROPE_THETA, mlp="gelu_tanh", qk_norm="across")


@dataclass(frozen=True)
class LTX25:
    """LTX-2.5's transformer where it runs: two Streams, the blocks, the keyframe marker, and the A<->V gates'
    time multiplier (av_ca_timestep_scale_multiplier)."""
    video: Stream
    audio: Stream
    blocks: tuple[LTXBlock, ...]  # or StreamedBlocks of them (dit_core/gpu/streaming.py)
    keyframe: torch.Tensor | None  # [D]: added to rows whose latent frame is one pixel frame (None: no marker)
    av_time_scale: float
    # The GPU path's options (dit_core/gpu/options.py), passed to each GPU piece: set by to(); None on a model never
    # moved (the host blocks read none).
    options: object = field(default=None, compare=False)

    @staticmethod
    def default_options():
        """LTX-2.5's GPU options: the engine's defaults (the audio's branches beside the video's: the graphed step
        on an H100 4% faster at stage 1, 1% at stage 2)."""
        from ..gpu.options import Options
        return Options()

    @property
    def device(self) -> torch.device:
        return self.video.proj_in.weight.device

    @property
    def arch(self) -> Arch:
        """The video stream's Arch: the wider one, which sizes a pass's memory (nodes/memory.py)."""
        return self.video.arch

    def to(self, device: str | torch.device, budget_bytes: int | Callable[[int], int] | None = None,
           options=None) -> LTX25:
        """LTX-2.5 where it runs: on a CUDA device the layers go through the GPU pieces (INT8 ConvRot linears on the
        matrix cores, or BF16), the rest f32 there. With budget_bytes the layers take at most that much device
        memory: those that do not fit stream from host memory (dit_core/gpu/streaming.py; on the CPU through CPU
        slots, the same numbers); a function of the layers' total bytes is asked once the rest is on the device.
        options: the GPU path's (by default the model's, else default_options())."""
        from ..gpu.streaming import placed  # the GPU path: imported where used
        return placed(self, torch.device(device), budget_bytes, options or self.options or self.default_options())

    def gpu_form(self, device: torch.device, options, with_layers: bool = True) -> LTX25:
        """The model as the GPU path runs it on `device` (a CUDA device; on the CPU the kernels' references run, as
        the tests use it): GPU layers (unless with_layers is False), the streams' small linears and tables f32."""
        return replace(self, video=self.video.on(device), audio=self.audio.on(device),
                       blocks=tuple(b.on(device) for b in self.blocks) if with_layers else self.blocks,
                       keyframe=None if self.keyframe is None else self.keyframe.float().to(device), options=options)

    @staticmethod
    def load(path: str | Path | Checkpoint) -> LTX25:
        """LTX-2.5 from the Comfy-Org single file (optional model.diffusion_model. prefix), each linear as stored
        (BF16, or INT8 ConvRot through the stored-format table); the connectors' tensors are not read."""
        opened = OpenedFile.open(path, DETECTION)
        ckpt, p = opened.ckpt, opened.prefix
        cfg = _config(ckpt)
        va, aa = read_arch(ckpt, p, VIDEO, cfg), read_arch(ckpt, p, AUDIO, cfg)
        if va.heads != aa.heads:
            raise WeightsError(f"{ckpt.path.name}: {va.heads} video heads and {aa.heads} audio heads: A<->V's rotary "
                               f"lays one time axis over both streams' heads alike")
        tensor = lambda key, shape=None: read_tensor(ckpt, p + key, shape)  # noqa: E731
        has = lambda key: p + key in ckpt  # noqa: E731

        def attention(stem: str) -> Attention:
            gate = f"{stem}.to_gate_logits"
            return Attention(*(opened.linear(f"{stem}.{n}") for n in ("to_q", "to_k", "to_v", "to_out.0")),
                             tensor(f"{stem}.q_norm.weight"), tensor(f"{stem}.k_norm.weight"),
                             opened.linear(gate) if has(f"{gate}.weight") else None)

        def embedder(stem: str) -> TimeEmbedder:
            time_mlp = f"{stem}.emb.timestep_embedder"
            return TimeEmbedder(opened.linear(f"{time_mlp}.linear_1"), opened.linear(f"{time_mlp}.linear_2"),
                                opened.linear(f"{stem}.linear"))

        def layer(i: int, side: Side, a: Arch) -> StreamLayer:
            b = f"transformer_blocks.{i}."
            s = b + side.prefix
            return StreamLayer(attention(f"{s}attn1"), attention(f"{s}attn2"), opened.linear(f"{s}ff.net.0.proj"),
                               opened.linear(f"{s}ff.net.2"), tensor(f"{s}scale_shift_table", (9, a.hidden)),
                               tensor(f"{s}prompt_scale_shift_table", (2, a.hidden)),
                               tensor(f"{b}scale_shift_table_a2v_ca_{side.name}", (5, a.hidden)))

        def stream(side: Side, a: Arch) -> Stream:
            s = side.prefix
            prompt = f"{s}prompt_adaln_single"
            return Stream(a, opened.linear(f"{s}patchify_proj"), embedder(f"{s}adaln_single"),
                          embedder(prompt) if has(f"{prompt}.linear.weight") else None,
                          embedder(f"av_ca_{side.name}_scale_shift_adaln_single"),
                          embedder(f"av_ca_{side.gate}_gate_adaln_single"),
                          tensor(f"{s}scale_shift_table", (2, a.hidden)), opened.linear(f"{s}proj_out"))

        blocks = tuple(LTXBlock(layer(i, VIDEO, va), layer(i, AUDIO, aa),
                                attention(f"transformer_blocks.{i}.audio_to_video_attn"),
                                attention(f"transformer_blocks.{i}.video_to_audio_attn")) for i in range(va.layers))
        keyframe = tensor("keyframes_abs_pos_embedding").reshape(-1) if has("keyframes_abs_pos_embedding") else None
        return LTX25(stream(VIDEO, va), stream(AUDIO, aa), blocks, keyframe,
                     float(cfg.get("av_ca_timestep_scale_multiplier", AV_TIME_SCALE)))

    def _step(self, s: Stream, times: torch.Tensor, map_: torch.Tensor, sigma: float, other_sigma: float,
              av_times: tuple[str, str], mid: torch.Tensor, cross_mid: torch.Tensor, context: torch.Tensor,
              key_bias: torch.Tensor | None) -> StreamStep:
        """A stream's StreamStep from its rows' distinct times [nT] (x 1000) and map, its own and the other
        stream's sigma, where the A<->V modulation reads its time, and its rows' RoPE midpoints (all axes; time)."""
        a, rows = s.arch, map_.shape[0]
        mod, emb = s.time(times)

        def at(source: str, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
            if source == "own":
                return times * scale, map_
            return torch.tensor([other_sigma * TIME_SCALE * scale]), torch.zeros(rows, dtype=torch.long)

        (av_t, av_map), (gate_t, gate_map) = at(av_times[0]), at(av_times[1], self.av_time_scale / TIME_SCALE)
        prompt = None if s.prompt is None else s.prompt(torch.tensor([sigma * TIME_SCALE]))[0]
        # A2V and V2A run in the audio stream's heads: the time axis is laid over audio.arch.width values
        cross_width = self.audio.arch.width
        return StreamStep(mod, emb, prompt, s.av_scale_shift(av_t)[0], av_map, s.av_gate(gate_t)[0], gate_map,
                          # the angles where the model runs, by axis (float64 over each axis's distinct midpoints)
                          rotary(mid.to(self.device), a.width, a.heads, map_),
                          rotary(cross_mid.to(self.device), cross_width, a.heads, map_),
                          context, key_bias)

    def forward(self, video: torch.Tensor, audio: torch.Tensor, text_video: torch.Tensor, text_audio: torch.Tensor,
                grid: Grid, sigma_video: float, sigma_audio: float, conditioned: torch.Tensor | None = None,
                text_mask: torch.Tensor | None = None, keyframes: torch.Tensor | None = None,
                av_times: str = "comfyui", rope_dtype: torch.dtype = torch.float64,
                check: Callable[[], None] | None = None, ranks=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(video velocity [grid.rows, C], audio velocity [M, C_audio]) of one step over the packed rows: video
        latent rows [grid.rows, C] (frame-major, then y, x), audio rows [M, C_audio] (8 channels x 16 mel bins a
        row), the connectors' prompt rows for each stream [L, D] and [L, D_audio], f32.
        conditioned [grid.rows]: 1 on clean (conditioning) video rows, whose time is sigma (1 - conditioned) x 1000
        (section 7); text_mask [L]: 1 on the prompt rows to attend (None: all); keyframes [grid.rows] bool: rows that
        take the keyframe marker (ignored without one; keyframe_rows(grid) as ComfyUI marks them). grid.guides: the
        guide frames' rows, last, at their own times, attended as guide_bias says. av_times: a key of AV_TIMES.
        rope_dtype: float64 (the release's frequencies_precision) or float32 (diffusers' rounding, section 9 item 3).
        check() runs after each block (it raises: ComfyUI's Cancel within a step). Runs where the model is; the
        velocities come back on the inputs' devices. ranks: the blocks run sequence-parallel across them
        (dit_core/parallel: each rank its share of each stream's rows, gathered before the final layers; host or
        GPU blocks); None: here alone."""
        rows, host, whole, keyframe_rows = self._placed(video, audio, text_video, text_audio, grid, sigma_video,
                                                        sigma_audio, conditioned, text_mask, keyframes, av_times,
                                                        rope_dtype)
        shares = whole
        if ranks is not None:
            from ..parallel import SequenceShards  # the sequence-parallel path: imported where used
            heads = (self.audio.arch.heads,) * 2  # A<->V run in the audio stream's heads, as many as the video's
            shares = tuple(step.split(SequenceShards.split(ranks, step.seq.map, heads)).to(self.device)
                           for step in host)
        v, a = self.velocities(*rows, whole, shares, keyframe_rows, check)
        return v.to(video.device), a.to(audio.device)

    def _placed(self, video: torch.Tensor, audio: torch.Tensor, text_video: torch.Tensor, text_audio: torch.Tensor,
                grid: Grid, sigma_video: float, sigma_audio: float, conditioned: torch.Tensor | None,
                text_mask: torch.Tensor | None, keyframes: torch.Tensor | None, av_times: str,
                rope_dtype: torch.dtype) -> tuple:
        """forward's arguments checked and where the model runs: ((video, audio) rows, the StreamSteps on the host
        (their maps made there: a rank's share is taken there, so its Sequence keeps its starts) and on the device,
        the keyframe rows)."""
        if av_times not in AV_TIMES:
            raise ValueError(f"LTX25: av_times must be one of {tuple(AV_TIMES)}, got {av_times!r}")
        v_s, a_s = self.video, self.audio
        if video.shape != (grid.rows, v_s.proj_in.in_features) or audio.shape[1] != a_s.proj_in.in_features:
            raise ValueError(f"LTX25: video rows {tuple(video.shape)} for a grid of {grid.rows} rows of "
                             f"{v_s.proj_in.in_features}, audio rows {tuple(audio.shape)} of "
                             f"{a_s.proj_in.in_features}")
        dev = self.device
        host = self.steps(audio.shape[0], text_video, text_audio, grid, sigma_video, sigma_audio, conditioned,
                          text_mask, av_times, rope_dtype)
        return ((video.to(dev), audio.to(dev)), host, tuple(step.to(dev) for step in host),
                None if keyframes is None else keyframes.to(dev))

    def velocities(self, video: torch.Tensor, audio: torch.Tensor, whole: tuple[StreamStep, StreamStep],
                   shares: tuple[StreamStep, StreamStep], keyframes: torch.Tensor | None = None,
                   check: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """forward's work where the model is, from its inputs and StreamSteps there (whole: all rows; shares: this
        rank's share, the same steps when not sequence-parallel). With every block resident nothing in it waits
        for the host or copies from it, so a CUDA graph can capture it (graphed)."""
        (sv, sa), v_s, a_s = shares, self.video, self.audio
        v, a = linear(video.float(), v_s.proj_in), linear(audio.float(), a_s.proj_in)
        if self.keyframe is not None and keyframes is not None:
            v = v + keyframes.bool().float()[:, None] * self.keyframe
        if sv.shards is not None:
            v, a = sv.shards.take(v), sa.shards.take(a)
        for block in self.blocks:
            v, a = gpu_block(self, block, v, a, sv, sa) if block.gpu else self.block(block, v, a, sv, sa)
            if check is not None:
                check()
        if sv.shards is not None:
            v, a = sv.shards.gather(v), sa.shards.gather(a)
        sv, sa = whole
        return self.final(v_s, v, sv), self.final(a_s, a, sa)

    def graphed(self, capture: str = "always") -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """forward() with its blocks and final layers replayed from one CUDA graph a step (dit_core/gpu/step_graph.py)
        on a CUDA device while every layer is resident, else forward() itself; the steps' rows (steps()) are made
        eagerly each call and copied into the graph's inputs. Sequence-parallel calls (ranks) run eagerly. check() is
        asked before a replayed step, not within it. step.clear() drops the graphs and their memory pool: call it
        before the layers move or the model goes (LoadedModels.attached); step.graphs: the GraphedStep.
        capture: GraphedStep's ("host_bound": captured only where a graph pays)."""
        if self.device.type != "cuda":
            return self.forward
        from ..gpu.step_graph import ModelGraphs, from_tensor_tree, tensor_tree

        def replayed(*tensors: torch.Tensor, structure) -> tuple[torch.Tensor, torch.Tensor]:
            video, audio, whole, keyframes = from_tensor_tree(structure, tensors)
            return self.velocities(video, audio, whole, whole, keyframes)
        graphs = ModelGraphs(replayed, capture=capture)

        def step(video: torch.Tensor, audio: torch.Tensor, text_video: torch.Tensor, text_audio: torch.Tensor,
                 grid: Grid, sigma_video: float, sigma_audio: float, conditioned: torch.Tensor | None = None,
                 text_mask: torch.Tensor | None = None, keyframes: torch.Tensor | None = None,
                 av_times: str = "comfyui", rope_dtype: torch.dtype = torch.float64,
                 check: Callable[[], None] | None = None, ranks=None) -> tuple[torch.Tensor, torch.Tensor]:
            if ranks is not None or not graphs.usable(self.blocks):
                return self.forward(video, audio, text_video, text_audio, grid, sigma_video, sigma_audio, conditioned,
                                    text_mask, keyframes, av_times, rope_dtype, check, ranks)
            if check is not None:
                check()
            (v, a), _, whole, keyframe_rows = self._placed(video, audio, text_video, text_audio, grid, sigma_video,
                                                           sigma_audio, conditioned, text_mask, keyframes, av_times,
                                                           rope_dtype)
            tensors, structure = tensor_tree((v, a, whole, keyframe_rows))
            v, a = graphs.steps[0](*tensors, structure=structure)
            return v.to(video.device), a.to(audio.device)
        step.clear, step.graphs = graphs.clear, graphs.steps
        return step

    def steps(self, audio_rows: int, text_video: torch.Tensor, text_audio: torch.Tensor, grid: Grid,
              sigma_video: float, sigma_audio: float, conditioned: torch.Tensor | None = None,
              text_mask: torch.Tensor | None = None, av_times: str = "comfyui",
              rope_dtype: torch.dtype = torch.float64) -> tuple[StreamStep, StreamStep]:
        """The video and audio StreamSteps of forward's arguments (its docstring), made once for all blocks."""
        v_s, a_s = self.video, self.audio
        key_bias = None if text_mask is None else (1 - text_mask.float()) * -10000.0
        unmasked = torch.ones(grid.rows) if conditioned is None else 1 - conditioned.float().cpu()
        v_times, v_map = distinct(sigma_video * TIME_SCALE * unmasked)
        a_times, a_map = torch.tensor([sigma_audio * TIME_SCALE]), torch.zeros(audio_rows, dtype=torch.long)
        v_mid, a_mid = video_midpoints(grid, rope_dtype), audio_midpoints(audio_rows, rope_dtype)
        times = AV_TIMES[av_times]
        sv = replace(self._step(v_s, v_times, v_map, sigma_video, sigma_audio, times, v_mid, v_mid[:, :1],
                                text_video.float(), key_bias), self_bias=guide_bias(grid))
        sa = self._step(a_s, a_times, a_map, sigma_audio, sigma_video, times, a_mid, a_mid, text_audio.float(),
                        key_bias)
        return sv, sa

    def block(self, block: LTXBlock, v: torch.Tensor, a: torch.Tensor, sv: StreamStep,
              sa: StreamStep) -> tuple[torch.Tensor, torch.Tensor]:
        """One block over both streams (section 3): self, prompt, A<->V (both read the streams before either
        adds), MLP."""
        va, aa = self.video.arch, self.audio.arch
        pv, pa = table_plus(block.video.table, sv.mod), table_plus(block.audio.table, sa.mod)
        v = self_and_prompt(va, block.video, v, pv, sv)
        a = self_and_prompt(aa, block.audio, a, pa, sa)
        cv, ca = table_plus(block.video.av_table[:4], sv.av), table_plus(block.audio.av_table[:4], sa.av)
        gv, ga = block.video.av_table[AV_GATE] + sv.gate, block.audio.av_table[AV_GATE] + sa.gate
        q = modulated_norm(va, v, None, cv[A2V_SHIFT], cv[A2V_SCALE], sv.av_map)
        kv = modulated_norm(aa, a, None, ca[A2V_SHIFT], ca[A2V_SCALE], sa.av_map)
        a2v = gv[sv.gate_map] * attend(aa, block.a2v, q, kv, sv.cross, sa.cross, shards=sv.shards, keys=sa.shards)
        q = modulated_norm(aa, a, None, ca[V2A_SHIFT], ca[V2A_SCALE], sa.av_map)
        kv = modulated_norm(va, v, None, cv[V2A_SHIFT], cv[V2A_SCALE], sv.av_map)
        a = a + ga[sa.gate_map] * attend(aa, block.v2a, q, kv, sa.cross, sv.cross, shards=sa.shards, keys=sv.shards)
        v = v + a2v
        return feed_forward(va, block.video, v, pv, sv), feed_forward(aa, block.audio, a, pa, sa)

    @staticmethod
    def final(s: Stream, x: torch.Tensor, step: StreamStep) -> torch.Tensor:
        """LayerNorm (no affine) times 1 + scale, plus shift (the final table plus each row's time embedding), then
        the output projection."""
        shift = s.out_table[0] + step.emb
        scale = s.out_table[1] + step.emb
        y = layer_norm(x, s.arch.final_eps) * (1 + scale[step.seq.map]) + shift[step.seq.map]
        return linear(y, s.proj_out)


def self_and_prompt(a: Arch, layer: StreamLayer, x: torch.Tensor, p: torch.Tensor, step: StreamStep) -> torch.Tensor:
    """A stream's self-attention and prompt cross-attention (section 3, steps 1-4); p: its nine rows [9, nT, D]. The
    prompt rows are modulated by the static prompt table plus the prompt's AdaLN at the stream's sigma, if any."""
    m = step.seq.map
    h = modulated_norm(a, x, None, p[SHIFT_MSA], p[SCALE_MSA], m)
    x = x + p[GATE_MSA][m] * attend(a, layer.self_attn, h, h, step.seq, step.seq, step.self_bias, step.shards)
    h = modulated_norm(a, x, None, p[SHIFT_Q], p[SCALE_Q], m)
    return x + p[GATE_Q][m] * attend(a, layer.text_attn, h, prompt_rows(layer, step), key_bias=step.key_bias)


def prompt_rows(layer: StreamLayer, step: StreamStep) -> torch.Tensor:
    """The prompt rows a stream's text attention reads: modulated by the static prompt table plus the prompt's
    AdaLN at the stream's sigma, if any."""
    kv_mod = layer.prompt_table if step.prompt is None else table_plus(layer.prompt_table, step.prompt[None])[:, 0]
    return step.context * (1 + kv_mod[PROMPT_SCALE]) + kv_mod[PROMPT_SHIFT]


def feed_forward(a: Arch, layer: StreamLayer, x: torch.Tensor, p: torch.Tensor, step: StreamStep) -> torch.Tensor:
    m = step.seq.map
    return x + p[GATE_MLP][m] * mlp(modulated_norm(a, x, None, p[SHIFT_MLP], p[SCALE_MLP], m), layer.up,
                                    layer.down, a.mlp)


def gpu_block(model: LTX25, block: LTXBlock, v: torch.Tensor, a: torch.Tensor, sv: StreamStep,
              sa: StreamStep) -> tuple[torch.Tensor, torch.Tensor]:
    """LTX25.block on the GPU pieces (dit_core/gpu/pieces.py), v and a updated in place: each branch added under its
    gate in its OUT's / DOWN's product epilogue. The A<->V attentions both read the streams before either adds. The
    audio's self, prompt and MLP branches run on a side stream beside the video's (step_graph.side_stream: its few
    rows' kernels leave most SMs idle)."""
    from ..gpu.pieces import attention_rows, beside, into, mlp_into, modulated_rows  # the GPU path: where used
    from ..gpu.step_graph import side_stream
    o, va, aa = model.options, model.video.arch, model.audio.arch
    pv, pa = table_plus(block.video.table, sv.mod), table_plus(block.audio.table, sa.mod)
    side = side_stream(v, "LTX-2.5 audio rows", o.concurrent_modes, sv.shards)

    def self_and_prompt(arch: Arch, layer: StreamLayer, x: torch.Tensor, p: torch.Tensor, step: StreamStep) -> None:
        m = step.seq.map
        h = modulated_rows(arch, x, p[SHIFT_MSA], p[SCALE_MSA], m)
        heads = attention_rows(arch, layer.self_attn, h, h, step.seq, step.seq, step.self_bias, o, step.shards)
        into(x, heads, layer.self_attn, p[GATE_MSA], m, o)
        h = modulated_rows(arch, x, p[SHIFT_Q], p[SCALE_Q], m)
        heads = attention_rows(arch, layer.text_attn, h, prompt_rows(layer, step), bias=step.key_bias, options=o)
        into(x, heads, layer.text_attn, p[GATE_Q], m, o)

    def mlp_of(arch: Arch, layer: StreamLayer, x: torch.Tensor, p: torch.Tensor, step: StreamStep) -> None:
        mlp_into(arch, x, p[SHIFT_MLP], p[SCALE_MLP], step.seq.map, layer.up, layer.down, p[GATE_MLP], o)

    video, audio = (va, block.video, v, pv, sv), (aa, block.audio, a, pa, sa)
    beside(side, lambda: self_and_prompt(*audio), lambda: self_and_prompt(*video))
    cv, ca = table_plus(block.video.av_table[:4], sv.av), table_plus(block.audio.av_table[:4], sa.av)
    gv, ga = block.video.av_table[AV_GATE] + sv.gate, block.audio.av_table[AV_GATE] + sa.gate
    # each stream's rows under both modulations from one read: A->V's queries and V->A's keys of the video rows
    video_a2v, video_v2a = modulated_rows(va, v, cv[A2V_SHIFT], cv[A2V_SCALE], sv.av_map,
                                          also=(cv[V2A_SHIFT], cv[V2A_SCALE]))
    audio_a2v, audio_v2a = modulated_rows(aa, a, ca[A2V_SHIFT], ca[A2V_SCALE], sa.av_map,
                                          also=(ca[V2A_SHIFT], ca[V2A_SCALE]))
    a2v = attention_rows(aa, block.a2v, video_a2v, audio_a2v, sv.cross, sa.cross, options=o, shards=sv.shards,
                         keys=sa.shards)
    del video_a2v, audio_a2v
    v2a = attention_rows(aa, block.v2a, audio_v2a, video_v2a, sa.cross, sv.cross, options=o, shards=sa.shards,
                         keys=sv.shards)
    into(a, v2a, block.v2a, ga, sa.gate_map, o)
    into(v, a2v, block.a2v, gv, sv.gate_map, o)
    beside(side, lambda: mlp_of(*audio), lambda: mlp_of(*video))
    return v, a
