"""What a family's node file declares once as its SETTINGS: the sampling schedule's shift (what kind of shift it is
and its default) and the estimate of a pass's size that the memory checks use (nodes/memory.py). No ComfyUI import:
memory.py and base.py both read it."""
from __future__ import annotations

from dataclasses import dataclass, replace

# What a schedule's shift is: one number meant a different schedule for each family.
FLOW = "flow"  # ModelSamplingAuraFlow's shift: the discrete flow table time_shift(shift, t) (Z-Image)
KLEIN = "klein"  # FLUX.3 Klein's schedule: time_shift(shift, linspace(1, 1/steps, steps)) then 0 (klein_sigmas)
FLUX_MU = "flux_mu"  # ModelSamplingFlux's mu: the flux table e^mu / (e^mu + 1/t - 1) (Krea 2)
H3 = "h3"  # MiniMax H3's video shift on its shifted linspace grid (12; the audio grid keeps its own shift, 3)
SHIFT_KINDS = (FLOW, KLEIN, FLUX_MU, H3)


@dataclass(frozen=True)
class Schedule:
    """A sampling schedule's shift and what kind of shift it is: what a SWIFTDIT_MODEL handle carries, the family's
    default from its loader, changed by its ModelSampling node."""
    kind: str
    shift: float
    second_shift: float | None = None  # a second stream's own shift (MiniMax H3's audio grid); None: the family's

    def __post_init__(self):
        if self.kind not in SHIFT_KINDS:
            raise ValueError(f"schedule kind {self.kind!r} is not one of {', '.join(SHIFT_KINDS)}")

    def at(self, shift: float, second_shift: float | None = None) -> Schedule:
        """This schedule at another shift of the same kind (a ModelSampling node's), the second stream's shift kept
        unless given."""
        return replace(self, shift=shift, second_shift=self.second_shift if second_shift is None else second_shift)


@dataclass(frozen=True)
class PassSize:
    """A family's estimate of a DiT pass's size: the image pixels one image row stands for (check_request's
    megapixels and largest fitting size), and the rows a pass is given room for before a prompt says how many it
    takes (at load, and for a loader or LoRA node that runs no pass)."""
    image_row_pixels: int
    default_rows: int
    video: bool = False  # a video family's: its image rows span the latent frames (a refusal says fewer frames)


@dataclass(frozen=True)
class FamilySettings:
    """A family's sampling and pass-size settings, declared once in its node file and read by its loader, sampler
    and load_dit (base.dit_loader)."""
    schedule: Schedule  # the loader's default schedule
    pass_size: PassSize
