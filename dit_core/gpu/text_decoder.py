"""A Qwen3-family text model's decoder layers on the engine's kernels (issue 34: a prompt's encode is launch-bound).

transformers' Qwen3 / Qwen3-VL decoder layer launches about 55 kernels (each norm five, rotary eight, casts) through
several Python layers; a BF16 Qwen3-4B prompt took 31 ms on the H200 at any length from 24 to 688 tokens. Here a
layer is the DiT's fused pieces, as OmniVoice's BF16 layers run (dit_core/gpu/omnivoice.py): the residual's add and
the next RMS norm in one pass (add_rms_rows), [q; k; v] one product, q and k normed and turned in one pass
(head_norm_rope, k and v written per query head), causal SDPA, [gate; up] one product, SwiGLU in one pass
(swiglu_rows); each linear BF16 on cuBLAS or INT8 ConvRot on the INT8 kernels (dit_core/gpu/block.py product).
About eleven launches a layer. The residual stream stays f32 (transformers' runs in the weights' dtype), so the
features are nearer the f32 reference than the transformers model's own BF16 forward.

The weights are the transformers model's own: q, k and v (and gate and up) are concatenated once and the modules'
parameters become views of the stack (no second copy; the model's own forward, the reference, still runs). Text
rows only: a prompt with pictures (Qwen3-VL's vision rows, DeepStack) runs the transformers model."""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .block import GpuLinear, product, run
from .options import DEFAULT
from .text_linear import Int8Linear

LAYER_CLASSES = ("Qwen3DecoderLayer", "Qwen3VLTextDecoderLayer")
# A replayed encode's rows: the prompt's padded up to a multiple of this (a graph each; the pads come last, so neither
# the causal mask nor a key mask lets a row before them see them).
REPLAY_ROWS = 64


@dataclass(frozen=True)
class FusedLayer:
    norm1: torch.Tensor  # f32 [hidden]
    norm2: torch.Tensor
    qk_norms: torch.Tensor  # f32 [2, head]: q's and k's gains as rows of one tensor (head_norm_rope reads them so)
    qkv: GpuLinear
    out: GpuLinear
    up: GpuLinear  # [gate; up] rows: its product is [gate | up] as swiglu_rows takes it
    down: GpuLinear


def _stack(modules: list[torch.nn.Module], name: str) -> torch.Tensor:
    """The modules' tensors `name` stacked by rows, each module's then a view of the stack (one module: its own
    tensor, no copy)."""
    if len(modules) == 1:
        return getattr(modules[0], name).detach()
    stack = torch.cat([getattr(m, name).detach() for m in modules])
    row = 0
    for m in modules:
        old = getattr(m, name)
        view = stack[row:row + old.shape[0]]
        setattr(m, name, torch.nn.Parameter(view, requires_grad=False) if isinstance(old, torch.nn.Parameter) else view)
        row += old.shape[0]
    return stack


def _stacked(modules: list[torch.nn.Module]) -> GpuLinear | None:
    """One GpuLinear of the modules' rows stacked (each module's weight, and INT8 scale, then a view of the stack),
    or None where they are not all BF16 nn.Linear without bias or all Int8Linear of one ConvRot group."""
    if all(type(m) is torch.nn.Linear and m.bias is None and m.weight.dtype == torch.bfloat16 for m in modules):
        return GpuLinear(_stack(modules, "weight"), None, None, 0)
    if all(isinstance(m, Int8Linear) for m in modules) and len({m.group for m in modules}) == 1:
        return GpuLinear(_stack(modules, "weight"), _stack(modules, "scale"), None, modules[0].group)
    return None


def _fused(layer: torch.nn.Module) -> FusedLayer | None:
    a, m = layer.self_attn, layer.mlp
    qkv, up = _stacked([a.q_proj, a.k_proj, a.v_proj]), _stacked([m.gate_proj, m.up_proj])
    out, down = _stacked([a.o_proj]), _stacked([m.down_proj])
    if None in (qkv, up, out, down):
        return None
    f32 = lambda t: t.detach().float()  # noqa: E731
    return FusedLayer(f32(layer.input_layernorm.weight), f32(layer.post_attention_layernorm.weight),
                      torch.stack([f32(a.q_norm.weight), f32(a.k_norm.weight)]), qkv, out, up, down)


