"""Save Image, the stock node's widget, file names and metadata, its PNG rows filtered on the card where ComfyUI has
one and deflated on every core (dit_core/codecs/png.py): the stock node takes about a quarter of a whole 1024x1024
Z-Image graph on one core."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import comfy.model_management
import folder_paths
import torch
from comfy.cli_args import args
from comfy_api.latest import io

from ..dit_core.codecs.png import available_cores, filtered_image, png_bytes, to_bytes
from .base import SwiftDiTError

NODE_ID = "SwiftDiTSaveImage"
COMPRESS_LEVEL = 4  # the stock SaveImage's


def metadata(prompt, extra_pnginfo) -> dict[str, str]:
    """The text chunks the stock node writes: the prompt, then each extra_pnginfo entry, as JSON (none where ComfyUI
    runs with --disable-metadata)."""
    if args.disable_metadata:
        return {}
    text = {"prompt": json.dumps(prompt)} if prompt is not None else {}
    return text | {key: json.dumps(value) for key, value in (extra_pnginfo or {}).items()}


def write_new(folder: str, name_at, counter: int, data: bytes) -> tuple[str, int]:
    """data in the first file name from `counter` on that does not exist yet (never over a file already there, if
    another writer took the name since ComfyUI counted the folder): (its name, the next counter)."""
    while True:
        name = name_at(counter)
        try:
            with open(os.path.join(folder, name), "xb") as f:
                f.write(data)
            return name, counter + 1
        except FileExistsError:
            counter += 1


def filtered_on_card(image, device):
    """The image's PNG rows filtered on the card, or its pixels for the CPU's filters where the card has no room
    left for the filters' few tens of MB (the model and what it made may fill a small card)."""
    try:
        return filtered_image(image, device)
    except torch.cuda.OutOfMemoryError:
        return to_bytes(image)


class SaveImage(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=NODE_ID, display_name="Save Image (SwiftDiT)", category="SwiftDiT", is_output_node=True,
            description="Saves the input images to your ComfyUI output directory: the stock Save Image's files, "
                        "names and metadata, its PNG compressed on every CPU core.",
            inputs=[io.Image.Input("images", tooltip="The images to save."),
                    io.String.Input("filename_prefix", default="ComfyUI",
                                    tooltip="The prefix for the file to save. This may include formatting "
                                            "information such as %date:yyyy-MM-dd% or %Empty Latent Image.width% "
                                            "to include values from nodes.")],
            # the images passed on, as newer ComfyUI's Save Image gives them (its templates wire that output)
            outputs=[io.Image.Output("saved_images", display_name="images", tooltip="The images, passed on.")],
            hidden=[io.Hidden.prompt, io.Hidden.extra_pnginfo])

    @classmethod
    def execute(cls, images, filename_prefix: str = "ComfyUI") -> io.NodeOutput:
        if images.ndim != 4 or images.shape[-1] not in (1, 3, 4):
            raise SwiftDiTError(f"{NODE_ID} · images: expected IMAGE (batch, height, width, 1, 3 or 4 channels); got "
                                f"shape {tuple(images.shape)}")
        folder, filename, counter, subfolder, _ = folder_paths.get_save_image_path(
            filename_prefix, folder_paths.get_output_directory(), images.shape[2], images.shape[1])
        text = metadata(getattr(cls.hidden, "prompt", None), getattr(cls.hidden, "extra_pnginfo", None))
        cores = available_cores()
        device = comfy.model_management.get_torch_device()
        results = []
        with ThreadPoolExecutor(max_workers=cores, thread_name_prefix="swiftdit-png") as pool:
            for batch_number, image in enumerate(images):
                pixels = to_bytes(image) if device.type == "cpu" else filtered_on_card(image, device)
                data = png_bytes(pixels, text, COMPRESS_LEVEL, pool, bands=cores)
                stem = filename.replace("%batch_num%", str(batch_number))
                name, counter = write_new(folder, lambda c: f"{stem}_{c:05}_.png", counter, data)
                results.append({"filename": name, "subfolder": subfolder, "type": "output"})
        return io.NodeOutput(images, ui={"images": results})


NODES = [SaveImage]
