"""PNG files written on several threads: the same pixels and text chunks PIL writes for ComfyUI's SaveImage, its
per-row filter choice, deflated in bands that carry the previous band's 32 KiB as history (pigz's way) into one
zlib stream, so a 1024x1024 image no longer waits on one core for its filters and deflate. Where a card is at hand
the filters run there (`filtered_image`), and the cores only deflate."""
from __future__ import annotations

import os
import struct
import zlib
from concurrent.futures import Executor
from dataclasses import dataclass

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
    return uint8_pixels(image).cpu().numpy()


def uint8_pixels(image):
    """`to_bytes`'s pixels as a torch tensor where the IMAGE is."""
    import torch
    return torch.nan_to_num(image.float() * 255.0, nan=0.0).clamp_(0, 255).to(torch.uint8)


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


def filtered_torch(rows, above, bpp: int):
    """`filtered` in torch, on the device the uint8 rows (n, width * bpp) are on: the same bytes."""
    import torch
    x = rows.to(torch.int16)
    up = torch.cat([above.to(torch.int16)[None], x[:-1]])
    left, upper_left = torch.zeros_like(x), torch.zeros_like(x)
    left[:, bpp:], upper_left[:, bpp:] = x[:, :-bpp], up[:, :-bpp]
    pa, pb = (up - upper_left).abs(), (left - upper_left).abs()
    pc = (up + left - 2 * upper_left).abs()
    paeth_pred = torch.where((pa <= pb) & (pa <= pc), left, torch.where(pb <= pc, up, upper_left))
    candidates = torch.stack([x, x - up, x - left, x - paeth_pred]) & 255  # PNG's arithmetic wraps at a byte
    cost = torch.where(candidates < 128, candidates, 256 - candidates).sum(dim=2)
    choice = cost.argmin(dim=0)  # the first least cost, as np.argmin
    chosen = candidates.gather(0, choice[None, :, None].expand(1, *x.shape))[0]
    order = torch.tensor(FILTER_ORDER, device=x.device, dtype=torch.int16)
    return torch.cat([order[choice][:, None], chosen], dim=1).to(torch.uint8)


@dataclass
class FilteredImage:
    """An image's PNG rows already filtered (as `filtered_image` makes them on a card): (H, 1 + W * C) uint8."""
    rows: np.ndarray
    width: int
    channels: int


