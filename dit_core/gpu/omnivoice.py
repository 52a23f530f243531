"""OmniVoice where it runs fast (issue 37): the host model's tensors on a device (BF16 linears, or INT8 ConvRot where
the file stores INT8, through the GPU block's product), and the whole unmasking step (the packed forward, the
heads, the guided log probabilities and the reveal) as one function of device tensors, replayed from a CUDA graph
per length bucket. dit_core/families/omnivoice.py (OmniVoice.logits, generate_codes) is its reference.

The rows of a step: per item its conditional segment [prefix | codes] and, with guidance, its unconditional one
[codes], then padding rows up to the bucket as one more segment. Attention stays within segments (block-diagonal):
FlashAttention's varlen form over the segments' offsets on CUDA, else SDPA with a same-segment mask; both exact.
The lengths are tensors, so texts of other lengths in one bucket replay the same graph. The loop's random draws
come from the caller's CPU generator in the host loop's order (sampling/omnivoice.py: step_noise), so a seed gives
the host loop's codes (bit for bit in f32 on the CPU; BF16 logits may flip a near tie)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import DOWN, K_NORM, NORM1, NORM2, OUT, Q_NORM, QKV, UP, swiglu
from ..linear import float_on, linear
from ..sampling.ksampler import before_step
from ..sampling.omnivoice import Codebooks, Unmasking, knobs, reveal_counts, step_noise, unmask_rows
from ..sequence import rotate_halves
from ..weights import Linear
from .block import GpuLinear, product, run
from .options import DEFAULT, Options
from .step_graph import GraphedStep
from .text_linear import takes

log = logging.getLogger("SwiftDiT")

ROW_BUCKET = 128   # packed rows padded to a multiple of this (256 past 2048): one graph serves nearby lengths
WIDTH_BUCKET = 32  # target frames padded to a multiple of this


def bucket(n: int, step: int) -> int:
    return -(-n // step) * step


def row_bucket(n: int) -> int:
    return bucket(n, ROW_BUCKET if n <= 2048 else 2 * ROW_BUCKET)


@dataclass(frozen=True)
class VoiceLinear:
    """A layer linear where it runs: the host Linear (f32 math, the reference's numerics) or a GpuLinear (BF16 on
    cuBLAS, or INT8 ConvRot on the kernels)."""
    host: Linear | None
    gpu: GpuLinear | None

    def __call__(self, x: torch.Tensor, options: Options) -> torch.Tensor:
        return linear(x, self.host) if self.host is not None else product(x, self.gpu, options)


def _split_glu(g: GpuLinear) -> GpuLinear:
    """UP's interleaved rows (gate j at 2j, up j at 2j + 1) as [gate; up]: SwiGLU then reads two contiguous
    halves. A row order only, so INT8 codes and their row scales move alike."""
    n = g.weight.shape[0]
    order = torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)]).to(g.weight.device)
    return GpuLinear(g.weight[order].contiguous(), None if g.scale is None else g.scale[order].contiguous(),
                     None if g.bias is None else g.bias[order].contiguous(), g.group)


@dataclass(frozen=True)
class VoiceLayer:
    qkv: VoiceLinear
    out: VoiceLinear
    up: VoiceLinear
    down: VoiceLinear
    norm1: torch.Tensor
    norm2: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    fused: bool  # BF16 GPU linears: UP's rows as [gate; up], q and k through head_norm_rope; else the host's math


@dataclass(frozen=True)
class Layout:
    """One call's packed rows on the device: ids [C, R] (prefixes; target rows refilled each step), audio [R],
    positions [R] f32 (restarting in each segment), segment [R] int32, offsets [S + 1] int32 (the segments'
    starts, the padding last), cond / uncond [B, W] long (row of item b's target t; uncond [B, 0] unguided; padding
    points at the last row), valid [B, W]; targets: each item's frames (host ints)."""
    ids: torch.Tensor
    audio: torch.Tensor
    positions: torch.Tensor
    segment: torch.Tensor
    offsets: torch.Tensor
    cond: torch.Tensor
    uncond: torch.Tensor
    valid: torch.Tensor
    targets: tuple[int, ...]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.audio, self.positions, self.segment, self.offsets, self.cond, self.uncond, self.valid


