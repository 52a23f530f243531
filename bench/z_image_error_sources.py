"""Where the INT8 ConvRot step's error comes from: the Z-Image step at 1024x1024 on random weights (the model of
bench_z_image_step.py), run by the f32 host block on the GPU with each block linear's weights and input rows
quantized or exact, kind by kind (QKV, OUT, UP, DOWN). Every row is the step's relative Frobenius distance from
the all-exact f32 step, and from the step of the INT8 weights with exact rows (W8 everywhere).

The modes of a linear (both operands in ConvRot's basis, so exact rows and weights give the float product):
  exact   f32 weights, f32 rows
  W8      the stored INT8 ConvRot weights (codes times row scales), f32 rows: the file's own error
  A8      f32 weights, rows quantized per row as ComfyUI does (scale absmax/127, round, clamp)
  W8A8    both: the format's arithmetic (what our kernels and ComfyUI's compute, up to rounding order)
  W8A8g   W8 with rows quantized per ConvRot group (256 features) instead of per row (a scale a group)

    python bench/z_image_error_sources.py [--layers 30] [--vector-std 0.5]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import dit_core.block as host_block  # noqa: E402
from bench_z_image_step import random_reference, rel  # noqa: E402
from dit_core.block import DOWN, OUT, QKV, UP  # noqa: E402
from dit_core.families.z_image import ZImage  # noqa: E402
from dit_core.linear import linear as host_linear  # noqa: E402
from dit_core.weights import (TensorSource, convrot_group_for, quantize_convrot, quantize_rows, rotate,  # noqa: E402
                              rotate_weight)

KINDS = {QKV: "QKV", OUT: "OUT", UP: "UP", DOWN: "DOWN"}


def on_device(obj, device: str):
    """The model's tensors on device in f32 (int8 codes stay int8), its blocks staying host Blocks."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device) if obj.dtype == torch.int8 else obj.to(device, torch.float32)
    if isinstance(obj, tuple):
        return tuple(on_device(o, device) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: on_device(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


class Operands:
    """Each block linear's weights in ConvRot's basis, exact (f32) and as the INT8 codes times their scales."""

    def __init__(self, model: ZImage):
        self.kind, self.group, self.exact, self.int8 = {}, {}, {}, {}
        for block in model.context + model.noise + model.blocks:
            for index, name in KINDS.items():
                lin = block.w[index]
                key = lin.weight.data_ptr()
                self.kind[key] = name
                self.group[key] = group = convrot_group_for(lin.in_features)
                self.exact[key] = rotate_weight(lin.weight.float(), group)
                codes, scale = quantize_convrot(lin.weight.float(), group)
                self.int8[key] = codes.float() * scale
        self.modes = {}

    def linear(self, x: torch.Tensor, lin) -> torch.Tensor:
        """host_block.linear's stand-in: the product under this kind's mode, in f32."""
        key = lin.weight.data_ptr()
        mode = self.modes[self.kind[key]]
        group = self.group[key]
        rows = rotate(x.reshape(-1, x.shape[-1]).float(), group)
        if mode in ("A8", "W8A8"):
            codes, scale = quantize_rows(rows)
            rows = codes.float() * scale
        elif mode == "W8A8g":
            grouped = rows.reshape(rows.shape[0], -1, group)
            codes, scale = quantize_rows(grouped)
            rows = (codes.float() * scale).reshape(rows.shape)
        weight = self.int8[key] if mode in ("W8", "W8A8", "W8A8g") else self.exact[key]
        y = rows @ weight.t()
        if lin.bias is not None:
            y = y + lin.bias.float()
        return y.reshape(*x.shape[:-1], -1)


def checked(operands: Operands, model: ZImage) -> None:
    """The emulation against the engine's own host products on one linear of each kind: exact against the float
    product, W8A8 against dit_core.linear's INT8 ConvRot emulation (f32 products of codes: off by f32 rounding)."""
    for index, name in KINDS.items():
        lin = model.blocks[0].w[index]
        x = torch.randn(64, lin.in_features, device=lin.weight.device)
        for mode, reference in (("exact", lin), ("W8A8", lin.as_int8())):
            operands.modes = {name: mode}
            err = rel(operands.linear(x, lin), host_linear(x, reference))
            if err > 1e-5:
                raise AssertionError(f"{name} {mode}: the emulation is {err:.2e} from the engine's host product")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--vector-std", type=float, default=0.5, help="std of the random biases/gains")
    args = p.parse_args(argv)
    from tiny_models import z_image_comfy_layout
    torch.backends.cuda.matmul.allow_tf32 = False

    ref = random_reference(args.layers, args.vector_std)
    state = {k: v.cpu() for k, v in z_image_comfy_layout(ref.state_dict()).items()}
    del ref
    torch.cuda.empty_cache()
    model = on_device(ZImage.load(TensorSource(state), linears="stored"), "cuda")
    del state
    operands = Operands(model)
    checked(operands, model)
    torch.manual_seed(1)
    latent = torch.randn(16, args.size // 8, args.size // 8, device="cuda")
    caption = torch.randn(512, 2560, device="cuda")
    sigma = 0.6429
    print(f"# Z-Image step error by source, {args.size}x{args.size}, {args.layers} layers, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}; random vectors N(0, {args.vector_std})")

    def step(**modes) -> torch.Tensor:
        operands.modes = {name: modes.get(name, modes.get("default", "exact")) for name in KINDS.values()}
        with torch.no_grad():
            return model.output(latent, sigma, caption)

    host_block.linear = operands.linear  # the host block's seam for its linears (this script only)
    start = time.time()
    truth = step()
    print(f"(one f32 step: {time.time() - start:.1f} s)")
    rows = [("W8A8 everywhere (the format)", dict(default="W8A8")),
            ("W8 everywhere, rows exact", dict(default="W8")),
            ("A8 everywhere, weights exact", dict(default="A8")),
            ("W8 + rows per 256-group everywhere", dict(default="W8A8g"))]
    rows += [(f"W8A8, {name}'s rows exact", {"default": "W8A8", name: "W8"}) for name in KINDS.values()]
    rows += [(f"W8A8, {name}'s rows per 256-group", {"default": "W8A8", name: "W8A8g"}) for name in KINDS.values()]
    rows += [(f"exact, {name} W8A8", {"default": "exact", name: "W8A8"}) for name in KINDS.values()]
    int8_weights = step(default="W8")
    print("| linears | step vs exact f32 | vs W8 everywhere (the INT8 weights in f32) |")
    print("|---|---|---|")
    for label, modes in rows:
        out = step(**modes)
        print(f"| {label} | {rel(out, truth):.4f} | {rel(out, int8_weights):.4f} |", flush=True)


if __name__ == "__main__":
    main()
