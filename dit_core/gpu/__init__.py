"""The GPU path: the block on the GPU (block.py: INT8 ConvRot linears and fused kernels through kernels/), staging and
streaming of blocks that do not fit, and steps replayed from CUDA graphs. Host (reference) code never imports from
here at module level."""
