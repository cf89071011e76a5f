"""PNG files of the report's figures from matplotlib's 8-bit RGBA pixels, written by Pillow (matplotlib's own PNG
writer): truecolour without the alpha channel where every pixel is opaque (a quarter less to compress), at a given
zlib level, with the resolution and the text metadata (Latin-1 text as tEXt, other text as iTXt: Pillow's choice).

Why not savefig(format="png"): it hands Pillow the RGBA pixels at zlib level 6; the figures are opaque, and RGB at
level 1 encodes in about half the time, for files about as large as matplotlib's own.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo


def encode(rgba: np.ndarray, dpi: float, metadata: Mapping[str, str], level: int) -> bytes:
    """The PNG of an (height, width, 4) uint8 image at `dpi`, compressed at zlib `level`; `metadata` as text."""
    height, width, _ = rgba.shape
    image = Image.frombuffer("RGBA", (width, height), np.ascontiguousarray(rgba), "raw", "RGBA", 0, 1)
    if image.getextrema()[3] == (255, 255):  # opaque: the alpha channel dropped
        image = image.convert("RGB")
    info = PngInfo()
    for keyword, value in metadata.items():
        info.add_text(keyword, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=level, pnginfo=info, dpi=(dpi, dpi))
    return buffer.getvalue()
