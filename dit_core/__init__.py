"""swiftdit's DiT engine: the shared AdaLN block, packed sequences, weights as stored, families; no ComfyUI."""
from .arch import Arch
from .block import Block
from .families import FAMILIES
from .modulation import Modulation
from .sequence import Sequence


def load_family(name: str, path, **options):
    """Model `name` (a key of FAMILIES) from its checkpoint file."""
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name].load(path, **options)


__all__ = ["FAMILIES", "Arch", "Block", "Modulation", "Sequence", "load_family"]
