"""FAMILIES: family name -> its recipe's model class (the named-config table)."""
from .flux3_klein import Flux3Klein
from .krea2 import Krea2
from .z_image import ZImage

FAMILIES = {"z_image": ZImage, "flux3_klein": Flux3Klein, "krea2": Krea2}
