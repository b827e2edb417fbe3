"""Photos as phones and cameras make them (issue 31, items 1 and 2): HEIC/HEIF, AVIF and camera RAW
through the one decoder (retrieval/preprocess.py), the indexer, the API and the thumbnails."""

from __future__ import annotations

import asyncio
import importlib.metadata
import io
import json
import platform
import resource
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from indexer.bulk.pipeline import ImageIndexer
from indexer.bulk.raw_companions import raw_companions
from indexer.bulk.sources import SourceEntry, looks_like_image
from indexer.storage.catalog import SqlCatalog
from retrieval import raw_photos
from retrieval.errors import ImageTooLarge, InvalidImage
from retrieval.fake import FakeEncoder
from retrieval.preprocess import decode_image, preprocess_image, read_header
from tests.support.api_helpers import api_client
from tests.support.decode_load import v2_bytes_request
from tests.support.indexer_helpers import jpeg, service_for
from tests.support.photo_fixtures import (
    avif_bytes,
    burst_heic,
    dng_bytes,
    exif_bytes,
    heic_bytes,
    picture,
    with_brand,
    with_declared_size,
)

BRIGHT = 235  # the picture's bright block (top-left before orientation) is above this in every channel


def bright_corner(image: Image.Image) -> str:
    """Which corner holds the picture's bright block: shows how the image was oriented."""
    rgb = np.asarray(image.convert("RGB"), dtype=np.int32)
    h, w = rgb.shape[:2]
    corners = {"top-left": rgb[2, 2], "top-right": rgb[2, w - 3], "bottom-left": rgb[h - 3, 2]}
    corners["bottom-right"] = rgb[h - 3, w - 3]
    return next(name for name, px in corners.items() if min(px) > BRIGHT)


# --- the installed wheels -------------------------------------------------------------------------------


def test_photo_decoders_keep_numpy_1_and_the_cann_build_of_onnxruntime() -> None:
    import onnxruntime
    import pillow_heif
    import rawpy

    assert np.__version__.startswith("1."), f"numpy {np.__version__}: onnxruntime-cann is built against numpy 1.x"
    providers = sorted(
        dist.metadata["Name"].lower()
        for dist in importlib.metadata.distributions()
        if "onnxruntime" in (dist.read_text("top_level.txt") or "").split()
        or any(str(f).startswith("onnxruntime/") for f in (dist.files or [])[:2000])
    )
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        assert providers == ["onnxruntime-cann"], providers  # a plain `onnxruntime` wheel would replace it
    assert "CPUExecutionProvider" in onnxruntime.get_available_providers()
    assert pillow_heif.__version__ and rawpy.__version__
    from PIL import features

    assert features.check("avif"), "Pillow reads AVIF itself"


# --- the decoder ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [heic_bytes, avif_bytes], ids=["heic", "avif"])
def test_heic_and_avif_read_date_offset_and_orientation_as_jpeg(make: object) -> None:
    data = make(picture(300, 200), exif_bytes(6, "2023:07:14 18:30:05", "+08:00"))  # type: ignore[operator]
    header = read_header(data)
    assert (header.width, header.height) == (200, 300)  # displayed: turned a quarter
    assert (header.date_original, header.offset_original) == ("2023:07:14 18:30:05", "+08:00")
    assert header.mime == ("image/heif" if make is heic_bytes else "image/avif")
    image = decode_image(data)
    assert image.size == (200, 300) and bright_corner(image) == "top-right"  # orientation 6: 90° clockwise
    assert preprocess_image(data).shape == (3, 224, 224)


def test_a_burst_heic_gives_its_primary_image_not_the_first() -> None:
    data = burst_heic(primary=picture(300, 200), other=Image.new("RGB", (120, 80), (0, 0, 255)))
    assert (read_header(data).width, read_header(data).height) == (300, 200)
    image = decode_image(data)
    assert image.size == (300, 200) and bright_corner(image) == "top-left"


