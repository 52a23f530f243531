"""`swiftdit prebuild`: the first prompt's Triton kernels built once per machine, into Triton's on-disk cache, from the
model files a ComfyUI will load, so that a new server's first prompt loads them instead of building them (about 8 s
of a first Z-Image prompt on an H100; a restart, which finds them on disk, is 1.37 times stock's).

Each file is read as the nodes read it at load: a DiT by its family's one-block stand-in and its dry pass
(dit_core/families/loading.stand_in), a Qwen3 or Qwen3-VL text encoder by its one-layer stand-in's dry encode (the 4B
encoders' BF16 load), and their kernels built side by side (dit_core/gpu/builds.build_ahead). Only on a GPU where the
kernels build ahead (Hopper); only safetensors files. The VAE decoders' norm kernels (BF16, as the nodes decode on a
GPU; one build serves every file and size) are built too: a first decode built them as it ran.

    python -m swiftdit.cli prebuild [FILE ...] [--comfyui DIR]   (from the pack's folder: its kernels/ beside)
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from dit_core.codecs.flux1_vae import NORM_WIDTHS as FLUX_NORM_WIDTHS
from dit_core.codecs.qwen_image_vae import NORM_WIDTHS as QWEN_NORM_WIDTHS
from dit_core.families import FAMILIES
from dit_core.families.loading import stand_in
from dit_core.gpu.block import kernels
from dit_core.gpu.builds import STAND_IN_ROOM, Built, build_ahead, not_built_here
from dit_core.text.qwen3 import Qwen3TextEncoder
from dit_core.text.qwen3_vl import Qwen3VLTextEncoder
from dit_core.weights import WeightsError

# ComfyUI's default folders of the files the nodes load: DiTs, text encoders (and their older names)
MODEL_FOLDERS = ("diffusion_models", "unet", "text_encoders", "clip")
TEXT_ENCODERS = {"Qwen3": Qwen3TextEncoder, "Qwen3-VL": Qwen3VLTextEncoder}


@dataclass(frozen=True)
class Prebuilt:
    """One file: what it was read as ('' where nothing here reads it), what build_ahead did, and the error that
    stopped it (the next file is built all the same)."""
    path: Path
    read_as: str
    built: Built | None
    failed: str | None = None


def files_of(comfyui: Path) -> list[Path]:
    """The safetensors files of a ComfyUI folder's model folders (MODEL_FOLDERS under models/), each file once (an
    older folder name is often a link to the newer)."""
    found: dict[Path, Path] = {}
    for folder in MODEL_FOLDERS:
        for f in sorted((comfyui / "models" / folder).rglob("*.safetensors")):
            found.setdefault(f.resolve(), f)
    return list(found.values())


def dry_step(path: Path, device: torch.device) -> tuple[str, Callable[[], object]] | None:
    """(what the file is read as, its stand-in's dry step): a family's DiT, else a text encoder; None where nothing
    here reads it."""
    for family in FAMILIES.values():
        if hasattr(family.recipe, "dry_pass"):
            try:
                return f"{family.title} DiT", stand_in(family.recipe, path, "stored", device).dry_pass
            except WeightsError:
                pass
    for name, encoder in TEXT_ENCODERS.items():
        try:
            fused = encoder.stand_in(path, torch.bfloat16, device)
        except WeightsError:
            continue
        # (None: its layers do not run fused here, so there is nothing to build)
        return f"{name} text encoder", (lambda: None) if fused is None else fused.dry_encode
    return None


def decoder_norms(device: torch.device) -> Built:
    """The image VAE decoders' norm kernels in BF16, as the nodes run them channels last: the group norm's
    (kernels/group_norm.py: FLUX.1's and FLUX.2's VAEs) and the channel RMS norm's (kernels/channel_rms.py:
    Qwen-Image's, Krea 2's)."""
    t0 = time.perf_counter()
    if (refused := not_built_here(device)) is not None:
        return Built(0, 0.0, refused=refused)
    ops = kernels()
    built = ops.group_norm.build(torch.bfloat16, last_widths=FLUX_NORM_WIDTHS) + \
        ops.channel_rms.build(torch.bfloat16, QWEN_NORM_WIDTHS)
    return Built(built, time.perf_counter() - t0)


def prebuild(paths: Iterable[Path], device: torch.device) -> list[Prebuilt]:
    """Each file's kernels built (a file nothing here reads: read_as '')."""
    done = []
    for path in paths:
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else STAND_IN_ROOM
        if free < STAND_IN_ROOM:  # (a server may be running beside: leave its memory alone)
            done.append(Prebuilt(path, "", None, f"the card has {free / 2**30:.1f} GiB free, a stand-in may take "
                                                 f"{STAND_IN_ROOM >> 30}; run it again when it has"))
            continue
        try:
            found = dry_step(path, device)
            done.append(Prebuilt(path, "", None) if found is None else
                        Prebuilt(path, found[0], build_ahead(found[1], device)))
        except Exception as e:  # noqa: BLE001 - said for this file; the others still build
            done.append(Prebuilt(path, "", None, f"{type(e).__name__}: {e}"))
        found = None
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the stand-in's memory, before the next file's
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="swiftdit prebuild", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path, metavar="FILE", help="model files (.safetensors)")
    p.add_argument("--comfyui", type=Path, metavar="DIR",
                   help=f"a ComfyUI folder: every .safetensors under models/{{{','.join(MODEL_FOLDERS)}}}")
    args = p.parse_args(argv)
    paths = list(args.files) + (files_of(args.comfyui) if args.comfyui else [])
    bad = [f for f in paths if f.suffix != ".safetensors" or not f.is_file()]
    if bad or not paths:
        print("swiftdit prebuild: error: " + (f"not a .safetensors file: {', '.join(map(str, bad))}" if bad else
              "no model files: name them, or a ComfyUI folder with --comfyui"), file=sys.stderr)
        return 2
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    t0 = time.perf_counter()
    done = prebuild(paths, device)
    ready = 0
    for d in done:
        if d.failed:
            print(f"{d.path.name}: failed: {d.failed}")
        elif d.built is None:
            dits = ", ".join(f.title for f in FAMILIES.values() if hasattr(f.recipe, "dry_pass"))
            print(f"{d.path.name}: not a file whose kernels build ahead (a DiT of {dits}, or a "
                  f"{' or '.join(TEXT_ENCODERS)} text encoder)")
        elif d.built.refused:
            print(f"{d.path.name} ({d.read_as}): nothing built: {d.built.refused}")
        else:
            ready += d.built.kernels
            print(f"{d.path.name} ({d.read_as}): {d.built.kernels} kernels ready in {d.built.seconds:.2f} s"
                  + (f"; its dry step stopped early: {d.built.stopped}" if d.built.stopped else ""))
    norms = decoder_norms(device)
    if norms.refused:
        print(f"VAE decoders' norms: nothing built: {norms.refused}")
    else:
        ready += norms.kernels
        print(f"VAE decoders' norms: {norms.kernels} kernels ready in {norms.seconds:.2f} s")
    if not ready:
        print("swiftdit prebuild: no kernel built or found: nothing done", file=sys.stderr)
        return 1
    print(f"{ready} kernels in Triton's cache in {time.perf_counter() - t0:.1f} s")
    return 0
