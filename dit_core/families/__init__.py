"""FAMILIES: family name -> its recipe's model class (the named-config table)."""
from .z_image import ZImage

FAMILIES = {"z_image": ZImage}