def test_a_dng_uses_its_large_preview_and_demosaics_when_there_is_none() -> None:
    with_preview = dng_bytes(preview=picture(1200, 900), orientation=6, date="2021:05:06 07:08:09", offset="+09:00")
    header = read_header(with_preview)
    assert header.mime == "image/x-adobe-dng" and (header.width, header.height) == (48, 64)  # the sensor, turned
    assert (header.date_original, header.offset_original) == ("2021:05:06 07:08:09", "+09:00")
    assert raw_photos.decode_raw(with_preview, 10**8, 65_535).source == "preview"
    image = decode_image(with_preview)
    assert image.size == (900, 1200) and bright_corner(image) == "top-right"  # LibRaw's flip 6 applied

    bare = dng_bytes(orientation=3, date="2020:01:01 00:00:00")
    assert raw_photos.decode_raw(bare, 10**8, 65_535).source == "demosaic"
    assert decode_image(bare).size == (32, 24)  # half of 64×48
    # A preview smaller than what the half-size demosaic gives is not used.
    small = dng_bytes(width=640, height=480, preview=picture(160, 120))
    assert raw_photos.decode_raw(small, 10**8, 65_535).source == "demosaic"


def test_a_scanners_tiff_is_not_taken_for_a_raw() -> None:
    buffer = io.BytesIO()
    picture(40, 30).save(buffer, "TIFF")
    data = buffer.getvalue()
    assert raw_photos.raw_kind(data) is None and read_header(data).mime == "image/tiff"
    # A TIFF whose tags look like a camera's (Make, a reduced-resolution first image) that LibRaw cannot
    # open is still read as the TIFF it is.
    buffer = io.BytesIO()
    picture(40, 30).save(buffer, "TIFF", tiffinfo={271: "NIKON CORPORATION", 254: 1})
    camera_like = buffer.getvalue()
    assert raw_photos.raw_kind(camera_like) == "NEF"
    assert read_header(camera_like).mime == "image/tiff" and decode_image(camera_like).size == (40, 30)


def _heic() -> bytes:
    return heic_bytes(picture(300, 200))  # (a 64×48 HEIC carries a clean aperture: its `ispe` is not its size)


def _avif() -> bytes:
    return avif_bytes(picture(300, 200))