class FusedDecoder:
    """The decoder layers of a transformers Qwen3Model or Qwen3-VL text model (its layers in the weights' place,
    BF16 or Int8Linear), run by states()."""

    def __init__(self, model: torch.nn.Module, layers: list[FusedLayer]):
        c = model.config
        self.model, self.layers = model, layers
        self.heads, self.kv_heads, self.head = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.eps, self.ffn = c.rms_norm_eps, c.intermediate_size
        self.mrope = type(model).__name__.startswith("Qwen3VL")  # rotary over 3 position axes
        self.graphed = None  # replayed()'s GraphedStep, made at its first call

    @staticmethod
    def of(model: torch.nn.Module, anywhere: bool = False) -> FusedDecoder | None:
        """The fused form of model, or None where it has none: not on a CUDA GPU (anywhere: also on the CPU, where
        the kernels run their references: tests), layers of another kind (Gemma-4's; streamed layers, whose
        weights live on the host), or linears other than BF16 or INT8 ConvRot of one group a stack."""
        weight = model.embed_tokens.weight
        if (weight.device.type != "cuda" and not anywhere) or weight.dtype != torch.bfloat16:
            return None
        if any(type(layer).__name__ not in LAYER_CLASSES for layer in model.layers):
            return None
        layers = [_fused(layer) for layer in model.layers]
        return None if None in layers else FusedDecoder(model, layers)

    def build_ahead(self):
        """The layers' Triton kernels built side by side before the first encode (dit_core/gpu/builds.py; Hopper), not
        one after another as it reaches them (about 2.5 s of a first Qwen3-4B encode on a new machine, H200)."""
        from .builds import Built, build_ahead
        try:
            return build_ahead(self.dry_encode, self.model.embed_tokens.weight.device)
        except Exception as e:  # noqa: BLE001 - an optimization: the first encode builds as it runs
            return Built(0, 0.0, refused=f"{type(e).__name__}: {e}")

    def dry_encode(self) -> dict[int, torch.Tensor]:
        """An encode of 16 tokens of id 0 through every layer: the kernels any prompt launches."""
        ids = torch.zeros(1, 16, dtype=torch.long, device=self.model.embed_tokens.weight.device)
        return self.states(ids, (len(self.layers),))

    def rotary(self, positions: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [rows, head / 2] f32 of the model's own rotary module at positions ([1, rows], or [3, 1, rows]
        per mRoPE axis): its split-half angles, each frequency once."""
        probe = torch.empty(1, rows, self.head, device=positions.device)  # only its dtype and device are read
        # A Qwen3-VL rotary takes [3, B, L], as its text model's forward gives it (5.17's indexes three axes).
        if self.mrope and positions.dim() == 2:
            positions = positions[None].expand(3, -1, -1)
        cos, sin = self.model.rotary_emb(probe, positions)
        half = self.head // 2
        return cos[0, :, :half].float().contiguous(), sin[0, :, :half].float().contiguous()

    @torch.no_grad()
    def replayed(self, ids: torch.Tensor, taps: Collection[int], positions: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        """states() replayed from a CUDA graph (dit_core/gpu/step_graph.py GraphedStep), one captured for each
        length the rows pad to (REPLAY_ROWS) at its second encode (its first runs eagerly), the taps' rows cut
        back: an encode launches about eleven kernels a layer for a few milliseconds of GPU work at a prompt's
        length, so its host set the pace. ids padded with token 0, positions with 0, the mask with 0 (unseen); the
        same rows as states() gives the prompt, as far as the products' and attention's kernels at the padded
        length sum alike. No check() within it."""
        from .step_graph import GraphedStep
        rows = ids.shape[-1]
        padded = -(-rows // REPLAY_ROWS) * REPLAY_ROWS
        if positions is None:
            positions = torch.arange(rows, device=ids.device)[None]

        def grown(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros(*t.shape[:-1], padded)
            out[..., :rows] = t
            return out
        causal = mask is None or bool(mask.all())  # (before the graph: it reads the mask back)
        if self.graphed is None:
            self.graphed = GraphedStep(self._tapped, capture="second")
        taps = tuple(sorted(taps))
        got = self.graphed(grown(ids), grown(positions), *(() if causal else (grown(mask),)), taps=taps,
                           causal=causal)
        return {k: t[:, :rows] for k, t in zip(taps, got)}

    def _tapped(self, ids: torch.Tensor, positions: torch.Tensor, *mask: torch.Tensor, taps: tuple[int, ...],
                causal: bool) -> tuple[torch.Tensor, ...]:
        """states()' taps as a tuple in taps' order, of one pass (replayed()'s step)."""
        states = self.states(ids, taps, positions, mask[0] if mask else None, causal=causal)
        return tuple(states[k] for k in taps)

    @torch.no_grad()
    def states(self, ids: torch.Tensor, taps: Collection[int], positions: torch.Tensor | None = None,
               mask: torch.Tensor | None = None, check: Callable[[], None] | None = None,
               causal: bool | None = None) -> dict[int, torch.Tensor]:
        """transformers' hidden_states[k] ([1, L, hidden] f32) for k in taps, of ids [1, L]: k = 0 the embeddings,
        k >= 1 decoder layer k - 1's output (taps past the layers: ValueError). positions: the model's position
        ids (default 0..L-1); mask [1, L]: keys of 0 unseen (with the causal mask); check() before each layer.
        causal: whether the mask is all ones (None: read from it)."""
        last = max(taps)
        if last > len(self.layers):
            raise ValueError(f"FusedDecoder: hidden state {last} past the model's {len(self.layers)} layers")
        rows = ids.shape[-1]
        if positions is None:
            positions = torch.arange(rows, device=ids.device)[None]
        cos, sin = self.rotary(positions, rows)
        causal = (mask is None or bool(mask.all())) if causal is None else causal
        bias = None if causal else torch.ones(rows, rows, dtype=torch.bool, device=ids.device).tril() & mask.bool()
        x = self.model.embed_tokens(ids)[0].float()
        kept, down, o = {}, None, DEFAULT
        for i, w in enumerate(self.layers[:last]):
            if check is not None:
                check()
            h = run("add_rms_rows", x, down, w.norm1, self.eps)  # x is now hidden_states[i]
            if i in taps:
                kept[i] = x.clone()
            q, k, v = run("head_norm_rope", product(h, w.qkv, o), self.heads, self.head, w.qk_norms[0],
                          w.qk_norms[1], cos, sin, self.eps, kv_heads=self.kv_heads)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal)
            h = run("add_rms_rows", x, product(a.transpose(1, 2).reshape(rows, -1), w.out, o), w.norm2, self.eps)
            down = product(run("swiglu_rows", product(h, w.up, o), self.ffn), w.down, o)
        if down is not None:
            x += down
        kept[last] = x
        return {k: kept[k][None] for k in taps}
