"""An image with more pixels than `CNCLIP_MAX_IMAGE_PIXELS` is "too large" (422 `image_too_large`, with
the limit), not "cannot read" (`invalid_image`): the web UI said 无法识别 for an 81 Mpx upload."""

from __future__ import annotations

import io

from PIL import Image

from api.config import Settings
from tests.support.api_helpers import api_client


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, "PNG")  # bilevel zeros: 81 Mpx in a few KB
    return buffer.getvalue()


def test_an_81_megapixel_upload_is_image_too_large_with_the_limit(settings: Settings) -> None:
    limit = settings.max_image_pixels
    assert limit < 9000 * 9000  # the 81 Mpx is over the default
    with api_client(settings) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        big = png(9000, 9000)
        for path, field in (("/v1/collections/photos/items", "file"), ("/v1/search/image", "file")):
            response = client.post(path, files={field: ("big.png", big, "image/png")}, data={"collection": "photos"})
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["code"] == "image_too_large"
            assert f"the limit is {limit:,} pixels" in error["message"]
        unreadable = client.post("/v1/collections/photos/items", files={"file": ("x.png", b"not a png", "image/png")})
        assert unreadable.json()["error"]["code"] == "invalid_image"  # what "cannot read" still means