def layout(prompts, guided: bool, mask_id: int, device) -> Layout:
    """The packed rows of prompts (families/omnivoice.Prompt) with all-MASK targets, padded to the buckets."""
    codebooks = prompts[0].ids.shape[0]
    width = bucket(max(p.target for p in prompts), WIDTH_BUCKET)
    segments = []  # (ids, audio) in packed order; each ends in its item's target rows
    for p in prompts:
        target = torch.full((codebooks, p.target), mask_id, dtype=torch.long)
        ones = torch.ones(p.target, dtype=torch.bool)
        segments.append((torch.cat([p.ids, target], 1), torch.cat([p.audio, ones])))
        segments += [(target, ones)] if guided else []
    real = sum(s[0].shape[1] for s in segments)
    rows = row_bucket(real + 1)  # at least one padding row: the padding segment is never empty
    segments.append((torch.zeros(codebooks, rows - real, dtype=torch.long), torch.zeros(rows - real, dtype=torch.bool)))
    lengths = [s[0].shape[1] for s in segments]
    ends = torch.tensor(lengths).cumsum(0)
    cond = torch.full((len(prompts), width), rows - 1, dtype=torch.long)
    uncond = cond.clone() if guided else torch.empty(len(prompts), 0, dtype=torch.long)
    for i, p in enumerate(prompts):
        end = int(ends[i * (1 + guided)])
        cond[i, :p.target] = torch.arange(end - p.target, end)
        if guided:
            uncond[i, :p.target] = torch.arange(int(ends[2 * i + 1]) - p.target, int(ends[2 * i + 1]))
    valid = torch.arange(width)[None] < torch.tensor([p.target for p in prompts])[:, None]
    parts = dict(ids=torch.cat([s[0] for s in segments], 1), audio=torch.cat([s[1] for s in segments]),
                 positions=torch.cat([torch.arange(n) for n in lengths]).float(),
                 segment=torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths)),
                 offsets=torch.cat([torch.zeros(1, dtype=torch.long), ends]).int(), cond=cond, uncond=uncond,
                 valid=valid)
    return Layout(**{k: v.to(device) for k, v in parts.items()}, targets=tuple(p.target for p in prompts))


def flash_works(device: torch.device) -> bool:
    """Whether FlashAttention's varlen form runs here (CUDA, this torch's build): tried once on a few rows."""
    if device.type != "cuda":
        return False
    try:
        q = torch.randn(8, 2, 64, device=device, dtype=torch.bfloat16)
        cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)
        torch.ops.aten._flash_attention_forward(q, q, q, cu, cu, 8, 8, 0.0, False, False)
        return True
    except (RuntimeError, AttributeError, NotImplementedError) as e:
        log.info("SwiftDiT: OmniVoice attends through SDPA with a segment mask (no varlen FlashAttention: %s)",
                 str(e).splitlines()[0] if str(e) else type(e).__name__)
        return False


