"""The shared AdaLN block: modulated norms, attention over a packed sequence with rotary positions, gated MLP.

This is the host reference (f32 or f64 on the CPU) of every later GPU kernel. The block's linears, norms and
attention go through the small functions below, the seams a GPU path replaces (kernels/). They are pieces a family
may call one at a time in its own order (issue 36): modulated_norm, Block.attend (fused QKV), attend (an Attention's
own q, k, v linears: self or cross, rotary per side, a key mask, a per-head gate) and mlp (SwiGLU or GELU).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from .arch import Arch
from .linear import linear
from .modulation import Modulation
from .sequence import Sequence, rotate_halves
from .weights import Linear

# Indexes of Block.w (seed 000): 4 linears [out, in] as stored, then the norm weights (f32; None if absent).
QKV, OUT, UP, DOWN, NORM1, NORM2, Q_NORM, K_NORM, POST_ATTN, POST_MLP = range(10)
LINEARS = (QKV, OUT, UP, DOWN)
BLOCK_TENSORS = ("qkv", "out", "up", "down", "norm1", "norm2", "q_norm", "k_norm", "post_attn", "post_mlp")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.to(x.dtype)


def layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def modulated_norm(a: Arch, x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor | None,
                   scale: torch.Tensor, map_: torch.Tensor) -> torch.Tensor:
    """norm(x) * (1 + scale[map]) + shift[map]: each row takes its modulation row."""
    y = rms_norm(x, weight, a.eps) if a.norm == "rms" else layer_norm(x, a.eps)
    y = y * (1 + scale.to(x.dtype)[map_])
    return y if shift is None else y + shift.to(x.dtype)[map_]


def head_norm_rotary(t: torch.Tensor, weight: torch.Tensor | None, a: Arch, s: Sequence | None) -> torch.Tensor:
    """t [rows, heads, head]: each head over its RMS (a.qk_norm "head") or all of a row's heads over theirs
    ("across"), times the norm's gain; then each head's first values turned by s's cos/sin (s None: not turned)."""
    if weight is not None:
        t = rms_norm(t, weight, a.qk_eps) if a.qk_norm == "head" else rms_norm(t.flatten(1), weight,
                                                                                 a.qk_eps).view_as(t)
    return t if s is None else rotate_halves(t, *s.rotary())


def split_qkv(a: Arch, qkv: torch.Tensor) -> tuple:
    """QKV's product [rows, a.qkv_width] as q [rows, heads, head], k and v [rows, key heads, head], and the attention
    gate's values [rows, hidden] (None without a gate): views, in the order QKV's rows hold them."""
    rows, widths = qkv.shape[0], (a.width, a.key_width, a.key_width, a.width if a.attn_gate else 0)
    q, k, v, gate = torch.split(qkv, widths, dim=-1)
    q, k, v = (t.reshape(rows, -1, a.head) for t in (q, k, v))
    return q, k, v, gate if a.attn_gate else None


