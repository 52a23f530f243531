"""PNG files written on several threads: the same pixels and text chunks PIL writes for ComfyUI's SaveImage, its
per-row filter choice, deflated in bands that carry the previous band's 32 KiB as history (pigz's way) into one
zlib stream, so a 1024x1024 image no longer waits on one core for its filters and deflate."""
from __future__ import annotations

import os
import struct
import zlib
from concurrent.futures import Executor

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
WINDOW = 32 * 1024            # deflate's history: each band is primed with this much of what precedes it
BAND_BYTES = 128 * 1024       # the least a band holds: smaller ones cost more in flushes and primings than they gain
COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type: grey, grey + alpha, RGB, RGBA
# PIL's encoder (libImaging/ZipEncode.c) tries None, Up, Sub and Paeth in this order and keeps a later filter only
# where its cost is strictly less: the first least cost, which np.argmin gives.
FILTER_ORDER = np.array([0, 2, 1, 4], dtype=np.uint8)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS tells it): the bands worth deflating."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def to_bytes(image) -> np.ndarray:
    """A ComfyUI IMAGE (H, W, C) in [0, 1] as uint8 pixels, as SaveImage makes them (255 * x, clipped, truncated),
    computed where the tensor is (on a card, 4 times less to copy) and NaN as 0."""
    import torch
    pixels = torch.nan_to_num(image.float() * 255.0, nan=0.0).clamp_(0, 255).to(torch.uint8)
    return pixels.cpu().numpy()


def filtered(rows: np.ndarray, above: np.ndarray, bpp: int) -> np.ndarray:
    """Rows (n, width * bpp) of uint8 under the row above the first (zeros above an image's first row) as PNG's
    filtered rows (n, 1 + width * bpp): each row's filter type, then its bytes under the filter of least cost,
    the cost being the sum of |byte as int8| (libpng's heuristic, as PIL uses it)."""
    x = rows
    up = np.empty_like(x)
    up[0], up[1:] = above, x[:-1]
    left, upper_left = np.zeros_like(x), np.zeros_like(x)
    left[:, bpp:], upper_left[:, bpp:] = x[:, :-bpp], up[:, :-bpp]
    # Paeth's distances: |b - c|, |a - c| and |a + b - 2c| for a left, b up, c upper left
    to_up, to_left = up.astype(np.int16), left.astype(np.int16)
    corner = upper_left.astype(np.int16)
    to_up -= corner
    to_left -= corner
    pc = np.abs(to_up + to_left)
    pa, pb = np.abs(to_up, out=to_up), np.abs(to_left, out=to_left)
    paeth_pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, upper_left))
    candidates = (x, x - up, x - left, x - paeth_pred)  # uint8 arithmetic wraps, as PNG's does
    cost = np.stack([np.abs(c.view(np.int8)).view(np.uint8).sum(axis=1, dtype=np.int64) for c in candidates])
    choice = cost.argmin(axis=0)
    out = np.empty((x.shape[0], x.shape[1] + 1), dtype=np.uint8)
    out[:, 0] = FILTER_ORDER[choice]
    for i, candidate in enumerate(candidates):
        np.copyto(out[:, 1:], candidate, where=(choice == i)[:, None])
    return out


def _band(pixels: np.ndarray, start: int, stop: int, level: int, first: bool, last: bool) -> tuple[list, bytes]:
    """Rows start..stop filtered and deflated: (their filtered bytes in pieces, their part of the zlib stream). The
    first band opens the stream (zlib's header), the last closes its deflate blocks; the others end on a byte
    boundary (a sync flush), primed with the filtered bytes before `start` so that they match as one stream would.
    Rows go through in blocks of about 1 MiB: the filters' temporaries stay small for any image."""
    h, w, ch = pixels.shape
    rows = pixels.reshape(h, w * ch)
    zero = np.zeros(w * ch, dtype=np.uint8)

    def block(a: int, b: int) -> bytes:
        return filtered(rows[a:b], rows[a - 1] if a else zero, ch).tobytes()
    lead = max(0, start - -(-WINDOW // (w * ch + 1)))
    history = block(lead, start)[-WINDOW:] if start else b""
    # memLevel 9 and Z_FILTERED: PIL's settings, so a one-band image deflates to PIL's very bytes
    deflate = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS if first else -zlib.MAX_WBITS, 9,
                               zlib.Z_FILTERED, **({"zdict": history} if history else {}))
    step = max(1, (1 << 20) // (w * ch))
    data = [block(a, min(stop, a + step)) for a in range(start, stop, step)]
    stream = b"".join(deflate.compress(piece) for piece in data)
    return data, stream + deflate.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def text_chunk(key: str, value: str) -> bytes:
    """tEXt where both are Latin-1, else iTXt (UTF-8, uncompressed, no language): PIL's PngInfo.add_text."""
    try:
        return _chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1"))
    except UnicodeEncodeError:
        return _chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + value.encode("utf-8"))


def png_bytes(pixels: np.ndarray, text: dict[str, str] | None = None, level: int = 4,
              pool: Executor | None = None, bands: int = 1, band_bytes: int = BAND_BYTES) -> bytes:
    """A PNG file of uint8 pixels (H, W) or (H, W, C) with C of 1-4, its text chunks before the image data as PIL
    places them; up to `bands` pieces of at least `band_bytes` deflated on `pool`'s threads (zlib and numpy let go
    of the GIL)."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in COLOR_TYPE or 0 in pixels.shape:
        raise ValueError(f"PNG pixels must be uint8 (H, W, 1-4 channels); got {pixels.dtype} {tuple(pixels.shape)}")
    if not 0 <= level <= 9:
        raise ValueError(f"PNG compress level must be 0-9; got {level}")
    pixels = np.ascontiguousarray(pixels)
    h, w, ch = pixels.shape
    row_bytes = w * ch + 1
    bands = max(1, min(bands, h, (h * row_bytes) // band_bytes))
    edges = [round(i * h / bands) for i in range(bands + 1)]
    jobs = [(pixels, edges[i], edges[i + 1], level, i == 0, i == bands - 1) for i in range(bands)]
    done = list(pool.map(_band, *zip(*jobs))) if pool is not None and bands > 1 else [_band(*j) for j in jobs]
    stream = b"".join(piece for _, piece in done)
    if bands > 1:  # the one stream's Adler-32, over every band's filtered bytes in order
        adler = 1
        for data, _ in done:
            for piece in data:
                adler = zlib.adler32(piece, adler)
        stream += struct.pack(">I", adler)
    header = struct.pack(">IIBBBBB", w, h, 8, COLOR_TYPE[ch], 0, 0, 0)
    texts = b"".join(text_chunk(k, v) for k, v in (text or {}).items())
    return SIGNATURE + _chunk(b"IHDR", header) + texts + _chunk(b"IDAT", stream) + _chunk(b"IEND", b"")
