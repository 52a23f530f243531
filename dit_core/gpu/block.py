"""The shared block on a CUDA GPU: INT8 ConvRot linears on the matrix cores through kernels/, fused prologues
(modulated norm -> rotate -> quantize; SwiGLU -> rotate -> quantize; attention gate -> rotate -> quantize) and
epilogues (scales, bias, gated residual), attention through SDPA. dit_core/block.py is its reference."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import (
    DOWN,
    K_NORM,
    NORM1,
    NORM2,
    OUT,
    POST_ATTN,
    POST_MLP,
    Q_NORM,
    QKV,
    UP,
    Block,
    modulated_norm,
    NormStats,
    swiglu,
)
from ..modulation import Modulation
from ..sequence import Sequence
from ..weights import Linear
from .options import DEFAULT, Options
from .staging import to_card


def _int8_scores(qkv: GpuLinear, o: Options) -> bool:
    """Whether a block with this QKV takes INT8 attention scores: the options ask for them and QKV is INT8."""
    return o.int8_attention and qkv.int8


def _attention_kind(qkv: GpuLinear, o: Options) -> dict:
    """kernels/attention.py's choice for a block with this QKV: both products on 8 bits, or INT8 scores, where the
    options ask for them and QKV is INT8 (BF16 linears keep cuDNN's bf16); SDPA's back ends planned or not; the
    options' kernels (FA3 where they choose it)."""
    return {"eight_bit": o.attention_8bit and qkv.int8, "int8_scores": _int8_scores(qkv, o),
            "planned": o.planned_attention, "choices": o.kernels}


def kernels():
    """The kernels package: the sibling of dit_core, top level in tests and tools, inside the custom-node package
    in ComfyUI."""
    parent = __package__.removesuffix(".gpu").rpartition(".")[0]  # dit_core.gpu -> dit_core's parent
    return importlib.import_module(f"{parent}.kernels" if parent else "kernels")


def run(op: str, *args, **kwargs):
    """kernels.run: op's Triton launcher, or its reference where the device can't run it (choices=: which kernels,
    an Options' kernels)."""
    return kernels().run(op, *args, **kwargs)


@dataclass(frozen=True)
class GpuLinear:
    """A linear where it runs: INT8 ConvRot codes [N, K] with f32 row scales [N] (int8 True), or BF16 [N, K]."""
    weight: torch.Tensor
    scale: torch.Tensor | None
    bias: torch.Tensor | None
    group: int

    @property
    def int8(self) -> bool:
        return self.weight.dtype == torch.int8

    @staticmethod
    def of(lin: Linear, device: torch.device, source: tuple | None = None) -> GpuLinear:
        """lin on device; source: the (checkpoint, key) of its weight as stored (staging.to_card's)."""
        bias = None if lin.bias is None else lin.bias.float().to(device)
        if lin.quantized and lin.group:
            scale = lin.scale.float().reshape(-1).expand(lin.out_features).contiguous()
            return GpuLinear(to_card(lin.weight, device, source), scale.to(device), bias, lin.group)
        # Float linears (and INT8 without ConvRot) run in BF16 on cuBLAS: a BF16 one moved as stored, the others
        # converted where they go (no f32 copy of the weight on the host).
        weight = lin.weight if lin.weight.dtype == torch.bfloat16 else lin.to(device).dequantized()
        return GpuLinear(to_card(weight, device, source).to(torch.bfloat16), None, bias, 0)


def _plain_heads(a: Arch) -> bool:
    """Whether the block's attention takes the plain path (_gated_attention): grouped-query heads or a gate, which
    the fused QKV and attention kernels do not take (Krea 2)."""
    return a.key_width != a.width or a.attn_gate


def _gated_attention(a: Arch, qkv: torch.Tensor, q_weight, k_weight, s: Sequence, kind: dict,
                     shards=None) -> tuple:
    """(attention output rows [rows, heads D] bf16, the gate's rows: a bf16 view of QKV's last columns, or None
    without an attention gate) from QKV's bf16 product [q | k | v | gate]: head_norm_rope (each shared key head
    written for the query heads it serves), then the kernels' attention of `kind` (_attention_kind's; cuDNN first;
    across shards' ranks: _attention). OUT's rows take the gate's sigmoid (GpuBlock._rows)."""
    qkv_width = a.width + 2 * a.key_width
    q, k, v = run("head_norm_rope", qkv[:, :qkv_width], a.heads, a.head, q_weight, k_weight, s.cos, s.sin, a.qk_eps,
                  group=s.group, kv_heads=a.kv_heads)
    return _attention(q, k, v, kind, shards), qkv[:, qkv_width:] if a.attn_gate else None


def _product(x_q, s_x, x_bf16, lin: GpuLinear, o: Options) -> torch.Tensor:
    """The linear's output rows (bf16): INT8 codes against INT8 weights, or BF16 rows against BF16 weights."""
    if lin.int8:
        return run("int8_linear", x_q, s_x, lin.weight, lin.scale, lin.bias, choices=o.kernels)
    bias = None if lin.bias is None else lin.bias.to(torch.bfloat16)
    return F.linear(x_bf16, lin.weight, bias)


def product(x: torch.Tensor, lin: GpuLinear, options: Options | None = None) -> torch.Tensor:
    """A plain linear of rows x (bf16 out): INT8 rows quantized (quantize_rows) against the INT8 weights, else
    BF16 against BF16 (a family's few-row linears: H3's modulation, a text encoder's INT8 linears)."""
    o = options or DEFAULT
    if lin.int8:
        rows = x if x.stride(-1) == 1 else x.contiguous()  # quantize_rows reads contiguous columns
        q, s = run("quantize_rows", rows, lin.group, choices=o.kernels)
        return _product(q, s, None, lin, o)
    return _product(None, None, x.to(torch.bfloat16), lin, o)


def linear_rows(x: torch.Tensor, lin: GpuLinear, options: Options | None = None, gate: torch.Tensor | None = None,
                gate_factor: float = 1.0) -> tuple:
    """Rows x as lin's product takes them, (codes, scales, None) for an INT8 linear (quantize_rows, plain rows) or
    (None, None, bf16 rows): made once, read by every linear of the same input (an attention's q, k and v). gate,
    gate_factor: quantize_rows' (INT8 only: an attention's output gated in the quantizer's prologue)."""
    o = options or DEFAULT
    if lin.int8:
        return (*run("quantize_rows", x if x.stride(-1) == 1 else x.contiguous(), lin.group, gate=gate,
                     gate_factor=gate_factor, choices=o.kernels), None)
    if gate is not None:
        raise ValueError("linear_rows: a gate goes to an INT8 linear's quantizer; gate BF16 rows in torch")
    return None, None, x.to(torch.bfloat16)


def rows_product(rows: tuple, lin: GpuLinear, options: Options | None = None) -> torch.Tensor:
    """lin's bf16 output of linear_rows' triple."""
    return _product(*rows, lin, options or DEFAULT)


def gated_into(x: torch.Tensor, rows: tuple, lin: GpuLinear, gate: torch.Tensor, row_map: torch.Tensor,
               options: Options | None = None) -> torch.Tensor:
    """x (f32 [rows, N], in place) += gate[row_map] * lin(rows) (linear_rows' triple; gate [R, N]): in the INT8
    product's epilogue, else after the BF16 product."""
    o = options or DEFAULT
    if lin.int8:  # the kernels read gate's rows N apart (a table's row view may not be)
        return run("int8_linear_gated", rows[0], rows[1], lin.weight, lin.scale, lin.bias, residual=x,
                   gate=gate.contiguous(), row_map=row_map, choices=o.kernels)
    return x.add_(gate.float()[row_map.long()] * _product(*rows, lin, o).float())


def _fused_heads(a: Arch, qkv: GpuLinear, s: Sequence) -> bool:
    """Whether QKV's product takes the head norm and rotary in its epilogue: INT8, every column of a head turned,
    and a tile holding whole heads (D a power of two >= 16)."""
    return qkv.int8 and 2 * s.cos.shape[-1] == a.head and a.head >= 16 and a.head & (a.head - 1) == 0


def _turns_v(a: Arch, qkv: GpuLinear, out: GpuLinear, s: Sequence, o: Options = DEFAULT) -> bool:
    """Whether v leaves the fused QKV turned along each 64 columns' top base-4 digit (a factor of OUT's rotation,
    free in the epilogue's registers), so that OUT's INT8 ConvRot rows go to codes in one pass
    (kernels/int8/quant_turned.py: 3 bytes a value moved, not the rotate pass's 7): attention is linear in v, so
    its output arrives turned too. Where o.turn_v asks for it."""
    return (o.turn_v and _fused_heads(a, qkv, s) and out.int8 and a.head % 64 == 0
            and kernels().int8.quant_turned.fits(a.heads * a.head, out.group))


def _turns_hidden(up: GpuLinear, down: GpuLinear, o: Options = DEFAULT) -> bool:
    """Whether UP's SwiGLU epilogue turns the hidden rows along each 64 columns' digits d2 and d1 (two factors of
    DOWN's rotation, in the epilogue's registers), so that DOWN's codes pass does the rest with no matrix product
    (kernels/int8/quant_turned.py's TURNED["hidden"]). Where o.turn_hidden asks for it."""
    return o.turn_hidden and up.int8 and down.int8 and down.group == 256


def _heads(a: Arch, o: Options, h, lin: GpuLinear, q_weight, k_weight, s: Sequence, turn_v: bool = False):
    """q, k, v [G, heads, g, D] (normed, turned; v turned where turn_v) from QKV's input rows h: one INT8
    product with the head norm and rotary in its epilogue (q, k, v never stored as one [rows, 3 heads D] output)
    where it can, else the product and then head_norm_rope."""
    q, sc, xb = h
    if _fused_heads(a, lin, s):
        return run("qkv_rope_linear", q, sc, lin.weight, lin.scale, lin.bias, a.heads, a.head, q_weight, k_weight,
                   s.cos, s.sin, a.qk_eps, group=s.group, angles=s.angles.as_args() if s.angles else None,
                   turn_v=turn_v, choices=o.kernels)
    return run("head_norm_rope", _product(q, sc, xb, lin, o), a.heads, a.head, q_weight, k_weight, s.cos, s.sin,
               a.qk_eps, group=s.group)


def _attention(q, k, v, kind: dict, shards=None) -> torch.Tensor:
    """The attention kernel's rows [rows, heads D] of q, k, v [1, heads, rows, D] (views of rows-major storage).
    shards (dit_core/parallel SequenceShards, more than one rank): q, k, v are this rank's rows; to_heads, every
    rank's rows of this rank's heads in packed order (one process's arithmetic, head by head), the kernel, back to
    rank order, to_rows."""
    if shards is None or shards.ranks.world == 1:
        return run("attention", q, k, v, **kind)
    heads_first = lambda t: t.transpose(0, 1)[None]  # noqa: E731  [n, heads, D] -> [1, heads, n, D]
    return shards.across(lambda *t: run("attention", *map(heads_first, t), **kind),
                         *(t[0].transpose(0, 1) for t in (q, k, v)))


def _attend(q, k, v, keys_values: Callable | None, kind: dict) -> torch.Tensor:
    """Attention of head_norm_rope's q, k, v [G, heads, g, D] (views of rows-major storage); keys_values(k, v)
    sees k and v as the host block shows them (rows [G g, heads, D]; v turned where the block turns it, _turns_v)
    and may add rows (G = 1: the keys beyond the queries' rows, as dit_core/block.py attention takes them); the
    kernel needs k like q, so longer keys go to SDPA directly. kind: _attention_kind's answer."""
    if keys_values is not None:
        G, heads, _, d = q.shape
        k, v = keys_values(*(t.transpose(1, 2).reshape(-1, heads, d) for t in (k, v)))
        k, v = (t.reshape(G, -1, heads, d).transpose(1, 2).to(q.dtype) for t in (k, v))  # q's layout: BSHD
    if k.shape == q.shape:
        return run("attention", q, k, v, **kind)
    o = F.scaled_dot_product_attention(q, k, v)
    return o.transpose(1, 2).reshape(q.shape[0] * q.shape[2], -1)


def _chunks(rows: int, most: int) -> list[tuple[int, int]]:
    """Row ranges of at most `most` rows (Options.mlp_chunk), near equal: 4608 rows in chunks of at most 4096 go
    as two of 2304, not 4096 + 512 (a small last chunk runs the MLP's products on a fraction of the card)."""
    size = -(-rows // -(-rows // most)) if rows else 1
    return [(r0, min(r0 + size, rows)) for r0 in range(0, rows, size)]


def _chunk(rows, r0: int, r1: int):
    """Rows r0..r1 of _rows' (codes, scales, bf16 rows) triple."""
    return tuple(None if t is None else t[r0:r1] for t in rows)


@dataclass(frozen=True)
class GpuBlock:
    """Block.w where it runs: 4 GpuLinears, then the norm gains (f32) or None."""
    w: tuple

    @staticmethod
    def of(block: Block, device: torch.device) -> GpuBlock:
        w = [GpuLinear.of(t, device) if i <= DOWN else (None if t is None else t.float().to(device))
             for i, t in enumerate(block.w)]
        if w[Q_NORM] is not None and w[K_NORM] is not None and w[Q_NORM].shape == w[K_NORM].shape:
            # the rows of one [2, D] tensor: the head-norm kernels read them as it, no stacking launch a call
            w[Q_NORM], w[K_NORM] = torch.stack([w[Q_NORM], w[K_NORM]])
        return GpuBlock(tuple(w))

    def _rows(self, a: Arch, o: Options, x, lin: GpuLinear, *, norm_weight=None, scale=None, shift=None,
              row_map=None, act=None, stats=None, row_starts=None, turned=None, gate=None):
        """The input rows of linear `lin`: INT8 codes and scales when it is INT8 (the fused prologue; stats: the
        norm's row statistics when already known; row_starts: Sequence.starts; turned: "v", an attention's output
        whose v was turned, _turns_v; "hidden", UP's turned SwiGLU rows, _turns_hidden; gate: an attention's gate
        rows, x times their sigmoid, _gated_attention), else the same math in BF16 through torch."""
        norm = a.norm if scale is not None else None
        if lin.int8:
            q, s = run("quantize_rows", x, lin.group, norm=norm, norm_weight=norm_weight, eps=a.eps, scale=scale,
                       shift=shift, row_map=row_map, act=act, stats=stats, row_starts=row_starts, turned=turned,
                       gate=gate, choices=o.kernels)
            return q, s, None
        if gate is not None:
            h = x * torch.sigmoid(gate)
        elif act == "swiglu":
            h = swiglu(x.float())
        elif scale is not None:
            h = modulated_norm(a, x, norm_weight, shift, scale, row_map)
        else:
            h = x
        return None, None, h.to(torch.bfloat16)

    def _hidden(self, a: Arch, o: Options, h, up: GpuLinear, down: GpuLinear):
        """The MLP's hidden rows from UP's input rows h, as the down projection takes them (_rows' triple). INT8 UP:
        SwiGLU in the product's epilogue (the [rows, 2 ffn] product never stored; the rows turned there for an INT8
        DOWN, _turns_hidden), then the quantizer; else the product, then SwiGLU (in the quantizer's prologue when
        DOWN is INT8)."""
        q, sc, xb = h
        if up.int8:
            turn = _turns_hidden(up, down, o)
            hidden = run("int8_linear", q, sc, up.weight, up.scale, up.bias, swiglu=True, turn_hidden=turn,
                         choices=o.kernels)
            return self._rows(a, o, hidden, down, turned="hidden" if turn else None)
        return self._rows(a, o, _product(q, sc, xb, up, o), down, act="swiglu")

    @staticmethod
    def _epilogue_gated(lin: GpuLinear, post) -> bool:
        """Whether _branch_into gates in the product's epilogue (else in the gated-residual kernel)."""
        return post is None and lin.int8

    def _branch_into(self, a: Arch, o: Options, x, y_rows, lin: GpuLinear, post, gate, row_map, next_rms=None,
                     addend=None) -> None:
        """x += gate[map] * (post norm of) linear(y): in the product's epilogue when there is no sandwich norm
        (its output is never stored), else through the gated-residual kernel after the product. next_rms ([2,
        rows], when given): filled with the next norm's row statistics of the updated x (a.norm's in the
        epilogue, RMS in the gated-residual kernel). addend: bf16 rows added to linear(y) under the same gate (in
        the epilogue: _epilogue_gated)."""
        q, s, xb = y_rows
        if self._epilogue_gated(lin, post):
            run("int8_linear_gated", q, s, lin.weight, lin.scale, lin.bias, residual=x, gate=gate, row_map=row_map,
                addend=addend, next_norm=None if next_rms is None else (next_rms, a.norm, a.eps), choices=o.kernels)
            return
        run("gated_residual", x, _product(q, s, xb, lin, o), gate, row_map, post_weight=post, eps=a.eps,
            next_rms=None if next_rms is None else (next_rms, a.eps))

    def forward(self, a: Arch, x: torch.Tensor, m: Modulation, s: Sequence, carry: NormStats | None = None,
                options: Options | None = None, shards=None) -> torch.Tensor:
        """x ([rows, hidden] f32 on the GPU) updated in place, as Block.forward computes it. carry: x's RMS norm
        statistics, read when ready and written for the next block by the MLP branch's last kernel. options: the
        model's (dit_core/gpu/options.py; None: DEFAULT). shards: x and s are this rank's share of the rows and
        attention runs across the ranks (_attention)."""
        w, row_map, opt = self.w, s.map, options or DEFAULT
        given = carry.values if carry is not None and carry.ready and a.norm == "rms" else None
        h = self._rows(a, opt, x, w[QKV], norm_weight=w[NORM1], scale=m.attn_scale, shift=m.attn_shift,
                       row_map=row_map, stats=given)
        if _plain_heads(a):
            turn, (o, gate) = False, _gated_attention(a, _product(*h, w[QKV], opt), w[Q_NORM], w[K_NORM], s,
                                                      _attention_kind(w[QKV], opt), shards)
        else:
            turn, gate = _turns_v(a, w[QKV], w[OUT], s, opt), None
            o = _attention(*_heads(a, opt, h, w[QKV], w[Q_NORM], w[K_NORM], s, turn), _attention_kind(w[QKV], opt),
                           shards)
        # The MLP norm's row statistics come out of the attention branch's last kernel (the gated-residual kernel
        # of a sandwich norm, as Z-Image's, else OUT's gated epilogue, as Krea 2's) when the MLP's rows are
        # quantized: a pass over the f32 rows fewer a block.
        fused = a.norm == "rms" and w[UP].int8 and opt.carry_norms
        stats = torch.empty(2, x.shape[0], dtype=torch.float32, device=x.device) if fused else None
        self._branch_into(a, opt, x, self._rows(a, opt, o, w[OUT], turned="v" if turn else None, gate=gate), w[OUT],
                          w[POST_ATTN], m.attn_gate, row_map, stats)
        carried = carry is not None and a.norm == "rms"
        for r0, r1 in _chunks(x.shape[0], opt.mlp_chunk):
            xs, maps = x[r0:r1], row_map[r0:r1]
            h = self._rows(a, opt, xs, w[UP], norm_weight=w[NORM2], scale=m.mlp_scale, shift=m.mlp_shift,
                           row_map=maps, stats=None if stats is None else stats[:, r0:r1])
            self._branch_into(a, opt, xs, self._hidden(a, opt, h, w[UP], w[DOWN]), w[DOWN], w[POST_MLP], m.mlp_gate,
                              maps, carry.values[:, r0:r1] if carried else None)
        if carry is not None:
            carry.ready = carried
        return x

    def parallel(self, a: Arch, x: torch.Tensor, m: Modulation, s: Sequence,
                 keys_values: Callable | None = None, keep_input: bool = True,
                 carry: NormStats | None = None, options: Options | None = None) -> torch.Tensor:
        """Block.parallel on the GPU: x + gate (Attn(h) + MLP(h)), as a new tensor when keep_input (the step cache
        reads the first two joint blocks' inputs after them), else x updated in place (a copy of the rows fewer).
        One modulated-norm prologue gives h's rows for QKV and UP (quantized once when both take the same INT8
        rows). Both INT8: x += gate (d + o) in DOWN's epilogue, o the attention branch's bf16 output (as a stock
        linear's), d never stored: one pass over the residual, where OUT gating in its own epilogue took a second
        (its short K loop did not hide that epilogue); that product also writes the output's norm statistics into
        carry (NormStats: the next block's norm reads them, x's when ready here). Else x += gate o, then x += gate d
        (each in its product's epilogue when INT8): equal to gate (o + d) in exact math. options: the model's."""
        if _plain_heads(a):
            raise NotImplementedError(f"{a.family}: the GPU parallel block has no grouped-query attention or "
                                      f"attention gate; no family needs them there yet")
        w, row_map, x, opt = self.w, s.map, x.clone() if keep_input else x, options or DEFAULT
        given = carry.values if carry is not None and carry.ready else None
        mod = {"norm_weight": w[NORM1], "scale": m.attn_scale, "shift": m.attn_shift, "row_map": row_map,
               "row_starts": s.starts}
        h = self._rows(a, opt, x, w[QKV], **mod, stats=given)
        same = (w[UP].int8, w[UP].group) == (w[QKV].int8, w[QKV].group)
        h_up = h if same else self._rows(a, opt, x, w[UP], **mod, stats=given)
        turn = _turns_v(a, w[QKV], w[OUT], s, opt)  # (keys_values then keeps and returns v turned: one block's own)
        o = _attend(*_heads(a, opt, h, w[QKV], w[Q_NORM], w[K_NORM], s, turn), keys_values,
                    _attention_kind(w[QKV], opt))
        o_rows, summed = self._rows(a, opt, o, w[OUT], turned="v" if turn else None), w[OUT].int8 and w[DOWN].int8
        if summed:
            o = run("int8_linear", o_rows[0], o_rows[1], w[OUT].weight, w[OUT].scale, w[OUT].bias,
                    choices=opt.kernels)
        else:
            self._branch_into(a, opt, x, o_rows, w[OUT], None, m.attn_gate, row_map)
        carried = carry is not None and summed
        for r0, r1 in _chunks(x.shape[0], opt.mlp_chunk):
            self._branch_into(a, opt, x[r0:r1], self._hidden(a, opt, _chunk(h_up, r0, r1), w[UP], w[DOWN]), w[DOWN],
                              None, m.attn_gate, row_map[r0:r1], carry.values[:, r0:r1] if carried else None,
                              addend=o[r0:r1] if summed else None)
        if carry is not None:
            carry.ready = carried
        return x
