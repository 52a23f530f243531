"""The GPU path's options: a frozen value a model is given once (its recipe's defaults, Model.to(..., options=)),
passed down from its step to each block and on to kernels.run. Nothing here is a module switch: a benchmark times a
variant by giving the model another value (dataclasses.replace of the recipe's)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Options:
    """int8_attention: attention scores on the INT8 matrix cores (kernels/int8/attention.py) in blocks whose QKV is
    INT8 (BF16 linears keep cuDNN's bf16: the precise path); off, cuDNN's bf16 SDPA. attention_8bit: both attention
    products on the 8-bit matrix cores (kernels/attention_8bit.py: INT8 q k^T, e4m3 p v; about 3.5% from f32 against
    INT8 scores' 1.2% and cuDNN bf16's 0.2%) in blocks whose QKV is INT8, before int8_attention. turn_v: v leaves
    the fused QKV turned for an INT8 OUT where it can (block._turns_v). turn_hidden: UP's SwiGLU rows turned for an
    INT8 DOWN (block._turns_hidden). gelu_in_up: a GELU MLP's GELU in its INT8 UP's epilogue, the rows turned there
    for an INT8 DOWN (pieces.mlp_into: LTX-2.5's step at stage 2 2.6% faster on an H100, 5.6% fewer joules); off,
    GELU in DOWN's quantizer. mlp_chunk: the most rows a chunk of the MLP takes (its temporaries, UP's [rows, ffn]
    output and codes, stay a few hundred MB; 8192 takes a 1024^2 image's 4608 rows in one chunk). concurrent_modes:
    few rows' blocks on side streams beside the many rows' (FLUX.3 Klein's text and reference mode blocks beside the
    image's, LTX-2.5's audio branches beside the video's; else one after another). carry_norms: each norm's row
    statistics written by the kernel before it that writes the rows (NormStats; the MLP's by the attention branch's),
    else made by a pass of their own. planned_attention: SDPA's cuDNN back end first (the fastest at a shape it has
    run: it builds a plan for each new shape, 40-55 ms on an H100); off, flash attention first (about 1 ms at a new
    shape): for blocks whose rows change with every prompt, as a text fusion's. kernels: which kernels of equal math
    run, a kernels.Choices (kernels/choices.py; None: its defaults), handed to kernels.run as it is (dit_core opens
    kernels/ in one place, dit_core/gpu/block.py)."""
    int8_attention: bool = False
    attention_8bit: bool = False
    turn_v: bool = True
    turn_hidden: bool = True
    gelu_in_up: bool = True
    mlp_chunk: int = 8192
    concurrent_modes: bool = True
    carry_norms: bool = True
    planned_attention: bool = True
    kernels: Any = None

    def for_prompt_rows(self) -> "Options":
        """These options for blocks over a prompt's rows (a text fusion, caption and token refiners): a prompt of
        another length is another attention shape, so no per-shape plans."""
        return replace(self, planned_attention=False)


DEFAULT = Options()  # blocks called without options (tests, tools); a model passes its own