class GpuOmniVoice(Codebooks):
    """OmniVoice on a device in `dtype` (f32: host Linears and the reference's numerics; BF16: GPU linears).
    codebooks, audio_vocab, mask_id from Codebooks; generate_codes runs the loop; clear() drops the graphs."""

    def __init__(self, arch: Arch, text_embedding, audio_embedding, layers, final_norm, heads: VoiceLinear,
                 dtype: torch.dtype, options: Options, flash: bool, graphs: bool):
        self.arch, self.text_embedding, self.audio_embedding = arch, text_embedding, audio_embedding
        self.layers, self.final_norm, self.heads = tuple(layers), final_norm, heads
        self.dtype, self.options, self.flash = dtype, options, flash
        self.device = final_norm.device
        self.inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, arch.head, 2, dtype=torch.float32) / arch.head))
        self.inv_freq = self.inv_freq.to(self.device)
        self.graphs = GraphedStep(self._step) if graphs and self.device.type == "cuda" else None

    @staticmethod
    def of(model, device, dtype: torch.dtype = torch.bfloat16, options: Options | None = None,
           attention: str = "auto", graphs: bool = True) -> GpuOmniVoice:
        """model (families/omnivoice.OmniVoice) on device. attention: 'flash' (varlen), 'masked' (SDPA with a
        segment mask) or 'auto' (flash where it runs)."""
        device = torch.device(device)
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"OmniVoice runs in float32 or bfloat16, not {dtype}")
        if attention not in ("auto", "flash", "masked"):
            raise ValueError(f"OmniVoice attention is 'auto', 'flash' or 'masked', not {attention!r}")
        exact = dtype == torch.float32

        def gpu(host: Linear) -> GpuLinear:
            if host.quantized and not takes(host):  # a ConvRot group the INT8 kernels lack: BF16 (as text_linear)
                return GpuLinear(host.dequantized().to(device, torch.bfloat16), None, None if host.bias is None else
                                 host.bias.float().to(device), 0)
            return GpuLinear.of(host, device)

        def lin(host: Linear) -> VoiceLinear:
            if exact:
                return VoiceLinear(host if device.type == "cpu" else float_on(host, device), None)
            return VoiceLinear(None, gpu(host))

        def layer(block) -> VoiceLayer:
            w = block.w
            up = lin(w[UP]) if exact else VoiceLinear(None, _split_glu(gpu(w[UP])))
            # q and k gains as the rows of one [2, D] tensor: head_norm_rope reads them so without a copy a call
            qk = torch.stack([w[Q_NORM], w[K_NORM]]).float().to(device)
            return VoiceLayer(lin(w[QKV]), lin(w[OUT]), up, lin(w[DOWN]), w[NORM1].float().to(device),
                              w[NORM2].float().to(device), qk[0], qk[1], fused=not exact)

        # FlashAttention takes half precision only: the f32 form attends through SDPA's mask
        flash = not exact and (attention == "flash" or (attention == "auto" and flash_works(device)))
        table = lambda t: t.to(device, dtype)  # noqa: E731
        return GpuOmniVoice(model.arch, table(model.text_embedding), table(model.audio_embedding),
                            [layer(b) for b in model.blocks], model.final_norm.float().to(device), lin(model.heads),
                            dtype, options or DEFAULT, flash, graphs)

    def clear(self) -> None:
        """Drops the step graphs and their memory pool (before the model goes)."""
        if self.graphs is not None:
            self.graphs.clear()

    # --- the forward ---------------------------------------------------------------------------------------

    def _embed(self, ids: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """Rows [R, hidden] f32, OmniVoice.embed's values without its host-side boolean indexing."""
        offsets = torch.arange(self.codebooks, device=ids.device)[:, None] * self.audio_vocab
        sums = self.audio_embedding[torch.where(audio[None], ids, 0) + offsets].float().sum(0)
        text = self.text_embedding[torch.where(audio, 0, ids[0])].float()
        return torch.where(audio[:, None], sums, text)

    def _attend(self, q, k, v, segment, offsets) -> torch.Tensor:
        """Attention within segments of q [R, heads, D], k, v [R, key heads, D] -> [R, heads D]."""
        rows, heads, _ = q.shape
        if k.shape[1] != heads:
            k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
        if self.flash:
            q, k, v = (t.contiguous() for t in (q, k, v))  # (views of rows-major storage already: no copies)
            o = torch.ops.aten._flash_attention_forward(q, k, v, offsets, offsets, rows, rows, 0.0, False, False)[0]
            return o.reshape(rows, -1)
        same = segment[:, None] == segment[None, :]
        o = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), attn_mask=same)
        return o[0].transpose(0, 1).reshape(rows, -1)

    def _layer(self, w: VoiceLayer, x, cos, sin, segment, offsets) -> torch.Tensor:
        """f32: the host's math, op for op."""
        a, o, dt = self.arch, self.options, self.dtype
        rows = x.shape[0]
        qkv = w.qkv(F.rms_norm(x, (a.hidden,), w.norm1, a.eps).to(dt), o)
        q, k, v = qkv.split([a.width, a.key_width, a.key_width], dim=-1)
        q, k = (rotate_halves(F.rms_norm(t.reshape(rows, -1, a.head).float(), (a.head,), g, a.qk_eps), cos,
                              sin).to(dt) for t, g in ((q, w.q_norm), (k, w.k_norm)))
        v = v.reshape(rows, -1, a.head).to(dt)
        x = x + w.out(self._attend(q, k, v, segment, offsets), o)
        u = w.up(F.rms_norm(x, (a.hidden,), w.norm2, a.eps).to(dt), o)
        return x + w.down(swiglu(u).to(dt), o)

    def _fused_layer(self, w: VoiceLayer, x, down, cos, sin, segment, offsets) -> torch.Tensor:
        """BF16: x (f32, updated in place) plus the layer before's DOWN output (None for the first), through this
        layer up to its own DOWN output, returned for the next layer to add: each residual add rides in the next
        norm's pass (kernels/add_rms_rows.py); one kernel norms and turns q and k and writes k, v per query head,
        rows-major; SwiGLU in one pass (kernels/swiglu_rows.py)."""
        a, o = self.arch, self.options
        qkv = w.qkv(run("add_rms_rows", x, down, w.norm1, a.eps), o)
        q, k, v = (t.transpose(1, 2)[0] for t in run("head_norm_rope", qkv, a.heads, a.head, w.q_norm, w.k_norm,
                                                     cos, sin, a.qk_eps, kv_heads=a.kv_heads))
        u = w.up(run("add_rms_rows", x, w.out(self._attend(q, k, v, segment, offsets), o), w.norm2, a.eps), o)
        return w.down(run("swiglu_rows", u, a.ffn), o)

    def _logits(self, ids, audio, positions, segment, offsets, cond, uncond) -> tuple:
        """Logits [B, C, W, V] f32 of the target rows of packed ids: conditional, and unconditional or None."""
        a = self.arch
        x = self._embed(ids, audio)
        angles = positions[:, None] * self.inv_freq
        cos, sin = angles.cos(), angles.sin()
        down = None
        for w in self.layers:
            if w.fused:
                down = self._fused_layer(w, x, down, cos, sin, segment, offsets)
            else:
                x = self._layer(w, x, cos, sin, segment, offsets)
        if down is not None:
            x = x + down
        b, width = cond.shape
        rows = torch.cat([cond.flatten(), uncond.flatten()])
        y = self.heads(F.rms_norm(x[rows], (a.hidden,), self.final_norm, a.final_eps).to(self.dtype), self.options)
        y = y.float().reshape(-1, b, width, self.codebooks, self.audio_vocab).transpose(2, 3)
        return y[0], (y[1] if y.shape[0] > 1 else None)

    def _step(self, codes, ids, audio, positions, segment, offsets, cond, uncond, valid, reveal, k, *noise):
        """One unmasking step as a function of device tensors (graphed): codes [B, C, W] -> codes. noise: the
        class noise [B, C, W, V] or an empty tensor, then the position noise [B, C, W] or an empty one."""
        flat = codes.transpose(0, 1).reshape(self.codebooks, -1)
        ids = ids.scatter(1, cond.flatten()[None].expand(self.codebooks, -1), flat)
        if uncond.numel():
            ids = ids.scatter(1, uncond.flatten()[None].expand(self.codebooks, -1), flat)
        lc, lu = self._logits(ids, audio, positions, segment, offsets, cond, uncond)
        cls, pos = (t if t.numel() else None for t in noise)
        return unmask_rows(codes, lc, lu, valid, reveal, k, self.mask_id, cls, pos)

    # --- the reference's interfaces ------------------------------------------------------------------------

    @torch.no_grad()
    def target_logits(self, prompts, codes: list[torch.Tensor], guided: bool) -> list[tuple]:
        """OmniVoice.target_logits on the device form: per item (conditional, unconditional or None) [C, T, V] f32
        on the CPU, each item's codes [C, T] in its target rows."""
        lay = layout(prompts, guided, self.mask_id, self.device)
        padded = torch.full((len(prompts), self.codebooks, lay.cond.shape[1]), self.mask_id, dtype=torch.long)
        for i, c in enumerate(codes):
            padded[i, :, :c.shape[1]] = c
        flat = padded.to(self.device).transpose(0, 1).reshape(self.codebooks, -1)
        ids = lay.ids.scatter(1, lay.cond.flatten()[None].expand(self.codebooks, -1), flat)
        if guided:
            ids = ids.scatter(1, lay.uncond.flatten()[None].expand(self.codebooks, -1), flat)
        lc, lu = self._logits(ids, lay.audio, lay.positions, lay.segment, lay.offsets, lay.cond, lay.uncond)
        return [(lc[i, :, :t].cpu(), None if lu is None else lu[i, :, :t].cpu()) for i, t in enumerate(lay.targets)]

    @torch.no_grad()
    def generate_codes(self, prompts, u: Unmasking, generator: torch.Generator, callback=None,
                       should_stop=None) -> list[torch.Tensor]:
        """families/omnivoice.generate_codes on the device: codes [C, T] (on the CPU) of each prompt, the same
        draws from generator in the same order. Within a step nothing waits for the host: the counts, settings
        and noise go to the device ahead of the step (from pinned memory on CUDA)."""
        dev, guided = self.device, u.guidance != 0
        lay = layout(prompts, guided, self.mask_id, dev)
        targets, width = list(lay.targets), lay.cond.shape[1]
        counts = [reveal_counts(self.codebooks * t, u.steps, u.t_shift) for t in targets]
        reveal = torch.tensor(counts, dtype=torch.long).t().contiguous().to(dev)  # [steps, B]
        k, empty = knobs(u, dev), torch.empty(0, device=dev)
        codes = torch.full((len(prompts), self.codebooks, width), self.mask_id, dtype=torch.long, device=dev)
        step, pending = self.graphs or self._step, []
        report = lambda j, done: callback(j + 1, u.steps, [done[b, :, :t] for b, t in enumerate(targets)])  # noqa: E731
        for i in range(u.steps):
            before_step(i, u.steps, should_stop)
            noise = step_noise(generator, [c[i] for c in counts], targets, self.codebooks, self.audio_vocab, u, width)
            noise = [empty if t is None else self._to_device(t) for t in noise]
            codes = step(codes, *lay.tensors(), reveal[i], k, *noise)
            if callback is not None:
                # Reported once done, one step behind on CUDA: step i is queued before step i - 1 is waited for, so
                # the GPU never idles, and progress and cancel keep pace with it (at most two steps in flight).
                pending.append((i, codes, self._done_event()))
                while len(pending) > (1 if self.device.type == "cuda" else 0):
                    j, done, event = pending.pop(0)
                    if event is not None:
                        event.synchronize()
                    report(j, done)
        out = codes.cpu()
        for j, done, _ in pending:
            report(j, done)
        return [out[b, :, :t] for b, t in enumerate(targets)]

    def _done_event(self):
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)
