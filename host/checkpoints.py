"""A deterministic, cached random-weight Z-Image checkpoint set in ComfyUI's models-folder layout.

    python -m host.checkpoints [--cache DIR] [--layers N]      # prints the set's folder

Under `.cache/models/<key>/`: diffusion_models/z_image_turbo_bf16.safetensors (full width 3840, so the stock
UNETLoader detects Z-Image: reference/comfyui_host.md section 6), diffusion_models/z_image_turbo_int8_convrot
.safetensors (the same weights through swiftdit quantize), text_encoders/qwen_3_4b.safetensors (a tiny
random Qwen3 whose hidden size is the DiT's cap_feat_dim), vae/ae.safetensors (a full-size random FLUX.1 VAE:
the stock VAELoader fixes ch 128, ch_mult [1, 2, 4, 4] and reads only z_channels, comfy/sd.py VAE.__init__).
Weights are scaled so activations stay near unit size (std 1/sqrt(fan_in), gains near 1, small adaLN), so the
images are neither flat nor NaN. Every tensor has its own torch.Generator seeded from its name: the set is
bit-identical on every machine, and adding a tensor leaves the others unchanged.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = ROOT / ".cache" / "models"
# Bump whenever anything below changes what is written: the folder name carries it; old sets are not reused.
VERSION = 1
SEED = 20251202

# Z-Image DiT: what the stock loader fixes (comfy/supported_models.py ZImage) plus what we choose.
DIM, HEADS, HEAD, FFN = 3840, 30, 128, 10240
REFINERS = 2
PATCH_VALUES = 2 * 2 * 16
FREQ, T_HIDDEN, T_DIM = 256, 1024, 256
DIT_PREFIX = "model.diffusion_model."
# Tiny Qwen3 text encoder; its hidden size is the DiT's cap_feat_dim. Qwen3-4B's shape in miniature: more
# query heads than kv heads, q_proj wider than hidden. Our loader uses all but the last layer
# (hidden_states[-2]).
TE_HIDDEN, TE_LAYERS, TE_HEADS, TE_KV_HEADS, TE_HEAD, TE_FFN, TE_VOCAB = 64, 3, 4, 2, 32, 160, 151936
# FLUX.1 VAE (BFL ae.safetensors): fixed by the stock loader.
VAE_CH, VAE_MULT, VAE_BLOCKS, VAE_Z = 128, (1, 2, 4, 4), 2, 16

DIT_BF16 = "z_image_turbo_bf16.safetensors"
DIT_INT8 = "z_image_turbo_int8_convrot.safetensors"
TEXT_ENCODER = "qwen_3_4b.safetensors"
VAE = "ae.safetensors"
DONE = "COMPLETE"


@dataclass(frozen=True)
class ModelSet:
    """Where one generated set lies; `folders` maps ComfyUI's model kinds to folders (--base-directory)."""

    root: Path
    layers: int

    @property
    def folders(self) -> dict[str, Path]:
        return {k: self.root / k for k in ("diffusion_models", "text_encoders", "vae", "loras")}

    @property
    def dit_bf16(self) -> Path:
        return self.root / "diffusion_models" / DIT_BF16

    @property
    def dit_int8(self) -> Path:
        return self.root / "diffusion_models" / DIT_INT8

    @property
    def text_encoder(self) -> Path:
        return self.root / "text_encoders" / TEXT_ENCODER

    @property
    def vae(self) -> Path:
        return self.root / "vae" / VAE


