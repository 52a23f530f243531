"""OmniVoice's unmasking sampler (reference/families/omnivoice.md section 5): every target code starts as
MASK, and each step reveals a scheduled number of them, the most confident first, from logits guided on log
probabilities.

Facts: omnivoice 0.2.1 omnivoice/models/omnivoice.py (_generate_iterative, _predict_tokens_with_scoring,
_get_time_steps, _gumbel_sample, _filter_top_k). Its draws come from the global RNG; ours from a
torch.Generator the caller seeds, drawing the same shapes in the same order (per step, per item with something
to reveal: the class noise [C, T, V] when class_temperature > 0, then the position noise [C, T] when
position_temperature > 0), so a CPU generator seeded with s gives the package's codes after
torch.manual_seed(s)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .ksampler import before_step

GUMBEL_EPS = 1e-10  # inside both logarithms of the Gumbel noise, as the package adds it
TOP_CLASSES = 0.1   # class sampling keeps the top 10 % of the classes (ceil)


class Codebooks:
    """What a model's audio tables say, for the loop (the host model and its device form alike; each has `arch`
    and `audio_embedding` [codebooks x audio_vocab, hidden])."""

    @property
    def codebooks(self) -> int:
        return self.arch.latents

    @property
    def audio_vocab(self) -> int:
        """Classes per codebook: 1024 codes and MASK."""
        return self.audio_embedding.shape[0] // self.codebooks

    @property
    def mask_id(self) -> int:
        """MASK, the last class of each codebook (the package's audio_mask_id, 1024)."""
        return self.audio_vocab - 1


@dataclass(frozen=True)
class Unmasking:
    """The loop's settings; the defaults are OmniVoiceGenerationConfig's. steps: forwards; guidance: CFG
    weight on log probabilities (0: no unconditional rows); t_shift: the schedule's shift (small: few codes
    early); layer_penalty: confidence taken off per codebook index (earlier codebooks first);
    position_temperature: Gumbel temperature of which positions to reveal (0: the most confident);
    class_temperature: of which code (0: argmax)."""
    steps: int = 32
    guidance: float = 2.0
    t_shift: float = 0.1
    layer_penalty: float = 5.0
    position_temperature: float = 5.0
    class_temperature: float = 0.0

    def __post_init__(self):
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"OmniVoice sampler: steps must be an integer >= 1, got {self.steps!r}")
        if not self.t_shift > 0:
            raise ValueError(f"OmniVoice sampler: t_shift must be > 0, got {self.t_shift}")
        if self.position_temperature < 0 or self.class_temperature < 0:
            raise ValueError("OmniVoice sampler: temperatures must be >= 0")


def shifted_times(steps: int, t_shift: float) -> torch.Tensor:
    """steps + 1 times s t / (1 + (s - 1) t) on t = linspace(0, 1) in f32 (the package's _get_time_steps)."""
    t = torch.linspace(0.0, 1.0, steps + 1)
    return t_shift * t / (1 + (t_shift - 1) * t)


def reveal_counts(total: int, steps: int, t_shift: float) -> list[int]:
    """Codes revealed at each step out of total: ceil(total x the step's span of shifted_times), at most
    what is left; the last step reveals the rest. The spans are taken in Python floats, as the package
    takes them."""
    times, counts, left = shifted_times(steps, t_shift).tolist(), [], total
    for step in range(steps):
        n = left if step == steps - 1 else min(math.ceil(total * (times[step + 1] - times[step])), left)
        counts.append(n)
        left -= n
    return counts


