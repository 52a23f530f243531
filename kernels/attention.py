"""Softmax attention of the packed sequence through PyTorch's SDPA, cuDNN first; groups as a batch.

Issue 4: at Z-Image's 1024^2 shape cuDNN's attention runs at nearly twice flash's rate: the work here is
choosing SDPA's back end. Where the caller asks for INT8 scores and kernels/int8/attention.py takes the rows (Hopper,
heads of 128, one group), that kernel runs instead (issue 6: fewer joules a call than cuDNN's bf16 at its time; an
error of about 1.3% against bf16's 0.2%). Where the caller's choices ask for it (Choices.fa3_attention) and the
`fa3_fwd` package is installed, FlashAttention-3's forward takes ungrouped bf16 heads on Hopper (the same math, its
own order of sums).
For q, k, v [G, heads, g, D] bf16 (the layout of kernels/head_norm_rope.py: G groups of g consecutive rows, rows
attend within their group), or [1, heads, M, D] with `group` (M / group groups of `group` consecutive rows; 0: all
rows attend to all):
  o[b, h] = softmax(q[b, h] k[b, h]^T / sqrt(D)) v[b, h]      (no mask; b runs over the groups)
returned as rows [G g, heads D] (row b g + i, head h at columns h D ... h D + D - 1), as
dit_core.block.attention returns them.
"""
from __future__ import annotations

import functools
import logging
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import attention_8bit
from .int8 import attention as attention_int8

if TYPE_CHECKING:  # (kernels/choices.py imports the int8 kernels, which import this package's modules)
    from .choices import Choices

# Tried in this order; SDPA takes the first whose constraints the inputs meet (MATH last, always possible).
BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.MATH]
# Unplanned: cuDNN builds a plan for each new shape (40-55 ms on an H100), flash's first call at one takes about 1 ms:
# for rows whose shapes change with every prompt.
UNPLANNED = BACKENDS[1:]


def _rows(o: torch.Tensor) -> torch.Tensor:
    """[G, heads, g, D] -> rows [G g, heads D]."""
    b, h, g, d = o.shape
    return o.transpose(1, 2).reshape(b * g, h * d)


def _groups(t: torch.Tensor, group: int) -> torch.Tensor:
    """[1, heads, M, D] as [M / group, heads, group, D] (a strided view); other layouts as they are."""
    if not group or t.shape[2] == group:
        return t
    _, h, m, d = t.shape
    return t.reshape(h, m // group, group, d).transpose(0, 1)


def _qkv_rows(t: torch.Tensor) -> torch.Tensor | None:
    """[1, heads, M, D] as the rows [M, heads D] it views (the QKV's, as head_norm_rope leaves them), else None."""
    rows = t[0].transpose(0, 1)
    return rows.reshape(t.shape[2], -1) if t.shape[0] == 1 and rows.is_contiguous() else None


@functools.cache
def _fa3_forward():
    """FlashAttention-3's forward (fa3_fwd_interface.flash_attn_func), or None where fa3_fwd does not import (said
    once)."""
    try:
        from fa3_fwd_interface import flash_attn_func
    except ImportError as e:
        logging.getLogger(__name__).warning("attention: FlashAttention-3 (fa3_fwd) does not import (%s): SDPA runs", e)
        return None
    return flash_attn_func


def fa3_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether FA3's forward takes q, k, v [1, heads, M, D]: bf16 on a Hopper GPU, heads of 64 to 256 in steps of
    32 (its builds), contiguous heads, keys and values alike; fa3_fwd installed."""
    return (q.is_cuda and q.shape[0] == 1 and all(t.dtype == torch.bfloat16 and t.stride(-1) == 1 for t in (q, k, v))
            and q.shape[-1] in (64, 96, 128, 192, 256) and k.shape == v.shape and k.shape[1] == q.shape[1]
            and torch.cuda.get_device_capability(q.device) == (9, 0) and _fa3_forward() is not None)


def fa3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """FA3's forward of q, k, v [1, heads, M, D] (fa3_takes) on their [1, M, heads, D] views: rows [M, heads D]."""
    o = _fa3_forward()(*(t.transpose(1, 2) for t in (q, k, v)))
    return (o[0] if isinstance(o, tuple) else o).reshape(q.shape[2], -1)


def reference(q, k, v, group=0, int8_scores=False, eight_bit=False, planned=True):
    """The math above in f32 (bf16 out); int8_scores, eight_bit: the kernels' approximations, whose exact math this
    is; planned: which back ends, the same math."""
    q, k, v = (_groups(t, group) for t in (q, k, v))
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return _rows(torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)


def attention(q, k, v, group=0, int8_scores=False, eight_bit=False, planned=True, choices: Choices | None = None):
    """SDPA with the back ends in BACKENDS' priority (planned) or UNPLANNED's: rows [G g, heads D] in q's dtype.
    eight_bit: kernels/attention_8bit.py where it takes the rows (before int8_scores); int8_scores:
    kernels/int8/attention.py where it takes them; then choices.fa3_attention: FA3's forward where it takes them
    (ungrouped; keys may be other rows than the queries')."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention: q, k, v must be [G, heads, g, D], k and v alike, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != q.shape and (group or int8_scores or eight_bit):
        raise ValueError("attention: keys of other rows than the queries' take neither groups nor 8-bit kernels")
    if group and q.shape[2] != group and (q.shape[0] != 1 or q.shape[2] % group):
        raise ValueError(f"attention: groups of {group} rows need q, k, v [1, heads, M, D] with M a multiple "
                         f"of {group}, got {tuple(q.shape)}")
    if eight_bit and (not group or q.shape[2] == group) and attention_8bit.unusable(q) is None:
        return attention_8bit.attention_8bit(q, k, v).to(q.dtype)
    if int8_scores and (not group or q.shape[2] == group):
        rows = [_qkv_rows(t) for t in (q, k, v)]
        if all(r is not None and attention_int8.unusable(r, q.shape[1]) is None for r in rows):
            o = attention_int8.attention_int8(*rows, q.shape[1])
            if o is not None:  # (None: this Triton could not build it; SDPA below)
                return o
    if choices is not None and choices.fa3_attention and (not group or q.shape[2] == group) and fa3_takes(q, k, v):
        return fa3(q, k, v)
    q, k, v = (_groups(t, group) for t in (q, k, v))
    # set_priority (torch >= 2.6): without it the list is a set and torch's own order (flash first) decides.
    with sdpa_kernel(BACKENDS if planned else UNPLANNED, set_priority=True):
        o = F.scaled_dot_product_attention(q, k, v)
    return _rows(o)
