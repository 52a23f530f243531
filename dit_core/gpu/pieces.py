"""The host block's pieces (dit_core/block.py: attend, mlp) on a CUDA GPU, for families that call them one at a
time in their own order (LTX-2.5): an attention with its own q, k, v linears (self or cross: keys from the prompt or
another stream), q/k RMS across all heads, rotary angles per head, a key bias, the per-head 2 sigmoid gate; a GELU
MLP; each branch added to the residual under its gate in OUT's / DOWN's product epilogue. The linears go through
dit_core/gpu/block.py (INT8 ConvRot on the kernels, or BF16), the head gate through an INT8 OUT's quantizer prologue;
q/k norm and rotary through kernels/rows_norm_rope.py; attention through SDPA (a self-attention without a bias on
the 8-bit kernel where Options.attention_8bit asks)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import Attention, GroupBias, gelu_tanh
from ..linear import float_on
from ..sequence import Sequence
from ..weights import Linear, stack_rows
from .block import GpuLinear, _chunks, gated_into, linear_rows, rows_product, run
from .options import DEFAULT, Options


@dataclass(frozen=True)
class GpuAttention:
    """An Attention where it runs: the q, k and v rows as GpuLinears, OUT a GpuLinear, the norm gains f32, the head
    gate (a few rows: heads x width) as BF16 (weight, bias). projections: [q; k; v] stacked into as few GpuLinears as
    their storage allows, so one product gives several outputs side by side: one where the three read as many inputs
    and are stored alike (a self-attention's: qkv), q apart where it reads other inputs or is stored otherwise
    ([k; v]: kv, one product of the keys' rows), else each apart; sizes: q's, k's and v's rows. q, k and v are views
    of them (no second copy, also where a layer is staged to stream)."""
    projections: tuple[GpuLinear, ...]
    sizes: tuple[int, int, int]
    out: GpuLinear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    head_gate: tuple[torch.Tensor, torch.Tensor | None] | None

    @staticmethod
    def of(w: Attention, device: torch.device) -> GpuAttention:
        f32 = lambda t: None if t is None else t.float().to(device)  # noqa: E731
        for groups in (((w.q, w.k, w.v),), ((w.q,), (w.k, w.v)), ((w.q,), (w.k,), (w.v,))):
            stacks = [stacked_rows(group) for group in groups]
            if None not in stacks:
                break
        gate = None if w.head_gate is None else bf16_on(w.head_gate, device)
        return GpuAttention(tuple(GpuLinear.of(lin, device) for lin in stacks),
                            (w.q.out_features, w.k.out_features, w.v.out_features), GpuLinear.of(w.out, device),
                            f32(w.q_norm), f32(w.k_norm), gate)

    @property
    def qkv(self) -> GpuLinear | None:
        return self.projections[0] if len(self.projections) == 1 else None

    @property
    def kv(self) -> GpuLinear | None:
        """k's and v's rows as one GpuLinear, where they are stored together."""
        if len(self.projections) == 3:
            return None
        return self.projections[-1] if len(self.projections) == 2 else row_parts(self.qkv, (self.sizes[0], -1))[1]

    @property
    def q(self) -> GpuLinear:
        return self.projections[0] if len(self.projections) > 1 else row_parts(self.qkv, self.sizes)[0]

    @property
    def k(self) -> GpuLinear:
        return self.projections[1] if len(self.projections) == 3 else row_parts(self.kv, self.sizes[1:])[0]

    @property
    def v(self) -> GpuLinear:
        return self.projections[2] if len(self.projections) == 3 else row_parts(self.kv, self.sizes[1:])[1]


def bf16_on(lin: Linear, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A small linear's (weight, bias) in BF16 on device (an INT8 one rotated back first, as float_on does)."""
    f32 = float_on(lin, device)
    return f32.weight.bfloat16(), None if f32.bias is None else f32.bias.bfloat16()


def stacked_rows(linears: tuple[Linear, ...]) -> Linear | None:
    """The linears' rows as one Linear ([first; second; ...]: one product gives their outputs side by side), where
    they read as many inputs and are stored alike (INT8 ConvRot of one group: a row's codes and scale move
    together; or float of one dtype: weights.stack_rows); a single linear as it is; else None."""
    if len(linears) == 1:
        return linears[0]
    first = linears[0]
    alike = all(lin.in_features == first.in_features and lin.weight.dtype == first.weight.dtype
                and lin.group == first.group and (lin.bias is None) == (first.bias is None) for lin in linears)
    if not alike or (first.quantized and not first.group):
        return None
    return stack_rows(list(linears))


def row_parts(lin: GpuLinear, sizes: tuple[int, ...]) -> tuple[GpuLinear, ...]:
    """lin's consecutive row ranges of these sizes (-1: the rest) as GpuLinears viewing its tensors."""
    cuts, start = [], 0
    for n in sizes:
        end = lin.weight.shape[0] if n == -1 else start + n
        cuts.append((start, end))
        start = end
    part = lambda t, a, b: None if t is None else t[a:b]  # noqa: E731
    return tuple(GpuLinear(lin.weight[a:b], part(lin.scale, a, b), part(lin.bias, a, b), lin.group) for a, b in cuts)


def _heads(a: Arch, t: torch.Tensor, weight: torch.Tensor | None, s: Sequence | None, o: Options) -> torch.Tensor:
    """A linear's bf16 output rows -> [1, heads, rows, head] bf16 (a view of rows-major storage): RMS (a.qk_norm: by
    head or across all heads) in f32, turned by s's cos/sin (per head or shared), as dit_core/block.py
    head_norm_rotary, in one kernel (kernels/rows_norm_rope.py; angles by axis where s has them)."""
    angles, by_axis = {}, None if s is None else s.by_axis
    if by_axis is not None:
        angles = {"index": by_axis.index, "columns": (by_axis.axis, by_axis.freq)}
        cos, sin = by_axis.cos, by_axis.sin
    else:
        cos, sin = (None, None) if s is None else (s.cos, s.sin)
    rows = run("rows_norm_rope", t, a.heads, a.head, weight, cos, sin, a.qk_eps, across=a.qk_norm == "across",
               choices=o.kernels, **angles)
    return rows.transpose(0, 1)[None]


def attention_rows(a: Arch, w: GpuAttention, x: torch.Tensor, context: torch.Tensor, q_rotary: Sequence | None = None,
                   k_rotary: Sequence | None = None, bias: torch.Tensor | None = None, options: Options | None = None,
                   shards=None, keys=None) -> torch.Tensor:
    """dit_core/block.py attend up to OUT, as OUT takes its input: the heads' output rows [rows, heads x head] bf16,
    gated per head (2 sigmoid(linear(x, head_gate))); for an INT8 OUT, its rows (codes, scales, None: linear_rows'
    triple), the gate taken in the quantizer's prologue (kernels/int8/prologue.py: neither the sigmoid nor the gated
    rows written out). Query rows x and key/value rows context (bf16 or f32; context may be x itself: its rows are
    made once for q, k and v, one product where they are stacked; else k's and v's from context, one product where
    stacked: GpuAttention.projections). bias: added to every head's scores, [keys] (a prompt's mask), [rows, keys], or a
    GroupBias (LTX-2.5's guides: grouped_attention, never [rows, keys]), in packed order. OUT: into(). shards: x is
    this rank's share of the rows and attention runs across the ranks, keys the shards of context's rows where they
    are not x (dit_core/parallel SequenceShards.across); None: all rows here."""
    o, made = options or DEFAULT, {}

    def product(t: torch.Tensor, lin: GpuLinear) -> torch.Tensor:
        """lin(t), t's rows made once for each format (INT8 group or BF16) that reads them."""
        key = (id(t), lin.int8, lin.group)
        if key not in made:
            made[key] = linear_rows(t, lin, o)
        return rows_product(made[key], lin, o)

    if w.qkv is not None and context is x:  # one product, q, k and v its column ranges
        q_rows, k_rows, v_rows = product(x, w.qkv).split(w.sizes, dim=1)
    else:
        q_rows, kv = product(x, w.q), w.kv
        k_rows, v_rows = product(context, kv).split(w.sizes[1:], dim=1) if kv is not None else \
            (product(context, w.k), product(context, w.v))
    q = _heads(a, q_rows, w.q_norm, q_rotary, o)
    k = _heads(a, k_rows, w.k_norm, k_rotary, o)
    v = v_rows.unflatten(1, (a.heads, a.head)).transpose(0, 1)[None]
    if shards is not None and shards.ranks.world > 1:  # [1, heads, n, head] <-> [n, heads, head] around across
        heads_first = lambda t: t.transpose(0, 1)[None]  # noqa: E731
        out = shards.across(lambda *t: heads_attention(*map(heads_first, t), bias)[0].transpose(0, 1),
                            *(t[0].transpose(0, 1) for t in (q, k, v)), keys).view(q.shape[2], q.shape[1], -1)
    elif bias is None and k.shape == q.shape and o.attention_8bit and w.projections[0].int8:
        out = run("attention", q, k, v, eight_bit=True)  # rows [rows, heads x head]; SDPA where the kernel can't
    elif bias is None and o.kernels is not None and o.kernels.fa3_attention:
        out = run("attention", q, k, v, choices=o.kernels)  # FA3 where it takes the heads, else SDPA
    else:
        out = heads_attention(q, k, v, bias)[0].transpose(0, 1)
    # [rows, heads] f32 by a BF16 product of the bf16 rows (an f32 one converts the rows and runs a SIMT product:
    # 0.25 ms a call at LTX-2.5's stage 2)
    gate = None if w.head_gate is None else F.linear(x.to(torch.bfloat16), *w.head_gate).float()
    if w.out.int8:
        return linear_rows(out.reshape(x.shape[0], a.heads * a.head), w.out, o, gate=gate, gate_factor=2.0)
    if gate is not None:
        out = out * (2 * torch.sigmoid(gate))[..., None].to(out.dtype)
    return out.reshape(x.shape[0], a.heads * a.head)


def heads_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    bias: torch.Tensor | GroupBias | None) -> torch.Tensor:
    """SDPA of q [1, heads, rows, head] bf16 on k, v [1, heads, keys, head] under attention_rows' bias."""
    if isinstance(bias, GroupBias):
        return grouped_attention(q, k, v, bias)
    mask = None if bias is None else bias.to(torch.bfloat16).expand(q.shape[2], -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: GroupBias) -> torch.Tensor:
    """SDPA of q [1, heads, rows, head] bf16 on k, v [1, heads, keys, head] under a GroupBias: span_attention where
    the bias is constant over a few key spans (the guides'); else group by group of query rows, each group's [keys]
    bias broadcast over its rows (bf16, as SDPA wants the queries' dtype; memory O(keys)), no mask where it is 0."""
    if 0 < len(bias.key_spans) <= MAX_KEY_SPANS and _flash_takes(q):
        return span_attention(q, k, v, bias)
    out = torch.empty_like(q)
    for i, plain in enumerate(bias.plain):
        mask = None if plain else bias.keys[i].to(q.device, torch.bfloat16)[None, None, None]
        bias.put(i, out, 2, F.scaled_dot_product_attention(bias.take(i, q, 2), k, v, attn_mask=mask))
    return out


MAX_KEY_SPANS = 8  # span_attention keeps an output per key span


def _flash_takes(q: torch.Tensor) -> bool:
    """Whether _flash runs q: bf16/f16, heads of at most 256 in steps of 8; on CUDA a build with flash attention
    and an sm80 or later GPU (older ones take the masked path)."""
    head = q.shape[-1]
    if q.dtype not in (torch.bfloat16, torch.float16) or head > 256 or head % 8:
        return False
    if q.device.type == "cuda":
        available = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
        return available and torch.cuda.get_device_capability(q.device) >= (8, 0)
    return q.device.type == "cpu"


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention's output [1, heads, rows, head] and its log-sum-exp over the keys [1, heads, rows] f32:
    the flash kernel (CUDA; on the CPU its CPU form)."""
    if q.device.type == "cuda":
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[:2]
    else:
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    return o, lse[..., :q.shape[2]]


def span_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: GroupBias) -> torch.Tensor:
    """Attention under a bias that is constant (b_ij) for query group i over key span j, with no mask: softmax over
    all keys is the spans' own softmaxes weighted by exp(lse_j + b_ij) (lse_j: log-sum-exp of a row's scores on span
    j), so each span runs on the flash kernel, every query row at once, and each group's rows mix the spans' outputs
    in f32. Exact up to the bf16 outputs; memory: an output a span and a group's rows in f32."""
    outs, lses = zip(*(_flash(q, k[:, :, a:b], v[:, :, a:b]) for a, b in bias.key_spans))
    # each span's first key, by slices (a list index would copy its indexes from the host: no CUDA graph takes it)
    span_bias = torch.stack([bias.keys[:, a] for a, _ in bias.key_spans], 1).to(q.device)
    out = torch.empty_like(q)
    for i in range(len(bias.rows)):
        weight = torch.softmax(torch.stack([bias.take(i, lse, 2) for lse in lses]) + span_bias[i, :, None, None, None],
                               0)[..., None]
        mixed = weight[0] * bias.take(i, outs[0], 2)  # f32, the bf16 rows cast as read
        for w, o in zip(weight[1:], outs[1:]):
            mixed.addcmul_(w, bias.take(i, o, 2))
        bias.put(i, out, 2, mixed)
    return out


