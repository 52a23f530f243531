"""The Arch dataclass: what a model computes, as its family's recipe reads it from the checkpoint."""
from __future__ import annotations

from dataclasses import dataclass

MLP_KINDS = ("swiglu", "gelu_tanh")


@dataclass(frozen=True)
class Arch:
    """Sizes and constants of one DiT. Checked on construction (ValueError), the FluxParams habit."""
    family: str
    hidden: int            # residual width
    layers: int            # main blocks
    refiner: int           # refiner blocks per stream (Z-Image: noise and context refiners)
    heads: int
    head: int              # values per attention head
    ffn: int               # MLP hidden width (SwiGLU: gate and up each this wide)
    latents: int           # latent channels
    patch: tuple[int, ...]  # patch size per spatial axis
    text_dim: int          # width of the text encoder's rows
    freq_dim: int          # sinusoid width of the time embedding
    time_hidden: int       # time MLP's hidden width
    time_dim: int          # width of the time embedding the modulation linears take
    eps: float             # block norms
    qk_eps: float          # head norms
    final_eps: float       # final layer's norm
    rope_axes: tuple[int, ...]  # head values each position axis rotates (two per frequency)
    rope_theta: float
    norm: str = "rms"      # the block's modulated norm: "rms" (with a gain) or "layer" (no affine)
    kv_heads: int = 0      # heads of keys and values (grouped-query attention; 0: as many as the queries')
    attn_gate: bool = False  # QKV also yields `hidden` gate values a row: attention times their sigmoid before OUT
    # The attention's (inner) width, heads x head, where it differs from the residual width (MiniMax H3: 56 x 128 =
    # 7168 over 5376); 0: the residual width. Stated rather than derived, so a misread head count still fails here.
    inner: int = 0
    mlp: str = "swiglu"    # the MLP's kind: "swiglu" (UP's rows gluRows) or "gelu_tanh" (UP, GELU tanh, DOWN: LTX-2.5)
    qk_norm: str = "head"  # q/k RMS "head" by head (gain [head]) or "across" all heads at once (gain [width]: LTX-2.5)

    def __post_init__(self):
        if self.heads * self.head != (self.inner or self.hidden):
            raise ValueError(f"{self.family}: heads {self.heads} x head {self.head} != attention width "
                             f"{self.inner or self.hidden} (hidden {self.hidden}, inner {self.inner})")
        if any(d <= 0 or d % 2 for d in self.rope_axes):
            raise ValueError(f"{self.family}: rotary axis widths {self.rope_axes} must be positive and even")
        if sum(self.rope_axes) > self.head:
            raise ValueError(f"{self.family}: rotary axes {self.rope_axes} rotate more than a head of {self.head}")
        if self.norm not in ("rms", "layer"):
            raise ValueError(f"{self.family}: norm must be 'rms' or 'layer', got {self.norm!r}")
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"{self.family}: mlp must be one of {MLP_KINDS}, got {self.mlp!r}")
        if self.qk_norm not in ("head", "across"):
            raise ValueError(f"{self.family}: qk_norm must be 'head' or 'across', got {self.qk_norm!r}")
        if self.kv_heads < 0 or (self.kv_heads and self.heads % self.kv_heads):
            raise ValueError(f"{self.family}: {self.kv_heads} key/value heads do not divide {self.heads} heads")
        if min(self.layers, self.heads, self.ffn, self.latents, self.text_dim) <= 0:
            raise ValueError(f"{self.family}: sizes must be positive: {self}")

    @property
    def width(self) -> int:
        """Values of the attention's queries (and keys, and values) per row."""
        return self.heads * self.head

    @property
    def key_width(self) -> int:
        """Values of the keys (and of the values) per row: fewer than the queries' under grouped-query attention."""
        return (self.kv_heads or self.heads) * self.head

    @property
    def qkv_width(self) -> int:
        """Values QKV's product gives a row: queries, keys, values, and the attention gate's where there is one."""
        return self.width + 2 * self.key_width + (self.width if self.attn_gate else 0)

    @property
    def rotary(self) -> int:
        """Values of each head that rotate (the first `rotary` of a head, as split halves)."""
        return sum(self.rope_axes)