class _Random:
    """Tensors drawn from a generator seeded by (SEED, name), in f32, then stored in `dtype`."""

    def __init__(self, dtype: torch.dtype, device: str = "cpu"):
        self.dtype, self.device = dtype, torch.device(device)
        self.sd: dict[str, torch.Tensor] = {}

    def _normal(self, name: str, shape) -> torch.Tensor:
        # On a GPU (real sizes: billions of values) the draws differ from the CPU's: cache_key tells the sets apart.
        g = torch.Generator(self.device).manual_seed(SEED ^ zlib.crc32(name.encode()))
        return torch.randn(shape, generator=g, dtype=torch.float32, device=self.device).cpu()

    def linear(
        self, name: str, out: int, inp: int, bias: bool = False, gain: float = 1.0, bias_std: float = 0.02
    ):
        # std gain/sqrt(fan_in): unit-size inputs give unit-size outputs.
        self.sd[f"{name}.weight"] = (self._normal(f"{name}.weight", (out, inp)) * (gain / inp**0.5)).to(
            self.dtype
        )
        if bias:
            self.sd[f"{name}.bias"] = (self._normal(f"{name}.bias", (out,)) * bias_std).to(self.dtype)

    def conv(self, name: str, cin: int, cout: int, k: int = 3, gain: float = 1.0):
        fan_in = cin * k * k
        self.sd[f"{name}.weight"] = (
            self._normal(f"{name}.weight", (cout, cin, k, k)) * (gain / fan_in**0.5)
        ).to(self.dtype)
        self.sd[f"{name}.bias"] = (self._normal(f"{name}.bias", (cout,)) * 0.02).to(self.dtype)

    def gain(self, name: str, size: int, std: float = 0.1):
        # Norm gains near 1 (ComfyUI's and our RMSNorm use the weight as is, not 1 + weight).
        self.sd[name] = (1.0 + self._normal(name, (size,)) * std).to(self.dtype)

    def group_norm(self, name: str, size: int):
        self.gain(f"{name}.weight", size)
        self.sd[f"{name}.bias"] = (self._normal(f"{name}.bias", (size,)) * 0.02).to(self.dtype)

    def normal(self, name: str, shape, std: float = 1.0):
        self.sd[name] = (self._normal(name, shape) * std).to(self.dtype)