def gumbel(scores: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """scores / temperature + Gumbel noise drawn as one rand of scores' shape."""
    scaled = scores / temperature
    u = torch.rand(scaled.shape, generator=generator, dtype=scaled.dtype, device=scaled.device)
    return scaled - torch.log(-torch.log(u + GUMBEL_EPS) + GUMBEL_EPS)


def guided_log_probs(cond: torch.Tensor, uncond: torch.Tensor | None, guidance: float,
                     mask_id: int) -> torch.Tensor:
    """log_softmax(lc + g (lc - lu)) of the conditional and unconditional log probabilities [C, T, V] (lc
    alone when g is 0), the MASK class at -inf."""
    lp = torch.log_softmax(cond, dim=-1)
    if guidance != 0:
        lp = torch.log_softmax(lp + guidance * (lp - torch.log_softmax(uncond, dim=-1)), dim=-1)
    lp[..., mask_id] = -float("inf")
    return lp


def unmask_step(codes: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor | None, reveal: int,
                u: Unmasking, mask_id: int, generator: torch.Generator | None) -> torch.Tensor:
    """codes [C, T] with `reveal` more MASK positions filled from the f32 logits of their target rows [C, T,
    V]: each position's code (argmax, or Gumbel-argmax over the top classes) and its confidence (the best log
    probability, less layer_penalty x codebook index, Gumbel-perturbed at position_temperature); the most
    confident still-masked positions are revealed."""
    lp = guided_log_probs(cond, uncond, u.guidance, mask_id)
    if u.class_temperature > 0:
        top, where = lp.topk(math.ceil(TOP_CLASSES * lp.shape[-1]), dim=-1)
        kept = torch.full_like(lp, -float("inf")).scatter_(-1, where, top)
        picked = gumbel(kept, u.class_temperature, generator).argmax(dim=-1)
    else:
        picked = lp.argmax(dim=-1)
    scores = lp.max(dim=-1)[0] - torch.arange(codes.shape[0], device=codes.device)[:, None] * u.layer_penalty
    if u.position_temperature > 0:
        scores = gumbel(scores, u.position_temperature, generator)
    scores = scores.masked_fill(codes != mask_id, -float("inf"))
    chosen = torch.topk(scores.flatten(), reveal).indices
    out = codes.flatten().clone()
    out[chosen] = picked.flatten()[chosen]
    return out.view_as(codes)


# logits(targets) -> per item (conditional, unconditional or None) logits [C, T, V] f32 of the target rows
TargetLogits = Callable[[list[torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor | None]]]


def sample_unmasking(logits: TargetLogits, target_lens: list[int], codebooks: int, mask_id: int,
                     u: Unmasking, generator: torch.Generator | None, callback=None,
                     should_stop=None) -> list[torch.Tensor]:
    """Codes [C, T_i] for each item: all MASK, then u.steps forwards of every item together (logits sees each
    item's current codes), each revealing its scheduled count (none: the item draws nothing that step).
    callback(step + 1, steps, codes) after each step; should_stop() is asked before each step, raising
    SamplingCancelled."""
    codes = [torch.full((codebooks, t), mask_id, dtype=torch.long) for t in target_lens]
    counts = [reveal_counts(codebooks * t, u.steps, u.t_shift) for t in target_lens]
    for step in range(u.steps):
        before_step(step, u.steps, should_stop)
        for i, (cond, uncond) in enumerate(logits(codes)):
            if counts[i][step] > 0:
                codes[i] = unmask_step(codes[i], cond, uncond, counts[i][step], u, mask_id, generator)
        if callback is not None:
            callback(step + 1, u.steps, codes)
    return codes


# --- the same loop over device tensors (dit_core/gpu/omnivoice.py): items padded to one width, no host syncs ---

def step_noise(generator: torch.Generator | None, reveal: list[int], targets: list[int], codebooks: int,
               vocab: int, u: Unmasking, width: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One step's uniform draws, as sample_unmasking draws them (per item with something to reveal: the class
    noise [C, T, V], then the position noise [C, T]), padded to [B, C, width, V] and [B, C, width] (0.5 where
    nothing is drawn; None when that temperature is 0). Made on the host: the draws never depend on logits."""
    b = len(targets)
    cls = torch.full((b, codebooks, width, vocab), 0.5) if u.class_temperature > 0 else None
    pos = torch.full((b, codebooks, width), 0.5) if u.position_temperature > 0 else None
    for i, (n, t) in enumerate(zip(reveal, targets)):
        if n > 0 and cls is not None:
            cls[i, :, :t] = torch.rand((codebooks, t, vocab), generator=generator)
        if n > 0 and pos is not None:
            pos[i, :, :t] = torch.rand((codebooks, t), generator=generator)
    return cls, pos


def knobs(u: Unmasking, device) -> torch.Tensor:
    """[guidance, layer_penalty, position_temperature, class_temperature] f32 on device: the values a graphed step
    reads as a tensor (one graph serves every setting; which terms run is the inputs' shapes)."""
    return torch.tensor([u.guidance, u.layer_penalty, u.position_temperature, u.class_temperature],
                        dtype=torch.float32, device=device)


def _gumbel_of(scaled: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    return scaled - torch.log(-torch.log(noise + GUMBEL_EPS) + GUMBEL_EPS)


def unmask_rows(codes: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor | None, valid: torch.Tensor,
                reveal: torch.Tensor, k: torch.Tensor, mask_id: int, class_noise: torch.Tensor | None,
                position_noise: torch.Tensor | None) -> torch.Tensor:
    """unmask_step for B items at once, padded to one width W: codes [B, C, W], logits [B, C, W, V] f32, valid
    [B, W] (an item's own positions), reveal [B] long (this step's counts, on the device), k: knobs(u);
    the noises from step_noise (None: that temperature is 0). The `reveal` most confident valid masked
    positions of each item are filled: ranked by a stable sort, so the count stays a tensor."""
    lp = torch.log_softmax(cond, dim=-1)
    if uncond is not None:
        lp = torch.log_softmax(lp + k[0] * (lp - torch.log_softmax(uncond, dim=-1)), dim=-1)
    lp[..., mask_id] = -float("inf")
    if class_noise is not None:
        top, where = lp.topk(math.ceil(TOP_CLASSES * lp.shape[-1]), dim=-1)
        kept = torch.full_like(lp, -float("inf")).scatter_(-1, where, top)
        picked = _gumbel_of(kept / k[3], class_noise).argmax(dim=-1)
    else:
        picked = lp.argmax(dim=-1)
    layer = torch.arange(codes.shape[1], device=codes.device)[:, None]
    scores = lp.max(dim=-1)[0] - layer * k[1]
    if position_noise is not None:
        scores = _gumbel_of(scores / k[2], position_noise)
    scores = scores.masked_fill((codes != mask_id) | ~valid[:, None, :], -float("inf")).flatten(1)
    order = scores.argsort(dim=1, descending=True, stable=True)
    ranks = torch.arange(order.shape[1], device=codes.device).expand_as(order).contiguous()
    rank = torch.empty_like(order).scatter_(1, order, ranks)
    return torch.where((rank < reveal[:, None]).view_as(codes), picked, codes)