def modulated_rows(a: Arch, x: torch.Tensor, shift: torch.Tensor | None, scale: torch.Tensor, row_map: torch.Tensor,
                   also: tuple | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """dit_core/block.py modulated_norm without a gain, in one kernel (kernels/modulated_norm.py): [rows, D] rounded
    once to bf16, as every reader takes them (the linears' and the head gate's products), so half the bytes are
    written and read back. also: a second (shift, scale) of the same rows: both, from one read of x."""
    second = None if also is None else also[::-1]
    return run("modulated_norm", x, scale, shift, row_map, a.eps, norm=a.norm, out_dtype=torch.bfloat16, also=second)


def beside(side: torch.cuda.Stream | None, side_work, main_work) -> None:
    """side_work() on side beside main_work() on the caller's stream, both after what the caller's stream issued
    before and before what it issues after (side None: main_work(), then side_work(), here). Memory either makes
    stays with its stream; the join is issued also where main_work raises."""
    if side is None:
        main_work()
        side_work()
        return
    main = torch.cuda.current_stream(side.device)
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            side_work()
        main_work()
    finally:
        main.wait_stream(side)


def into(x: torch.Tensor, heads: torch.Tensor | tuple, w: GpuAttention, gate: torch.Tensor, row_map: torch.Tensor,
         options: Options | None = None) -> torch.Tensor:
    """x (f32, in place) += gate[row_map] * OUT(heads), heads attention_rows' output (bf16 rows or OUT's rows)."""
    rows = heads if isinstance(heads, tuple) else linear_rows(heads, w.out, options)
    return gated_into(x, rows, w.out, gate, row_map, options)


def _gelu_in_up(up: GpuLinear, down: GpuLinear, o: Options) -> bool:
    """Whether UP's epilogue takes GELU and turns its rows along each 64 columns' digit d2 (a factor of DOWN's
    rotation: kernels/int8/quant_turned.py's TURNED["v"]). Where o.gelu_in_up asks for it."""
    return o.gelu_in_up and up.int8 and down.int8 and down.group == 256 and up.weight.shape[0] % 64 == 0


def mlp_into(a: Arch, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, row_map: torch.Tensor, up: GpuLinear,
             down: GpuLinear, gate: torch.Tensor, options: Options | None = None) -> torch.Tensor:
    """x (f32, in place) += gate[row_map] * DOWN(gelu_tanh(UP h)), h = modulated_rows(a, x, shift, scale, row_map)
    (dit_core/block.py mlp, kind gelu_tanh), in chunks of Options.mlp_chunk rows: h by modulated_rows (bf16 rows,
    which an INT8 UP's quantizer takes in one pass: 9 bytes a value, where the norm in its prologue costs a
    statistics pass and the two-pass rotation, 13), then for INT8 UP and DOWN GELU in UP's epilogue, its rows
    turned there along a digit of DOWN's rotation (_gelu_in_up: DOWN's codes in one pass of any width, 3 bytes a
    value where the rotate and codes passes move 7); else UP's bf16 output, then GELU in DOWN's quantizer (INT8) or
    in torch."""
    o = options or DEFAULT
    for r0, r1 in _chunks(x.shape[0], o.mlp_chunk):
        xs, maps = x[r0:r1], row_map[r0:r1]
        h = linear_rows(modulated_rows(a, xs, shift, scale, maps), up, o)
        if _gelu_in_up(up, down, o):
            hidden = run("int8_linear", h[0], h[1], up.weight, up.scale, up.bias, gelu_tanh=True, turn_hidden=True,
                         choices=o.kernels)
            rows = (*run("quantize_rows", hidden, down.group, turned="v", choices=o.kernels), None)
        elif down.int8:
            rows = (*run("quantize_rows", rows_product(h, up, o), down.group, act="gelu_tanh", choices=o.kernels),
                    None)
        else:
            rows = (None, None, gelu_tanh(rows_product(h, up, o).float()).to(torch.bfloat16))
        gated_into(xs, rows, down, gate, maps, o)
    return x