def dit_state_dict(layers: int, cap_dim: int = TE_HIDDEN, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Z-Image's ComfyUI single-file tensors (reference/families/z_image.md section 6), bf16, with prefix."""
    r = _Random(torch.bfloat16, device)
    p = DIT_PREFIX

    def block(name: str, modulated: bool):
        r.linear(f"{name}.attention.qkv", 3 * DIM, DIM)
        r.linear(f"{name}.attention.out", DIM, DIM)
        r.gain(f"{name}.attention.q_norm.weight", HEAD)
        r.gain(f"{name}.attention.k_norm.weight", HEAD)
        r.linear(f"{name}.feed_forward.w1", FFN, DIM)
        r.linear(f"{name}.feed_forward.w3", FFN, DIM)
        r.linear(f"{name}.feed_forward.w2", DIM, FFN)
        for n in ("attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"):
            r.gain(f"{name}.{n}.weight", DIM)
        if modulated:
            # scale, gate, scale, gate: small weights so the time embedding nudges them, and a bias of std 0.5
            # so tanh(gate) is mostly well away from 0 (a zero gate would switch the block off).
            r.linear(f"{name}.adaLN_modulation.0", 4 * DIM, T_DIM, bias=True, gain=0.3, bias_std=0.5)

    for i in range(layers):
        block(f"{p}layers.{i}", True)
    for i in range(REFINERS):
        block(f"{p}noise_refiner.{i}", True)
        block(f"{p}context_refiner.{i}", False)
    r.linear(f"{p}x_embedder", DIM, PATCH_VALUES, bias=True)
    r.gain(f"{p}cap_embedder.0.weight", cap_dim)
    r.linear(f"{p}cap_embedder.1", DIM, cap_dim, bias=True)
    r.linear(f"{p}t_embedder.mlp.0", T_HIDDEN, FREQ, bias=True, bias_std=0.1)
    r.linear(f"{p}t_embedder.mlp.2", T_DIM, T_HIDDEN, bias=True, bias_std=0.1)
    r.linear(f"{p}final_layer.linear", PATCH_VALUES, DIM, bias=True)
    r.linear(f"{p}final_layer.adaLN_modulation.1", DIM, T_DIM, bias=True, gain=0.3, bias_std=0.1)
    # Pad tokens at the size of embedded rows: they are attended like real rows (z_image.md section 3).
    r.normal(f"{p}x_pad_token", (1, DIM))
    r.normal(f"{p}cap_pad_token", (1, DIM))
    r.sd[f"{p}norm_final.weight"] = torch.ones(
        DIM, dtype=torch.bfloat16
    )  # in the file, unused (section 12.5)
    return r.sd


def text_encoder_state_dict() -> dict[str, torch.Tensor]:
    """A tiny Qwen3 in ComfyUI's text_encoders layout (keys as qwen_3_4b.safetensors), bf16."""
    r = _Random(torch.bfloat16)
    r.normal("model.embed_tokens.weight", (TE_VOCAB, TE_HIDDEN))
    for i in range(TE_LAYERS):
        p = f"model.layers.{i}"
        r.linear(f"{p}.self_attn.q_proj", TE_HEADS * TE_HEAD, TE_HIDDEN)
        r.linear(f"{p}.self_attn.k_proj", TE_KV_HEADS * TE_HEAD, TE_HIDDEN)
        r.linear(f"{p}.self_attn.v_proj", TE_KV_HEADS * TE_HEAD, TE_HIDDEN)
        r.linear(f"{p}.self_attn.o_proj", TE_HIDDEN, TE_HEADS * TE_HEAD)
        r.gain(f"{p}.self_attn.q_norm.weight", TE_HEAD)
        r.gain(f"{p}.self_attn.k_norm.weight", TE_HEAD)
        r.linear(f"{p}.mlp.gate_proj", TE_FFN, TE_HIDDEN)
        r.linear(f"{p}.mlp.up_proj", TE_FFN, TE_HIDDEN)
        r.linear(f"{p}.mlp.down_proj", TE_HIDDEN, TE_FFN)
        r.gain(f"{p}.input_layernorm.weight", TE_HIDDEN)
        r.gain(f"{p}.post_attention_layernorm.weight", TE_HIDDEN)
    r.gain("model.norm.weight", TE_HIDDEN)
    return r.sd


def vae_state_dict() -> dict[str, torch.Tensor]:
    """A FLUX.1 VAE (BFL names, encoder and decoder, no quant convs), f32 as BFL's ae.safetensors."""
    r = _Random(torch.float32)
    ch = [VAE_CH * m for m in VAE_MULT]

    def resnet(name: str, cin: int, cout: int):
        r.group_norm(f"{name}.norm1", cin)
        r.conv(f"{name}.conv1", cin, cout)
        r.group_norm(f"{name}.norm2", cout)
        # Half gain on the branch: a dozen residual adds in a row stay about unit size.
        r.conv(f"{name}.conv2", cout, cout, gain=0.5)
        if cin != cout:
            r.conv(f"{name}.nin_shortcut", cin, cout, k=1)

    def mid(name: str, c: int):
        resnet(f"{name}.block_1", c, c)
        r.group_norm(f"{name}.attn_1.norm", c)
        for q in ("q", "k", "v", "proj_out"):
            r.conv(f"{name}.attn_1.{q}", c, c, k=1)  # 1x1 convs [C, C, 1, 1] as in the real file
        resnet(f"{name}.block_2", c, c)

    # Encoder (never used to decode, but the stock loader warns "Missing VAE keys" without it).
    r.conv("encoder.conv_in", 3, ch[0])
    cin = ch[0]
    for level, c in enumerate(ch):
        for j in range(VAE_BLOCKS):
            resnet(f"encoder.down.{level}.block.{j}", cin, c)
            cin = c
        if level < len(ch) - 1:
            r.conv(f"encoder.down.{level}.downsample.conv", c, c)
    mid("encoder.mid", ch[-1])
    r.group_norm("encoder.norm_out", ch[-1])
    r.conv("encoder.conv_out", ch[-1], 2 * VAE_Z)
    # Decoder.
    r.conv("decoder.conv_in", VAE_Z, ch[-1])
    mid("decoder.mid", ch[-1])
    cin = ch[-1]
    for level in reversed(range(len(ch))):
        for j in range(VAE_BLOCKS + 1):
            resnet(f"decoder.up.{level}.block.{j}", cin, ch[level])
            cin = ch[level]
        if level > 0:
            r.conv(f"decoder.up.{level}.upsample.conv", ch[level], ch[level])
    r.group_norm("decoder.norm_out", ch[0])
    r.conv(
        "decoder.conv_out", ch[0], 3, gain=0.5
    )  # about half of the clamp range [-1, 1]: few clipped pixels
    return r.sd


def cache_key(layers: int, device: str = "cpu") -> str:
    drawn_on = "" if torch.device(device).type == "cpu" else f"-{torch.device(device).type}"
    return f"z_image-v{VERSION}-dim{DIM}-l{layers}-cap{TE_HIDDEN}{drawn_on}"


def ensure(cache: str | os.PathLike = DEFAULT_CACHE, layers: int = 1, log=print, device: str = "cpu") -> ModelSet:
    """The set for `layers` main DiT layers, generated on first use (about 30 s on 2 cores), else reused. device:
    where the DiT's values are drawn and quantized (a GPU for the real size, 30 layers: seconds, not minutes)."""
    from swiftdit.quantize import quantize_file  # our own offline tool makes the INT8 file

    if layers < 1:
        raise ValueError(
            f"layers must be >= 1 (the stock loader counts layers.N to build the model), got {layers}"
        )
    final = Path(cache) / cache_key(layers, device)
    if (final / DONE).is_file():
        return ModelSet(final, layers)
    _prune(Path(cache))
    # Written beside the final folder and renamed when complete: an interrupted run never passes for a set.
    tmp = final.with_name(f"{final.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for kind in ("diffusion_models", "text_encoders", "vae", "loras"):
        (tmp / kind).mkdir(parents=True)
    log(f"host.checkpoints: generating {final.name} (random weights, deterministic)")
    save_file(text_encoder_state_dict(), str(tmp / "text_encoders" / TEXT_ENCODER))
    save_file(vae_state_dict(), str(tmp / "vae" / VAE))
    sd = dit_state_dict(layers, device=device)
    save_file(sd, str(tmp / "diffusion_models" / DIT_BF16))
    del sd
    quantize_file(tmp / "diffusion_models" / DIT_BF16, tmp / "diffusion_models" / DIT_INT8, device=device)
    (tmp / DONE).write_text(f"{cache_key(layers, device)}\n")
    try:
        tmp.rename(final)
    except OSError:  # another process finished the same set first: theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / DONE).is_file():
            raise
    return ModelSet(final, layers)


def _prune(cache: Path) -> None:
    """Delete sets of other VERSIONs (2.7 GB each) and partial folders whose writer is gone."""
    for folder in cache.glob("z_image-v*"):
        version = folder.name.split("-")[1]
        if ".partial-" in folder.name:
            pid = int(folder.name.rsplit("-", 1)[1]) if folder.name.rsplit("-", 1)[1].isdigit() else 0
            if pid and _alive(pid):
                continue  # another process is writing it now
        elif version == f"v{VERSION}":
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.checkpoints", description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="cache folder (default .cache/models)")
    parser.add_argument("--layers", type=int, default=1, help="main DiT layers (default 1; the real model has 30)")
    parser.add_argument("--device", default="cpu", help="where the DiT's values are drawn (default cpu)")
    args = parser.parse_args(argv)
    print(ensure(args.cache, args.layers, log=lambda m: print(m, file=sys.stderr), device=args.device).root)
    return 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
