"""LTX-2.5's text connectors (the DiT file's `*_embeddings_connector`): the text encoder's per-modality features
of a prompt -> the transformer's video and audio text rows. Linears of the load's dtype (f32: the host reference;
BF16 on a GPU), registers, norms, residual stream and attention in f32.

reference/families/ltx25.md section 5; diffusers 0.42.1 `pipelines/ltx2/connectors.py` (`LTX2TextConnectors`) is
the oracle (tests/dit_core/text/test_ltx25_text.py)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..weights import Checkpoint, Linear, WeightsError, read_linear, read_tensor
from .loading import weight_on

ROWS = 1024  # the text rows a prompt gives (diffusers' max_sequence_length: the encoder pads to it)
RMS_EPS = 1e-6  # the connectors' weightless norms and q/k norms (not in the tensors)
CONNECTORS = ("model.diffusion_model.", "")  # where a DiT file (or a bare connector file) holds the connectors
# Connector RoPE (diffusers LTX2RotaryPosEmbed1d as LTX2TextConnectors builds it): positions i / 4096, base 10000.
CONNECTOR_ROPE_LENGTH = 4096
CONNECTOR_ROPE_THETA = 10_000.0


@dataclass(frozen=True)
class ConnectorBlock:
    """One connector block: x += attn(rms(x)); x += ff(rms(x))."""
    q: Linear
    k: Linear
    v: Linear
    out: Linear
    gate: Linear | None  # per-head 2*sigmoid gate (LTX-2.3+)
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    up: Linear
    down: Linear


@dataclass(frozen=True)
class Connector:
    """One modality's connector: registers replace padding, blocks, a final weightless RMS norm."""
    registers: torch.Tensor  # [R, width]
    blocks: tuple[ConnectorBlock, ...]
    heads: int

    @property
    def width(self) -> int:
        return self.registers.shape[1]


def _linear(lin: Linear, device, dtype: torch.dtype) -> Linear:
    """lin as dtype on device, moved as stored and converted there (f32: lin.dequantized(), bit for bit)."""
    return Linear(weight_on(lin, dtype, device), None if lin.bias is None else lin.bias.to(device, dtype))


def read_connector(ckpt: Checkpoint, prefix: str, heads: int | None, device,
                   dtype: torch.dtype = torch.float32) -> Connector:
    """`<prefix>learnable_registers` and `<prefix>transformer_1d_blocks.N.*` (the original names, as ComfyUI's DiT
    files hold them); heads from the gate's rows unless given. Linears dtype on device, the rest f32 there."""
    markers = ckpt.quantization_markers()
    stem = f"{prefix}transformer_1d_blocks."
    n_blocks = ckpt.numbered(stem, ".attn1.to_q.weight")
    if n_blocks == 0:
        raise WeightsError(f"{ckpt.path.name}: no '{stem}0.attn1.to_q.weight'; the connectors are in the LTX-2.5 "
                           f"DiT file (ltx-2.5-22b-distilled-transformer-comfy-int8-convrot)")
    registers = read_tensor(ckpt, f"{prefix}learnable_registers", device=device)
    width = registers.shape[1]
    blocks = []

    def lin(name: str) -> Linear:
        return _linear(read_linear(ckpt, name, markers), device, dtype)

    for i in range(n_blocks):
        b = f"{stem}{i}."
        gate = lin(f"{b}attn1.to_gate_logits") if f"{b}attn1.to_gate_logits.weight" in ckpt else None
        blocks.append(ConnectorBlock(
            q=lin(f"{b}attn1.to_q"), k=lin(f"{b}attn1.to_k"), v=lin(f"{b}attn1.to_v"), out=lin(f"{b}attn1.to_out.0"),
            gate=gate, q_norm=read_tensor(ckpt, f"{b}attn1.q_norm.weight", (width,), device=device),
            k_norm=read_tensor(ckpt, f"{b}attn1.k_norm.weight", (width,), device=device),
            up=lin(f"{b}ff.net.0.proj"), down=lin(f"{b}ff.net.2")))
    if heads is None:
        if blocks[0].gate is None:
            raise WeightsError(f"{ckpt.path.name}: '{prefix}' has no gate to count its heads by; pass heads")
        heads = blocks[0].gate.out_features
    if width % (2 * heads):
        raise WeightsError(f"{ckpt.path.name}: '{prefix}' width {width} does not split into {heads} heads of "
                           f"rotary pairs")
    return Connector(registers, tuple(blocks), heads)


def _rms(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)
    return x if weight is None else x * weight


def _apply(lin: Linear, x: torch.Tensor) -> torch.Tensor:
    """lin(x), x's dtype out: a BF16 linear takes x rounded to BF16 (the rest of the block stays f32)."""
    if lin.weight.dtype == x.dtype:
        return F.linear(x, lin.weight, lin.bias)
    return F.linear(x.to(lin.weight.dtype), lin.weight, lin.bias).to(x.dtype)