HOSTILE = {
    "heic truncated": lambda: _heic()[: len(_heic()) // 2],
    "heic header only": lambda: _heic()[:40],
    "avif truncated": lambda: _avif()[: len(_avif()) // 2],
    "heic zero size": lambda: with_declared_size(_heic(), 0, 0),
    "avif zero size": lambda: with_declared_size(_avif(), 0, 0),
    "heic wrong brand": lambda: with_brand(_heic(), b"avif"),
    "avif wrong brand": lambda: with_brand(_avif(), b"heic"),
    "heic unknown brand": lambda: with_brand(_heic(), b"qwer"),
    "heic size lie": lambda: with_declared_size(_heic(), 1000, 1000),
    "dng garbage": lambda: b"II*\x00\x08\x00\x00\x00" + b"\xff" * 500,
    "dng no raw data": lambda: dng_bytes()[:3000],
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_photos_are_refused_clearly(name: str) -> None:
    data = HOSTILE[name]()
    with pytest.raises(InvalidImage) as refused:
        decode_image(data)
    assert refused.value.message
    with pytest.raises(InvalidImage):  # what a route does: the header, then the model's preprocessing
        read_header(data)
        preprocess_image(data)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("heic 60000²", lambda: with_declared_size(_heic(), 60_000, 60_000)),
        ("heic 10000²", lambda: with_declared_size(_heic(), 10_000, 10_000)),
        ("dng 20000²", lambda: dng_bytes(declared=(20_000, 20_000))),
    ],
)
def test_a_huge_declared_size_is_refused_before_any_pixel_is_decoded(name: str, data: object) -> None:
    raw = data()  # type: ignore[operator]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for call in (read_header, decode_image):
        with pytest.raises(ImageTooLarge, match="pixels"):
            call(raw)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB: nothing near 100 Mpx


def test_photo_signatures_and_names_claim_to_be_images() -> None:
    assert looks_like_image(Path("x.bin"), _heic()[:16]) and looks_like_image(Path("x.bin"), _avif()[:16])
    for suffix in (".heic", ".HEIF", ".hif", ".avif", ".dng", ".CR3", ".nef", ".arw", ".raf", ".orf", ".rw2", ".cr2"):
        assert looks_like_image(Path(f"x{suffix}"), b"")


# --- the indexer ----------------------------------------------------------------------------------------


class DecodingEncoder(FakeEncoder):
    """The fake encoder, after the real preprocessing (what the model would be given)."""

    async def embed_images(self, images: Sequence[bytes]) -> np.ndarray:
        for data in images:
            preprocess_image(data)
        return await super().embed_images(images)


def test_a_folder_of_phone_and_camera_photos_indexes_with_exact_counts(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    (folder / "camera").mkdir(parents=True)
    (folder / "phone.heic").write_bytes(heic_bytes(picture(300, 200), exif_bytes(6, "2023:07:14 18:30:05", "+08:00")))
    (folder / "android.avif").write_bytes(avif_bytes(picture(200, 150, 1), exif_bytes(1, "2022:02:03 04:05:06")))
    (folder / "alone.dng").write_bytes(dng_bytes(preview=picture(1200, 900, 2), date="2021:05:06 07:08:09"))
    (folder / "plain.jpg").write_bytes(jpeg(7))
    # RAW+JPEG of one shot: the JPEG is the item, the RAW its companion (case ignored).
    (folder / "camera" / "IMG_0042.CR3").write_bytes(b"\x00\x00\x00\x18ftypcrx " + b"\x00" * 64)
    (folder / "camera" / "IMG_0042.JPG").write_bytes(jpeg(8))
    (folder / "camera" / "IMG_0043.dng").write_bytes(dng_bytes(preview=picture(1200, 900, 3)))
    (folder / "camera" / "img_0043.jpeg").write_bytes(jpeg(9))
    (folder / "burst.heic").write_bytes(burst_heic(picture(300, 200, 4), Image.new("RGB", (64, 48))))
    (folder / "broken.heic").write_bytes(_heic()[:60])  # starts like a HEIC: a counted bad file
    (folder / "lying.avif").write_bytes(with_declared_size(_avif(), 0, 0))
    (folder / "fake.dng").write_bytes(b"II*\x00\x08\x00\x00\x00" + b"\xff" * 200)
    encoder = DecodingEncoder(dim=16)
    indexer = ImageIndexer(service_for(catalog, encoder), "photos", batch_size=4, read_threads=2)
    summary = asyncio.run(indexer.run(folder))
    failed = sorted(Path(path).name for path, _ in summary.failures)
    assert failed == ["broken.heic", "fake.dng", "lying.avif"], summary.failures
    assert (summary.added, summary.raw_companions, summary.not_images) == (7, 2, 0)
    states = catalog.file_states("photos")
    assert sorted(Path(p).name for p in states) == sorted(
        ["phone.heic", "android.avif", "alone.dng", "plain.jpg", "IMG_0042.JPG", "img_0043.jpeg", "burst.heic"]
    )
    items = {Path(catalog.get(s.id).path or "").name: catalog.get(s.id) for s in states.values()}
    phone = items["phone.heic"]
    assert (phone.mime, phone.width, phone.height) == ("image/heif", 200, 300)
    assert phone.taken_at == datetime(2023, 7, 14, 10, 30, 5, tzinfo=UTC) and phone.taken_source == "exif"
    assert items["alone.dng"].mime == "image/x-adobe-dng" and items["alone.dng"].taken_source == "exif"
    assert items["android.avif"].mime == "image/avif" and items["android.avif"].taken_source == "exif"
    again = asyncio.run(ImageIndexer(service_for(catalog, encoder), "photos", batch_size=4).run(folder))
    assert (again.added, again.unchanged, again.raw_companions) == (0, 7, 2)


def test_a_raw_companion_is_decided_on_disk_as_a_watcher_pass_sees_it(tmp_path: Path) -> None:
    (tmp_path / "IMG_7.JPG").write_bytes(jpeg(1))
    (tmp_path / "img_7.nef").write_bytes(b"raw")
    (tmp_path / "IMG_8.ARW").write_bytes(b"raw")  # alone
    (tmp_path / "IMG_9.dng").write_bytes(b"raw")
    (tmp_path / "IMG_9.dng.jpg").write_bytes(jpeg(2))  # another stem: not its companion
    one = [SourceEntry(tmp_path / "img_7.nef", root=tmp_path)]  # a watcher's pass over the one new file
    assert raw_companions(one) == {tmp_path / "img_7.nef"}
    listed = [SourceEntry(tmp_path / "img_7.nef", listed=True)]  # a manifest asked for it
    assert raw_companions(listed) == set()
    alone = [SourceEntry(tmp_path / name, root=tmp_path) for name in ("IMG_8.ARW", "IMG_9.dng", "IMG_7.JPG")]
    assert raw_companions(alone) == set()


# --- the API --------------------------------------------------------------------------------------------


def test_heic_uploads_searches_thumbnails_and_renditions_answer_200(settings: object) -> None:
    heic = heic_bytes(picture(300, 200), exif_bytes(6, "2023:07:14 18:30:05", "+08:00"))
    with api_client(settings, encoder=DecodingEncoder(dim=32)) as client:  # type: ignore[arg-type]
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        added = client.post("/v1/collections/photos/items", files={"file": ("IMG_1.HEIC", heic, "image/heic")})
        assert added.status_code == 201, added.text
        item_id = added.json()["id"]
        item = client.get(f"/v1/items/{item_id}").json()
        assert (item["mime"], item["width"], item["height"]) == ("image/heif", 200, 300)
        dng = dng_bytes(preview=picture(1200, 900, 5))
        raw_added = client.post("/v1/collections/photos/items", files={"file": ("x.dng", dng, "image/x-adobe-dng")})
        assert raw_added.status_code == 201, raw_added.text
        for data, name in ((heic, "q.heic"), (avif_bytes(), "q.avif"), (dng, "q.dng")):
            found = client.post("/v1/search/image", files={"file": (name, data, "application/octet-stream")})
            assert found.status_code == 200, found.text
        embedded = client.post(
            "/v1/embed/image", files=[("file", ("a.heic", heic, "image/heic")), ("file", ("b.dng", dng, ""))]
        )
        assert embedded.status_code == 200 and len(embedded.json()["vectors"]) == 2, embedded.text
        body, headers = v2_bytes_request([heic, avif_bytes(), dng])
        v2 = client.post("/v2/models/cnclip_image_bytes/infer", content=body, headers=headers)
        assert v2.status_code == 200 and v2.json()["outputs"][0]["shape"][0] == 3, v2.text
        body, headers = v2_bytes_request([HOSTILE["heic truncated"]()])
        v2 = client.post("/v2/models/cnclip_image_bytes/infer", content=body, headers=headers)
        assert 400 <= v2.status_code < 500, v2.text
        classified = client.post(
            "/v1/classify", files={"file": ("x.heic", heic, "image/heic")}, data={"labels": json.dumps(["猫", "狗"])}
        )
        assert classified.status_code == 200, classified.text
        thumb = client.get(f"/v1/items/{item_id}/thumbnail")
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
        assert Image.open(io.BytesIO(thumb.content)).format == "JPEG"
        original = client.get(f"/v1/items/{item_id}/image")
        assert original.headers["content-type"] == "image/heif" and original.content == heic  # downloadable as is
        shown = client.get(f"/v1/items/{item_id}/image", params={"format": "jpeg"})
        assert shown.status_code == 200 and shown.headers["content-type"] == "image/jpeg"
        rendition = Image.open(io.BytesIO(shown.content))
        assert rendition.format == "JPEG" and rendition.size == (200, 300) and bright_corner(rendition) == "top-right"
        assert shown.headers["etag"] != original.headers["etag"]
        assert client.get(f"/v1/items/{item_id}/image", params={"format": "heic"}).status_code == 422
        for name in ("heic truncated", "heic zero size", "heic wrong brand", "dng garbage"):
            refused = client.post("/v1/search/image", files={"file": ("bad.heic", HOSTILE[name](), "image/heic")})
            assert refused.status_code == 422, (name, refused.status_code, refused.text)
        huge = with_declared_size(_heic(), 60_000, 60_000)
        refused = client.post("/v1/collections/photos/items", files={"file": ("huge.heic", huge, "image/heic")})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "image_too_large", refused.text
