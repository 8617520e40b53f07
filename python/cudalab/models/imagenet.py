"""cudalab.models.imagenet: ImageNet preprocessing of uint8 images in NumPy.

torchvision's evaluation transform for ResNet-50 (``Resize(256)``,
``CenterCrop(224)``, ``ToTensor()``, ``Normalize(mean, std)``), producing
float32 NHWC batches for :func:`cudalab.models.reference.forward` and the GPU
model.

One difference: the resize is plain bilinear interpolation (half-pixel
centres, as ``torch.nn.functional.interpolate(mode='bilinear',
align_corners=False)``), without the antialiasing filter that PIL and
torchvision's default apply when shrinking. For a photo shrunk by a factor
of 2 or more this keeps more aliasing (fine texture can shimmer), which can
move a logit by a few percent; enlarging, or shrinking by less than 2, gives
nearly the same pixels. As PIL does, the resized image is rounded back to
uint8 before scaling to [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._check import arg_error, check_int

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "preprocess", "resize_bilinear"]

# The statistics every torchvision ImageNet model was trained with, RGB order.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def _source_taps(out_size: int, in_size: int, start: int, count: int):
    """Rows (or columns) `start` .. `start + count` of a bilinear resize in_size -> out_size.

    Returns the two source indices and the weight of the second, per output index.
    """
    dst = np.arange(start, start + count, dtype=np.float64)
    src = (dst + 0.5) * (in_size / out_size) - 0.5
    src = np.clip(src, 0.0, in_size - 1)  # torch clamps below; the top clamp is the last row
    lo = np.floor(src).astype(np.intp)
    hi = np.minimum(lo + 1, in_size - 1)
    return lo, hi, (src - lo).astype(np.float32)


def resize_bilinear(image: np.ndarray, height: int, width: int, *, top: int = 0, left: int = 0,
                    crop: tuple[int, int] | None = None) -> np.ndarray:
    """resize_bilinear(image, height, width, *, top=0, left=0, crop=None) -> ndarray

    `image` resized to height x width, bilinear, half-pixel centres, no
    antialiasing; optionally only the crop[0] x crop[1] window at (top, left)
    of the resized image is computed.

    Parameters
    ----------
    image : ndarray
        (H, W, C), any real dtype.
    height, width : int
        The size of the resized image.
    top, left : int, optional
        The crop window's corner in the resized image.
    crop : (int, int), optional
        The crop window's size (default: the whole resized image).

    Returns
    -------
    ndarray
        float32 (crop[0], crop[1], C), not rounded.
    """
    in_h, in_w = image.shape[:2]
    rows, cols = crop if crop is not None else (height, width)
    y0, y1, wy = _source_taps(height, in_h, top, rows)
    x0, x1, wx = _source_taps(width, in_w, left, cols)
    img = image.astype(np.float32, copy=False)
    # Separable: blend rows first (on the few rows needed), then columns.
    wy = wy[:, None, None]
    tmp = img[y0] * (1 - wy) + img[y1] * wy
    wx = wx[None, :, None]
    return tmp[:, x0] * (1 - wx) + tmp[:, x1] * wx


def _one_image(image: np.ndarray, resize: int, size: int) -> np.ndarray:
    h, w = image.shape[:2]
    # torchvision: the shorter side becomes `resize`, the longer scales with it (truncated).
    if h <= w:
        new_h, new_w = resize, int(resize * w / h)
    else:
        new_h, new_w = int(resize * h / w), resize
    top = int(round((new_h - size) / 2.0))
    left = int(round((new_w - size) / 2.0))
    out = resize_bilinear(image, new_h, new_w, top=top, left=left, crop=(size, size))
    return np.clip(np.rint(out), 0, 255)


def _as_images(images: Any) -> list[np.ndarray]:
    if isinstance(images, np.ndarray):
        if images.ndim == 3:
            return [images]
        if images.ndim == 4:
            return list(images)
        raise arg_error(ValueError, "preprocess", "images",
                        f"expected (H, W, 3) or (N, H, W, 3), got shape {images.shape}")
    if isinstance(images, Sequence) and not isinstance(images, (str, bytes)) and images and \
            all(isinstance(i, np.ndarray) and i.ndim == 3 for i in images):
        return list(images)
    raise arg_error(TypeError, "preprocess", "images",
                    "expected a uint8 array (H, W, 3) or (N, H, W, 3), or a non-empty list of "
                    f"(H, W, 3) arrays, got {type(images).__name__}")


def preprocess(images: Any, size: int = 224, resize: int = 256) -> np.ndarray:
    """preprocess(images, size=224, resize=256) -> ndarray

    ImageNet evaluation preprocessing: resize the shorter side to `resize`
    (bilinear, see the module docstring), center-crop size x size, scale to
    [0, 1], normalise with :data:`IMAGENET_MEAN` and :data:`IMAGENET_STD`.

    Parameters
    ----------
    images : ndarray or list of ndarray
        uint8 RGB: one (H, W, 3) image, a (N, H, W, 3) batch, or a list of
        (H, W, 3) images of any sizes.
    size : int, optional
        The crop, <= `resize`.
    resize : int, optional
        The shorter side after resizing.

    Returns
    -------
    ndarray
        float32 (N, size, size, 3), NHWC, C-contiguous.
    """
    size = check_int(size, "preprocess", "size")
    resize = check_int(resize, "preprocess", "resize")
    if size > resize:
        raise arg_error(ValueError, "preprocess", "size",
                        f"must be <= resize ({resize}), got {size}")
    batch = _as_images(images)
    for image in batch:
        if image.dtype != np.uint8:
            raise arg_error(TypeError, "preprocess", "images",
                            f"expected uint8 pixels, got {image.dtype}")
        if image.shape[2] != 3 or min(image.shape[:2]) < 1:
            raise arg_error(ValueError, "preprocess", "images",
                            f"expected (H, W, 3) RGB images, got an image of shape {image.shape}")
    out = np.empty((len(batch), size, size, 3), dtype=np.float32)
    for i, image in enumerate(batch):
        out[i] = _one_image(image, resize, size)
    out /= np.float32(255.0)
    out -= IMAGENET_MEAN
    out /= IMAGENET_STD
    return out