@dataclass(frozen=True)
class GroupBias:
    """A bias on attention scores that depends on the query only through its group (LTX-2.5's guide frames): keys
    [groups, keys] f32, group i's bias on every key; rows, group i's query rows: a span (first, end) or a long
    tensor of indexes; plain, group i's bias is 0 on every key (no mask needed); key_spans, the runs of keys
    (first, end) over which every group's bias is constant (a few for guides: the generated keys, each guide's).
    Every query row is in one group. O(groups x keys + rows) values where the dense bias is [rows, keys]."""
    keys: torch.Tensor
    rows: tuple
    plain: tuple[bool, ...]
    key_spans: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def of(keys: torch.Tensor, rows: list) -> GroupBias:
        """From each group's key bias and rows (spans or index tensors); runs where keys is (once, at a step)."""
        cuts = [0, *((keys[:, 1:] != keys[:, :-1]).any(0).nonzero().flatten() + 1).tolist(), keys.shape[1]]
        return GroupBias(keys, tuple(rows), tuple(bool((b == 0).all()) for b in keys),
                         tuple(zip(cuts[:-1], cuts[1:])))

    @property
    def queries(self) -> int:
        return sum(r[1] - r[0] if isinstance(r, tuple) else r.numel() for r in self.rows)

    def to(self, device: torch.device) -> GroupBias:
        return GroupBias(self.keys.to(device), tuple(r if isinstance(r, tuple) else r.to(device) for r in self.rows),
                         self.plain, self.key_spans)

    def numel(self) -> int:
        """The values it holds (keys' and the index tensors'): O(rows), never rows x keys."""
        return self.keys.numel() + sum(0 if isinstance(r, tuple) else r.numel() for r in self.rows)

    def take(self, i: int, t: torch.Tensor, dim: int) -> torch.Tensor:
        """Group i's rows of t along dim (a view where they are a span)."""
        r = self.rows[i]
        return t.narrow(dim, r[0], r[1] - r[0]) if isinstance(r, tuple) else t.index_select(dim, r.to(t.device))

    def put(self, i: int, out: torch.Tensor, dim: int, values: torch.Tensor) -> None:
        """out's group i rows along dim = values (cast to out's dtype)."""
        r = self.rows[i]
        if isinstance(r, tuple):
            out.narrow(dim, r[0], r[1] - r[0]).copy_(values)
        else:
            out.index_copy_(dim, r.to(out.device), values.to(out.dtype))

    def dense(self) -> torch.Tensor:
        """[rows, keys]: the dense form (a reference)."""
        out = self.keys.new_empty(self.queries, self.keys.shape[1])
        for i in range(len(self.rows)):
            self.put(i, out, 0, self.keys[i].expand(self.take(i, out, 0).shape[0], -1))
        return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int,
              key_bias: torch.Tensor | GroupBias | None = None) -> torch.Tensor:
    """Softmax attention of rows [rows, heads, head] (scale 1/sqrt(head)), within groups of `group`
    consecutive rows when group > 0 (block-diagonal). Without groups, k and v may hold more rows than q (keys
    and values kept from another step: FLUX.3's reference rows), and key_bias [keys] may be added to every
    query's scores (a padded prompt's mask; None: none), or a GroupBias (each group of queries its own [keys] bias:
    attention group by group). k and v may have fewer heads than q (grouped-query attention): key head j serves
    query heads j r .. j r + r - 1, r the ratio."""
    rows, heads, head = q.shape
    if group and key_bias is not None:
        raise ValueError("attention: a key bias applies to ungrouped rows only")
    if k.shape[1] != heads:
        k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
    g = group or rows
    q = q.reshape(rows // g, g, heads, head).transpose(1, 2)
    k, v = (t.reshape(rows // g if group else 1, -1, heads, head).transpose(1, 2) for t in (k, v))
    if isinstance(key_bias, GroupBias):
        o = q.new_empty(q.shape)
        for i in range(len(key_bias.rows)):
            key_bias.put(i, o, 2, F.scaled_dot_product_attention(key_bias.take(i, q, 2), k, v,
                                                                 attn_mask=key_bias.keys[i].to(q.dtype)[None, None]))
    else:
        o = F.scaled_dot_product_attention(q, k, v,
                                           attn_mask=None if key_bias is None else key_bias.to(q.dtype)[None])
    return o.transpose(1, 2).reshape(rows, heads * head)


def swiglu(u: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of UP's interleaved rows (gluRows: gate j at 2j, up j at 2j + 1)."""
    return F.silu(u[..., 0::2]) * u[..., 1::2]


def gelu_tanh(u: torch.Tensor) -> torch.Tensor:
    return F.gelu(u, approximate="tanh")


# Arch.mlp -> the activation between UP and DOWN.
ACTIVATIONS = {"swiglu": swiglu, "gelu_tanh": gelu_tanh}


def mlp(h: torch.Tensor, up: Linear, down: Linear, kind: str) -> torch.Tensor:
    """DOWN(activation(UP h)) in h's dtype; kind an Arch.mlp ("swiglu": UP's rows gluRows)."""
    return linear(ACTIVATIONS[kind](linear(h, up).to(h.dtype)), down).to(h.dtype)


@dataclass(frozen=True)
class Attention:
    """An attention with its own q, k, v linears (LTX-2.5's six a block): queries from one set of rows, keys and
    values from a context (the same rows in a self-attention, another stream's or the prompt's in a cross one).
    q_norm/k_norm: the head norms' gains as Arch.qk_norm reads them (None: no norm). head_gate: a linear from the
    queries' input to one logit per head, whose output is times 2 sigmoid(logit) (None: no gate)."""
    q: Linear
    k: Linear
    v: Linear
    out: Linear
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    head_gate: Linear | None = None


def attend(a: Arch, w: Attention, x: torch.Tensor, context: torch.Tensor, q_rotary: Sequence | None = None,
           k_rotary: Sequence | None = None, key_bias: torch.Tensor | None = None, shards=None,
           keys=None) -> torch.Tensor:
    """w's output [rows, OUT's width] for query rows x and key/value rows context (x itself to self-attend), in a's
    heads x head: q/k normed (head_norm_rotary), queries turned by q_rotary's cos/sin and keys by k_rotary's (None:
    not turned), keys masked by key_bias (attention), heads gated, then OUT. shards: x is this rank's share of
    the rows and attention runs across the ranks, keys the shards of context's rows where they are not x
    (dit_core/parallel/shards.py SequenceShards); None: all rows here."""
    q, k, v = (linear(t, lin).to(x.dtype).reshape(t.shape[0], a.heads, a.head)
               for t, lin in ((x, w.q), (context, w.k), (context, w.v)))
    q, k = head_norm_rotary(q, w.q_norm, a, q_rotary), head_norm_rotary(k, w.k_norm, a, k_rotary)
    o = attention(q, k, v, 0, key_bias) if shards is None else shards.attention(q, k, v, 0, key_bias, keys)
    if w.head_gate is not None:
        gate = 2 * torch.sigmoid(linear(x, w.head_gate).to(x.dtype))
        o = (o.view(-1, a.heads, a.head) * gate[..., None]).flatten(1)
    return linear(o, w.out).to(x.dtype)


@dataclass
class NormStats:
    """The next block's first norm's row statistics of the rows x [2, rows] f32, carried from the block's last kernel
    that writes x (Z-Image's gated-residual kernel: RMS, next_rms; a gated DOWN product: either norm, next_norm) to
    the next block's first norm: its statistics launch goes (34 a Z-Image step, 35 a FLUX.3 Klein step, 28 a
    Krea 2 step); the host block ignores it. ready: whether values hold x's statistics now; a block that cannot
    write them clears it."""
    values: torch.Tensor
    ready: bool = False

    @staticmethod
    def of(x: torch.Tensor) -> NormStats:
        return NormStats(torch.empty(2, x.shape[0], dtype=torch.float32, device=x.device))


@dataclass(frozen=True)
class Block:
    """One block's weights by the indexes above: Block.w[QKV..DOWN] are Linears ([out, in], UP's rows gluRows),
    Block.w[NORM1..POST_MLP] norm gains (None: no gain, or no sandwich norm)."""
    w: tuple

    def __post_init__(self):
        if len(self.w) != len(BLOCK_TENSORS):
            raise ValueError(f"a block holds {len(BLOCK_TENSORS)} tensors, got {len(self.w)}")
        if not all(isinstance(self.w[i], Linear) for i in LINEARS):
            raise ValueError("Block.w[QKV..DOWN] must be Linears")

    def forward(self, a: Arch, x: torch.Tensor, m: Modulation, s: Sequence, carry=None, options=None,
                shards=None) -> torch.Tensor:
        """x + gate (attention of the modulated norm), then the same with the MLP; x [rows, hidden] (f32/f64).
        With POST_ATTN/POST_MLP (Z-Image's sandwich norms) each branch output is normed before its gate. carry:
        the GPU block's norm statistics between blocks (block_gpu.NormStats); here nothing is carried. options: the
        GPU block's (dit_core/gpu/options.py); none here. shards: x and s are this rank's share of the rows and
        attention runs across the ranks (dit_core/parallel/shards.py SequenceShards); None: all rows here."""
        w = self.w
        h = modulated_norm(a, x, w[NORM1], m.attn_shift, m.attn_scale, s.map)
        o = self.attend(a, h, s, shards=shards)
        if w[POST_ATTN] is not None:
            o = rms_norm(o, w[POST_ATTN], a.eps)
        x = x + m.attn_gate.to(x.dtype)[s.map] * o
        h = modulated_norm(a, x, w[NORM2], m.mlp_shift, m.mlp_scale, s.map)
        d = mlp(h, w[UP], w[DOWN], a.mlp)
        if w[POST_MLP] is not None:
            d = rms_norm(d, w[POST_MLP], a.eps)
        return x + m.mlp_gate.to(x.dtype)[s.map] * d

    def parallel(self, a: Arch, x: torch.Tensor, m: Modulation, s: Sequence,
                 keys_values: Callable | None = None, keep_input: bool = True, carry=None,
                 options=None, shards=None) -> torch.Tensor:
        """The parallel block (FLUX.3's mode and joint blocks): one modulated norm h feeds attention and the
        MLP side by side, x + gate (Attn(h) + MLP(h)); no tanh, no sandwich norms. Reads only m's attn_shift,
        attn_scale and attn_gate (reference/families/flux3_klein.md section 3, blocks). keys_values(k, v) ->
        (k, v), when given, sees the rows' normed and rotated keys and values before attention and may record
        or extend them (dit_core/sampling/step_cache.py RefSlots). keep_input False lets the GPU block update
        x in place (no copy of the rows); here the result is always a new tensor. carry, options, shards: as
        forward's (nothing carried here)."""
        h = modulated_norm(a, x, self.w[NORM1], m.attn_shift, m.attn_scale, s.map)
        o = self.attend(a, h, s, keys_values, shards)
        d = mlp(h, self.w[UP], self.w[DOWN], a.mlp)
        return x + m.attn_gate.to(x.dtype)[s.map] * (o + d)

    def attend(self, a: Arch, h: torch.Tensor, s: Sequence, keys_values: Callable | None = None,
               shards=None) -> torch.Tensor:
        """The self-attention piece of the normed rows h: fused QKV, head norms and rotary, attention in s's
        groups, the sigmoid gate where QKV yields one, OUT. keys_values, shards as parallel's and forward's."""
        w = self.w
        q, k, v, gate = split_qkv(a, linear(h, w[QKV]).to(h.dtype))
        q, k = head_norm_rotary(q, w[Q_NORM], a, s), head_norm_rotary(k, w[K_NORM], a, s)
        if keys_values is not None:
            k, v = keys_values(k, v)
        o = attention(q, k, v, s.group) if shards is None else shards.attention(q, k, v, s.group)
        return linear(o if gate is None else o * torch.sigmoid(gate), w[OUT]).to(h.dtype)

    def quantized(self, on: torch.device | None = None) -> Block:
        """The block with each float linear quantized once to INT8 ConvRot (rows rotated by the regular Hadamard
        of 256, a scale a row), computed on `on` (Linear.as_int8); INT8 linears unchanged."""
        return self._linears(lambda lin: lin.as_int8(on=on))

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> Block:
        """The block with every linear as float weights of dtype, INT8 turned back from ConvRot's rotation."""
        return self._linears(lambda lin: lin.as_float(dtype))

    def _linears(self, fn) -> Block:
        return replace(self, w=tuple(fn(t) if i in LINEARS else t for i, t in enumerate(self.w)))
