"""Several processes for one step: sequence parallelism of the shared block (shards.py), its ranks (launch.py) and
what they run (steps.py)."""
from .launch import Cancelled, RankFailed, RankPool, run_ranks
from .shards import Ranks, SequenceShards, shares

__all__ = ["Cancelled", "RankFailed", "RankPool", "Ranks", "SequenceShards", "run_ranks", "shares"]