def filtered_image(image, device, block_bytes: int = 4 << 20) -> FilteredImage:
    """A ComfyUI IMAGE (H, W, C) as SaveImage's uint8 pixels, PNG-filtered on `device` in row blocks of about
    `block_bytes` (the filters' temporaries, about 20 times that, bounded for any size) and brought to the host:
    3 MiB to copy for a 1024x1024 image, and the CPU's 100 ms of filters a few ms on a card."""
    import torch
    h, w, ch = image.shape
    rows = uint8_pixels(image.to(device)).reshape(h, w * ch)
    step = max(1, block_bytes // (w * ch))
    above = torch.zeros(w * ch, dtype=torch.uint8, device=rows.device)
    out = torch.empty((h, w * ch + 1), dtype=torch.uint8, device=rows.device)
    for a in range(0, h, step):
        out[a:a + step] = filtered_torch(rows[a:a + step], rows[a - 1] if a else above, ch)
    return FilteredImage(out.cpu().numpy(), w, ch)


def adler32_combine(adler1: int, adler2: int, length2: int) -> int:
    """The Adler-32 of two pieces from each one's and the second's length (zlib's adler32_combine)."""
    base = 65521
    rem = length2 % base
    low = ((adler1 & 0xFFFF) + (adler2 & 0xFFFF) + base - 1) % base
    high = (rem * (adler1 & 0xFFFF) + (adler1 >> 16) + (adler2 >> 16) + base - rem) % base
    return low | (high << 16)


def _band(rows_between, row_bytes: int, start: int, stop: int, level: int, first: bool,
          last: bool) -> tuple[int, int, bytes]:
    """Rows start..stop filtered (`rows_between(a, b)`, their bytes) and deflated: (their Adler-32, their length,
    their part of the zlib stream). The first band opens the stream (zlib's header), the last closes its deflate
    blocks; the others end on a byte boundary (a sync flush), primed with the filtered bytes before `start` so that
    they match as one stream would. Rows go through in blocks of about 1 MiB: the filters' temporaries stay small
    for any image."""
    lead = max(0, start - -(-WINDOW // row_bytes))
    history = bytes(rows_between(lead, start))[-WINDOW:] if start else b""
    # memLevel 9 and Z_FILTERED: PIL's settings, so a one-band image deflates to PIL's very bytes
    deflate = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS if first else -zlib.MAX_WBITS, 9,
                               zlib.Z_FILTERED, **({"zdict": history} if history else {}))
    step = max(1, (1 << 20) // row_bytes)
    adler, stream = 1, []
    for a in range(start, stop, step):
        piece = rows_between(a, min(stop, a + step))
        adler = zlib.adler32(piece, adler)
        stream.append(deflate.compress(piece))
    stream.append(deflate.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH))
    return adler, (stop - start) * row_bytes, b"".join(stream)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def text_chunk(key: str, value: str) -> bytes:
    """tEXt where both are Latin-1, else iTXt (UTF-8, uncompressed, no language): PIL's PngInfo.add_text."""
    try:
        return _chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1"))
    except UnicodeEncodeError:
        return _chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + value.encode("utf-8"))


def png_bytes(pixels: np.ndarray | FilteredImage, text: dict[str, str] | None = None, level: int = 4,
              pool: Executor | None = None, bands: int = 1, band_bytes: int = BAND_BYTES) -> bytes:
    """A PNG file of uint8 pixels (H, W) or (H, W, C) with C of 1-4, filtered here, or of rows filtered already
    (`filtered_image`); its text chunks before the image data as PIL places them; up to `bands` pieces of at least
    `band_bytes` deflated on `pool`'s threads (zlib and numpy let go of the GIL)."""
    if not 0 <= level <= 9:
        raise ValueError(f"PNG compress level must be 0-9; got {level}")
    if isinstance(pixels, FilteredImage):
        h, w, ch = pixels.rows.shape[0], pixels.width, pixels.channels
        done_rows = pixels.rows

        def rows_between(a: int, b: int):
            return done_rows[a:b].data
    else:
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in COLOR_TYPE or 0 in pixels.shape:
            raise ValueError(f"PNG pixels must be uint8 (H, W, 1-4 channels); got {pixels.dtype} "
                             f"{tuple(pixels.shape)}")
        h, w, ch = pixels.shape
        flat = np.ascontiguousarray(pixels).reshape(h, w * ch)
        zero = np.zeros(w * ch, dtype=np.uint8)

        def rows_between(a: int, b: int):
            return filtered(flat[a:b], flat[a - 1] if a else zero, ch).data
    row_bytes = w * ch + 1
    bands = max(1, min(bands, h, (h * row_bytes) // band_bytes))
    edges = [round(i * h / bands) for i in range(bands + 1)]
    jobs = [(rows_between, row_bytes, edges[i], edges[i + 1], level, i == 0, i == bands - 1) for i in range(bands)]
    done = list(pool.map(_band, *zip(*jobs))) if pool is not None and bands > 1 else [_band(*j) for j in jobs]
    stream = b"".join(piece for _, _, piece in done)
    if bands > 1:  # the one stream's Adler-32, from each band's
        adler = 1
        for band_adler, length, _ in done:
            adler = adler32_combine(adler, band_adler, length)
        stream += struct.pack(">I", adler)
    header = struct.pack(">IIBBBBB", w, h, 8, COLOR_TYPE[ch], 0, 0, 0)
    texts = b"".join(text_chunk(k, v) for k, v in (text or {}).items())
    return SIGNATURE + _chunk(b"IHDR", header) + texts + _chunk(b"IDAT", stream) + _chunk(b"IEND", b"")
