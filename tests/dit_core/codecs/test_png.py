"""dit_core/codecs/png.py against PIL, the writer of ComfyUI's Save Image: in one band the very zlib stream and text
chunks PIL writes (its filter choice, its deflate settings); in many bands on threads, the same pixels."""
import io
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from dit_core.codecs.png import filtered_image, png_bytes, to_bytes


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """A PNG's chunks (type, data), each CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, i = [], 8
    while i < len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        kind, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        assert int.from_bytes(data[i + 8 + n:i + 12 + n], "big") == zlib.crc32(kind + body)
        out.append((kind, body))
        i += 12 + n
    return out


def image_stream(data: bytes) -> bytes:
    return b"".join(body for kind, body in chunks(data) if kind == b"IDAT")


def pil_png(pixels: np.ndarray, text: dict, level: int = 4) -> bytes:
    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    buf = io.BytesIO()
    Image.fromarray(pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels).save(buf, format="PNG", pnginfo=info,
                                                                                     compress_level=level)
    return buf.getvalue()


def picture(h: int, w: int, channels: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients with grain and a flat band (rows where None or Up wins), like a decoded image."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack([np.sin(5 * x + 3 * y + c) for c in range(channels)], -1) * 0.4 + 0.5
    base = base + rng.normal(0, 0.03, base.shape)
    base[h // 3:h // 3 + 2] = 0.25
    return np.clip(base * 255, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("shape", [(64, 48, 3), (37, 23, 3), (33, 17, 4), (29, 31, 1), (1, 5, 3), (6, 1, 3)])
@pytest.mark.parametrize("level", [4, 1, 9])
def test_one_band_is_pils_stream(shape, level):
    pixels = picture(*shape)
    text = {"prompt": '{"3": {"inputs": {"seed": 1}}}', "workflow": "caf\u00e9 \u2603 snow"}  # tEXt, then iTXt
    ours, pil = png_bytes(pixels, text, level), pil_png(pixels, text, level)
    assert image_stream(ours) == image_stream(pil)
    assert [c for c in chunks(ours) if c[0] != b"IDAT"] == [c for c in chunks(pil) if c[0] != b"IDAT"]


@pytest.mark.parametrize("shape", [(97, 61, 3), (130, 40, 4), (50, 300, 1)])
@pytest.mark.parametrize("bands", [2, 3, 7])
def test_bands_on_threads_give_the_same_pixels(shape, bands):
    pixels = picture(*shape, seed=bands)
    with ThreadPoolExecutor(4) as pool:
        data = png_bytes(pixels, {"prompt": "{}"}, pool=pool, bands=bands, band_bytes=1024)
    assert [kind for kind, _ in chunks(data)] == [b"IHDR", b"tEXt", b"IDAT", b"IEND"]
    back = np.asarray(Image.open(io.BytesIO(data)))
    assert np.array_equal(back, pixels.squeeze(-1) if shape[-1] == 1 else pixels)
    zlib.decompress(image_stream(data))  # one zlib stream: its Adler-32 checks
    one_band = len(image_stream(png_bytes(pixels, {}, bands=1)))
    assert len(image_stream(data)) < 1.1 * one_band + 64  # each band primed with the bytes before it


@pytest.mark.parametrize("shape", [(97, 61, 3), (33, 17, 4), (29, 31, 1), (1, 5, 3)])
@pytest.mark.parametrize("bands", [1, 3])
def test_rows_filtered_in_torch_give_the_same_file(shape, bands):
    """filtered_image (the filters in torch, where a card has the IMAGE; here on the CPU, in row blocks smaller than
    the image) then the bands' deflate: the very file of the pixels filtered by numpy."""
    pixels = picture(*shape, seed=bands)
    pixels[5:9, :, 0] = 255 - pixels[5:9, :, 0]  # edges the Paeth predictor and Sub win on
    pixels[-1] = 0  # a row None wins
    image = torch.from_numpy(pixels).float() / 255.0 + 0.5 / 255  # 255 x truncates back to the pixels
    rows = filtered_image(image, "cpu", block_bytes=shape[1] * shape[2] * 4)
    assert rows.rows.shape == (shape[0], shape[1] * shape[2] + 1)
    with ThreadPoolExecutor(3) as pool:
        ours = png_bytes(rows, {"prompt": "{}"}, pool=pool, bands=bands, band_bytes=64)
        reference = png_bytes(pixels, {"prompt": "{}"}, pool=pool, bands=bands, band_bytes=64)
    assert ours == reference


def test_pixels_as_save_image_makes_them():
    """255 x, clipped to [0, 255], truncated (ComfyUI's SaveImage: np.clip(255. * i, 0, 255).astype(np.uint8))."""
    image = torch.cat([torch.rand(8, 8, 3) * 1.4 - 0.2, torch.tensor([[[0.999, 1.0, 255.5 / 255]]]).expand(1, 8, 3)])
    image[0, 0, 0] = float("inf")
    image[0, 1, 0] = -float("inf")
    stock = np.clip(255. * image.numpy(), 0, 255).astype(np.uint8)
    assert np.array_equal(to_bytes(image), stock)
    image[0, 2, 0] = float("nan")
    assert to_bytes(image)[0, 2, 0] == 0


@pytest.mark.parametrize("pixels, level, message", [
    (np.zeros((4, 4, 3), np.float32), 4, "uint8"),
    (np.zeros((4, 4, 5), np.uint8), 4, "1-4 channels"),
    (np.zeros((0, 4, 3), np.uint8), 4, "uint8"),
    (np.zeros((4, 4, 3), np.uint8), 10, "level must be 0-9"),
])
def test_bad_input_is_refused(pixels, level, message):
    with pytest.raises(ValueError, match=message):
        png_bytes(pixels, level=level)


def test_the_save_bench_runs(capsys):
    """bench/bench_save_image.py at a small size: both savers, the same pixels (it asserts), a row a picture."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "bench" / "bench_save_image.py"
    spec = importlib.util.spec_from_file_location("bench_save_image", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--size", "48", "--runs", "1"])
    out = capsys.readouterr().out
    assert "| decoded-like |" in out and "| noise |" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rows_filtered_on_the_card_are_the_hosts():
    """The filters on a card give the CPU's bytes (a 1024x1024 IMAGE as a decoder hands it over)."""
    image = torch.rand(1024, 1024, 3)
    image[100:110] = 0.5
    assert png_bytes(filtered_image(image, "cuda"), bands=4) == png_bytes(to_bytes(image), bands=4)
