"""Reading saved images and comparing two runs (PSNR over 8-bit pixels, as a viewer sees them)."""

from __future__ import annotations

import math
import os

import numpy as np
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load(path: str | os.PathLike) -> np.ndarray:
    """An image file as uint8 [H, W, 3]."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def psnr(a: np.ndarray, b: np.ndarray, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB (inf for identical images); shapes must match."""
    if a.shape != b.shape:
        raise ValueError(f"psnr: image shapes differ: {a.shape} vs {b.shape}")
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0.0 else 10.0 * math.log10(peak * peak / mse)
