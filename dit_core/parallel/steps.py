"""What a rank of a RankPool runs: a family's model loaded from its file into the rank's state, then
its steps sequence-parallel across the ranks."""
from __future__ import annotations

from .shards import Ranks


def load_model(ranks: Ranks, state: dict, family: str, path: str) -> None:
    """The family's model (FAMILIES) from `path` into this rank's state, on the host, as stored."""
    from ..families import FAMILIES
    state["model"] = FAMILIES[family].recipe.load(path)


def model_step(ranks: Ranks, state: dict, method: str, args: tuple, options: dict):
    """The loaded model's `method` (MiniMaxH3.velocity / denoised, LTX25.forward) on args and options, its blocks
    across the ranks: every rank holds all the rows' inputs and gets all the rows' outputs. The pool's check runs
    after each block (its cancel and progress)."""
    return getattr(state["model"], method)(*args, **options, check=state.get("check"), ranks=ranks)

