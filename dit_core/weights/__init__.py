"""Weights as stored: the checkpoint reader (checkpoint.py), ConvRot (convrot.py), one linear as stored (linear.py),
the table of stored formats each linear is read through (stored.py: BF16/F16/F32, INT8 ConvRot, scaled FP8, W4A8 in
w4a8.py), and LoRAs merged into linears at load (lora.py). The names the engine reads are these."""
from .checkpoint import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    SAFETENSORS_DTYPES,
    BlocksOnUse,
    Checkpoint,
    FirstBlocks,
    HeaderOnly,
    TensorSource,
    WeightsError,
    moved_to,
    read_tensor,
)
from .convrot import (
    CONVROT_GROUP,
    convrot_group_for,
    dequantize_convrot,
    hadamard,
    quantize_convrot,
    quantize_rows,
    rotate,
    rotate_weight,
)
from .linear import Linear, glu_rows, stack_rows
from .stored import STORED_FORMATS, read_linear

__all__ = ["CONVROT_GROUP", "FLOAT_DTYPES", "FP8_DTYPES", "SAFETENSORS_DTYPES", "STORED_FORMATS", "BlocksOnUse",
           "Checkpoint", "FirstBlocks", "HeaderOnly", "Linear", "TensorSource", "WeightsError", "convrot_group_for",
           "dequantize_convrot", "glu_rows", "hadamard", "moved_to", "quantize_convrot", "quantize_rows", "read_linear",
           "read_tensor", "rotate", "rotate_weight", "stack_rows"]
