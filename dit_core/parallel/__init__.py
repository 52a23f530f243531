"""Several processes for one step: sequence parallelism of the shared block (shards.py) and its ranks (launch.py)."""
from .launch import RankFailed, run_ranks
from .shards import Ranks, SequenceShards, shares

__all__ = ["RankFailed", "Ranks", "SequenceShards", "run_ranks", "shares"]
