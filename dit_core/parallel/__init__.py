"""Several processes for one step: sequence parallelism of the shared block (shards.py), its ranks (launch.py), what
they run (steps.py) and the model standing in for them where a sampler runs it (ranked.py)."""
from .launch import Cancelled, RankFailed, RankPool, run_ranks
from .ranked import RankedModel, RanksDoNotFit
from .shards import Ranks, SequenceShards, shares

__all__ = ["Cancelled", "RankFailed", "RankPool", "RankedModel", "Ranks", "RanksDoNotFit", "SequenceShards",
           "run_ranks", "shares"]
