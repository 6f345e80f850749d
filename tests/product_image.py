"""The product image for the tests: elasticgpu/testbed/product_image.py (the demo imports it into its box
too, and the product never imports tests/), re-exported under its old import path."""

from __future__ import annotations

from elasticgpu.testbed.product_image import (
    BUILD_SCRIPT,
    BUILD_TIMEOUT_S,
    IMPORT_TIMEOUT_S,
    REPO_ROOT,
    UNAVAILABLE_ENV,
    ImageUnavailable,
    ProductImage,
    cache_dir,
    find_image,
    import_image,
    this_checkouts_image,
)

__all__ = [
    "BUILD_SCRIPT", "BUILD_TIMEOUT_S", "IMPORT_TIMEOUT_S", "REPO_ROOT", "UNAVAILABLE_ENV", "ImageUnavailable",
    "ProductImage", "cache_dir", "find_image", "import_image", "this_checkouts_image",
]  # fmt: skip
