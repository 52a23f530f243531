"""What a rank runs: a family's step from its file, sequence-parallel across the ranks (launch.run_ranks' fn)."""
from __future__ import annotations

import torch

from .shards import Ranks


def minimax_h3_velocity(ranks: Ranks, path: str, txt: torch.Tensor, video: torch.Tensor, audio: torch.Tensor,
                        layout, times: torch.Tensor, time_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MiniMaxH3.velocity of one packed sequence with the model loaded from `path` on this rank (host, as stored):
    every rank holds all the rows' inputs and gets all the rows' outputs; the blocks run on its share."""
    from ..families.minimax_h3 import MiniMaxH3
    return MiniMaxH3.load(path).velocity(video, audio, txt, layout, times, time_index, ranks=ranks)


def ltx25_velocity(ranks: Ranks, path: str, args: tuple, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """LTX25.forward(*args, **options) with the model loaded from `path` on this rank (host, as stored): each
    stream's rows split across the ranks, the A<->V attentions across both streams' shares."""
    from ..families.ltx25 import LTX25
    return LTX25.load(path).forward(*args, **options, ranks=ranks)
