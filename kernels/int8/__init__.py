"""The INT8 ConvRot kernels: the quantizer passes (rows to codes: modulated norm, rotation, codes), the INT8 GEMMs
with their fused epilogues (Triton, and Gluon on Hopper), the fused QKV with head norm and rotary, and attention with
INT8 scores. kernels/__init__.py's op table is how callers reach them."""
from . import attention, linear, linear_hopper, qkv_rope_linear, quant, quant_turned

__all__ = ["attention", "linear", "linear_hopper", "qkv_rope_linear", "quant", "quant_turned"]
