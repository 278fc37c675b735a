"""Every named look keeps the picture recognisable: the shapes of the input (its edges,
compared by SSIM) still show in the styled output."""

from __future__ import annotations

import cv2
import matplotlib.cbook
import numpy as np
import pytest
from PIL import Image

from genhook.engines.image_edit._style import Stylizer
from genhook.engines.style_names import STYLE_NAMES

# Every look but mosaic keeps 0.19 or more of this measure on the portrait below; mosaic
# alone kept 0.07 (nothing of the face) before it kept part of the picture's brightness.
MIN_EDGE_SSIM = 0.15


def edges(image: Image.Image) -> np.ndarray:
    gray = cv2.GaussianBlur(
        cv2.cvtColor(np.asarray(image), cv2.COLOR_RGB2GRAY).astype(np.float32), (0, 0), 2
    )
    return np.asarray(
        cv2.magnitude(cv2.Sobel(gray, cv2.CV_32F, 1, 0), cv2.Sobel(gray, cv2.CV_32F, 0, 1))
    )


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    c1, c2 = (0.01 * a.max()) ** 2, (0.03 * a.max()) ** 2

    def blur(x: np.ndarray) -> np.ndarray:
        return np.asarray(cv2.GaussianBlur(x, (0, 0), 1.5))

    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b = blur(a * a) - mu_a**2, blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    return float(
        (
            ((2 * mu_a * mu_b + c1) * (2 * cov + c2))
            / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
        ).mean()
    )


@pytest.fixture(scope="module")
def portrait() -> Image.Image:
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        image = Image.open(f).convert("RGB")
    return image.resize((160, 200), Image.Resampling.LANCZOS)


@pytest.fixture(scope="module")
def stylizer() -> Stylizer:
    return Stylizer(1)


@pytest.mark.parametrize("style", STYLE_NAMES)
def test_every_named_look_keeps_the_picture(
    portrait: Image.Image, stylizer: Stylizer, style: str
) -> None:
    styled = stylizer.named(portrait, style)
    assert styled.size == portrait.size
    assert ssim(edges(portrait), edges(styled)) >= MIN_EDGE_SSIM, style


def test_mosaic_still_looks_like_a_mosaic(portrait: Image.Image, stylizer: Stylizer) -> None:
    # The look is kept: its colours, not the photo's, dominate the output.
    styled = np.asarray(stylizer.named(portrait, "mosaic"), dtype=np.float32)
    source = np.asarray(portrait, dtype=np.float32)
    assert np.abs(styled - source).mean() > 30