def connector_rotary(rows: int, width: int, heads: int, f64: bool,
                     device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [heads, rows, width / (2 heads)] of the connectors' 1-D split RoPE: angle_j(i) = f_j (2 i / 4096 - 1),
    f_j = 10000^(j / (width/2 - 1)) pi / 2, the width/2 angles dealt to heads in order. f64: whole angles in f64
    (ltx-core, ComfyUI); otherwise as diffusers (f64 ladder cast to f32, the product in f32): up to ~1e-3 apart in
    cos (reference/families/ltx25.md section 9, item 3)."""
    ladder = torch.pow(CONNECTOR_ROPE_THETA, torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64)) * (math.pi / 2)
    grid = torch.arange(rows, dtype=torch.float32) / CONNECTOR_ROPE_LENGTH
    if f64:
        angles = (grid.double()[:, None] * 2 - 1) * ladder
    else:
        angles = (grid[:, None] * 2 - 1) * ladder.float()
    angles = angles.reshape(rows, heads, -1).transpose(0, 1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def _rotate_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [heads, rows, head]: pairs (i, i + head/2) of each head rotated."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def run_connector(c: Connector, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Blocks and the final norm over rows x [rows, width] (every row attends every row)."""
    rows, heads = x.shape[0], c.heads
    cos, sin = rotary
    for b in c.blocks:
        h = _rms(x)
        q, k, v = (t.reshape(rows, heads, -1).transpose(0, 1) for t in (
            _rms(_apply(b.q, h), b.q_norm), _rms(_apply(b.k, h), b.k_norm), _apply(b.v, h)))
        o = F.scaled_dot_product_attention(_rotate_split(q, cos, sin), _rotate_split(k, cos, sin), v)
        if b.gate is not None:
            o = o * (2 * torch.sigmoid(_apply(b.gate, h))).transpose(0, 1)[..., None]
        x = x + _apply(b.out, o.transpose(0, 1).reshape(rows, -1))
        x = x + _apply(b.down, F.gelu(_apply(b.up, _rms(x)), approximate="tanh"))
    return _rms(x)


class LTX25TextConnectors:
    """The video and audio connectors: features of n valid tokens -> the DiT's text rows, `rows` of each (valid
    tokens first, then the learnable registers of their absolute rows), all attended (mask of ones)."""

    def __init__(self, video: Connector, audio: Connector, rows: int = ROWS, rope_f64: bool = True):
        for name, c in (("video", video), ("audio", audio)):
            if rows % c.registers.shape[0]:
                raise ValueError(f"LTX25TextConnectors: {rows} rows do not tile the {name} connector's "
                                 f"{c.registers.shape[0]} registers")
        self.video, self.audio = video, audio
        self.rows = rows
        self.rope_f64 = rope_f64

    @classmethod
    def load(cls, path: str | os.PathLike | Checkpoint, rows: int = ROWS, rope_f64: bool = True,
             heads: int | None = None, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32) -> LTX25TextConnectors:
        """From the LTX-2.5 DiT file (`model.diffusion_model.{video,audio}_embeddings_connector.*`) or a file of the
        connectors alone, on device: linears dtype (read one at a time as stored and converted there; BF16 on a
        GPU), the rest f32. rope_f64: production angles (True) or diffusers' (False, its tests)."""
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
        base = ckpt.prefix_of(("video_embeddings_connector.learnable_registers",), CONNECTORS)
        if base is None:
            raise WeightsError(f"{ckpt.path.name}: no 'model.diffusion_model.video_embeddings_connector.*'; the "
                               f"LTX-2.5 connectors are in ltx-2.5-22b-distilled-transformer-comfy-int8-convrot")
        video, audio = (read_connector(ckpt, f"{base}{m}_embeddings_connector.", heads, device, dtype)
                        for m in ("video", "audio"))
        return cls(video, audio, rows, rope_f64)

    @property
    def device(self) -> torch.device:
        return self.video.registers.device

    def connect(self, c: Connector, features: torch.Tensor) -> torch.Tensor:
        n = features.shape[0]
        if n > self.rows:
            raise ValueError(f"LTX25TextConnectors: {n} tokens, more than the {self.rows} text rows")
        registers = c.registers.repeat(self.rows // c.registers.shape[0], 1)
        x = torch.cat((features.to(registers), registers[n:]))
        return run_connector(c, x, connector_rotary(self.rows, c.width, c.heads, self.rope_f64, x.device))

    @torch.no_grad()
    def __call__(self, video: torch.Tensor, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(video rows [1, rows, video width], audio rows [1, rows, audio width], mask [1, rows] of ones), f32 on the
        connectors' device, from the encoder's features [1, n, width] of one prompt (on any device)."""
        v, a = self.connect(self.video, video[0].float()), self.connect(self.audio, audio[0].float())
        return v[None], a[None], torch.ones(1, self.rows, dtype=torch.long, device=v.device)
