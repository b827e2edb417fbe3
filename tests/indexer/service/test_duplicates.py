"""Near-duplicate groups through the collection service (indexer/service/duplicates.py), on SQLite and
PostgreSQL: each tier on made images embedded by the shipped demo model (a re-encode and a resize of
one picture; another shot of one scene and a crop of it), no chains, paging, a partial answer that the
next call completes, deletions, group size, and what is refused."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from api.config import Settings
from demo import dataset
from demo.duplicate_threshold import OTHER_SHOT_SEED, crop, encoded, photo_like
from indexer.domain import near_vectors
from indexer.domain.duplicates import DuplicatesPage
from indexer.domain.records import NewImage, NewText
from indexer.service.collections import CollectionService
from indexer.service.duplicates import MAX_GROUP_SIZE, DuplicateFinder
from indexer.storage.catalog import SqlCatalog
from retrieval.config import SHIPPED_MODEL_DIR
from retrieval.encoder import create_encoder
from retrieval.errors import InvalidInput, NotFound
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, service_for, unit

SCENE = 4  # a demo gallery scene whose other shot and crop sit well above 0.88 (0.965 / 0.966) on int8 and fp32
OTHER_SCENES = (13, 22, 27, 33)  # different scenes: below 0.76 with every picture here


@dataclass(frozen=True)
class Made:
    model_id: str
    images: dict[str, tuple[bytes, np.ndarray]]  # name -> (bytes, demo-model vector)


@pytest.fixture(scope="module")
def made() -> Made:
    """The made pictures, embedded by the shipped demo model (the CPU default precision, as served)."""
    picture = photo_like(0)
    gallery = dataset.demo_gallery(40)
    scene = gallery[SCENE]
    images = {
        "photo": encoded(picture, quality=95),
        "photo_q40": encoded(picture, quality=40),
        "photo_half": encoded(picture.resize((picture.width // 2, picture.height // 2)), quality=85),
        "shot": encoded(scene.image(), "PNG"),
        "other_shot": encoded(dataset.render(scene.attributes, seed=scene.index + OTHER_SHOT_SEED), "PNG"),
        "crop": encoded(crop(scene.image(), 0.1), "PNG"),
        **{f"scene{i}": encoded(gallery[i].image(), "PNG") for i in OTHER_SCENES},
    }
    settings = Settings(_env_file=None, model_dir=SHIPPED_MODEL_DIR, provider="cpu", data_dir=Path("/nonexistent"))
    encoder = create_encoder(settings)

    async def embed() -> np.ndarray:
        await encoder.start()
        try:
            return await encoder.embed_images(list(images.values()))
        finally:
            await encoder.close()

    vectors = asyncio.run(embed())
    return Made(encoder.model_id, {name: (data, vectors[i]) for i, (name, data) in enumerate(images.items())})


class Model:
    def __init__(self, model_id: str, dim: int) -> None:
        self.model_id, self.dim = model_id, dim


def ids_by_name(service: CollectionService, name: str, images: dict[str, tuple[bytes, np.ndarray]]) -> dict[str, int]:
    names = list(images)
    results = service.writes.add_images(
        name, [NewImage(data=images[n][0]) for n in names], np.stack([images[n][1] for n in names])
    )
    return {n: r.id for n, r in zip(names, results, strict=True)}


def groups_of(page: DuplicatesPage, tier: str) -> list[list[int]]:
    return [[m.item.id for m in g.members] for g in page.groups if g.tier == tier]


def test_each_tier_on_made_pictures(catalog: SqlCatalog, made: Made) -> None:
    images = made.images
    service = service_for(catalog, Model(made.model_id, 128))
    service.create("photos", "images")
    ids = ids_by_name(service, "photos", images)
    page = service.duplicates.page("photos", budget_s=None)
    assert page.complete and page.unhashed == 0
    assert (page.threshold, page.threshold_source) == (0.88, "measured")
    assert page.counts == {"identical": 0, "resized": 1, "similar": 1}

    [resized] = [g for g in page.groups if g.tier == "resized"]
    assert [m.item.id for m in resized.members][0] == ids["photo"]  # the most pixels, then the most bytes
    assert {m.item.id for m in resized.members} == {ids["photo"], ids["photo_q40"], ids["photo_half"]}
    assert all(m.hamming is not None and m.hamming <= page.hamming_threshold for m in resized.members)
    assert all(m.score >= 0.88 for m in resized.members) and resized.members[0].keeper

    [similar] = [g for g in page.groups if g.tier == "similar"]
    members = {m.item.id: m for m in similar.members}
    assert set(members) == {ids["shot"], ids["other_shot"], ids["crop"]}
    keeper = similar.members[0]
    assert keeper.keeper and keeper.item.id in (ids["shot"], ids["other_shot"])  # 224×224 beats the crop
    assert keeper.item.size == max(members[ids["shot"]].item.size or 0, members[ids["other_shot"]].item.size or 0)
    for member in similar.members[1:]:
        expected = float(np.dot(images_vector(images, ids, keeper.item.id), images_vector(images, ids, member.item.id)))
        assert member.score == pytest.approx(expected, abs=1e-4) and member.score >= 0.88
        assert not member.keeper and member.hamming is not None and member.hamming > page.hamming_threshold
    grouped = {m.item.id for g in page.groups for m in g.members}
    assert not grouped & {ids[f"scene{i}"] for i in OTHER_SCENES}  # different scenes stay alone

    # Tiers one at a time give the same groups.
    assert groups_of(service.duplicates.page("photos", "resized", budget_s=None), "resized") == groups_of(
        page, "resized"
    )
    only_similar = service.duplicates.page("photos", "similar", budget_s=None)
    assert [g.tier for g in only_similar.groups] == ["similar"] and only_similar.total == 1


def images_vector(images: dict[str, tuple[bytes, np.ndarray]], ids: dict[str, int], item_id: int) -> np.ndarray:
    name = next(n for n, i in ids.items() if i == item_id)
    vector = images[name][1]
    return vector / np.linalg.norm(vector)


def with_cosines(base: np.ndarray, rng: np.random.Generator, cosines: list[float]) -> list[np.ndarray]:
    """Unit vectors at the given cosines from `base` (each in its own random direction)."""
    out = []
    for c in cosines:
        noise = rng.standard_normal(base.shape)
        noise -= np.dot(noise, base) * base
        noise /= np.linalg.norm(noise)
        out.append((c * base + np.sqrt(1 - c * c) * noise).astype(np.float32))
    return out


def fake_service(catalog: SqlCatalog) -> CollectionService:
    service = service_for(catalog, FakeEncoder())  # model "fake": 0.95, not measured
    service.create("photos", "images")
    return service


def add(
    service: CollectionService, vectors: list[np.ndarray], first_seed: int, hashes: list[int] | None = None
) -> list[int]:
    images = [NewImage(data=jpeg(first_seed + i), phash=hashes[i] if hashes else None) for i in range(len(vectors))]
    return [r.id for r in service.writes.add_images("photos", images, np.stack(vectors))]


def test_a_chain_is_never_one_group(catalog: SqlCatalog) -> None:
    """A~B and B~C above the threshold, A≁C below it: A and C are never in one group (similar shots),
    and the same for perceptual hashes (resized: A-B 4 bits, B-C 4 bits, A-C 8 bits)."""
    service = fake_service(catalog)
    rng = np.random.default_rng(1)
    b = unit(rng.standard_normal((1, 32)))[0]
    # A and C at 0.975 from B on opposite sides: cos(A, C) = 2·0.975² − 1 ≈ 0.90 < 0.95.
    a, c = with_cosines(b, rng, [0.975])[0], None
    c = (2 * 0.975 * b - a).astype(np.float32)
    c /= np.linalg.norm(c)
    assert float(a @ c) < 0.95 <= min(float(a @ b), float(b @ c))
    ids = add(service, [a, b, c], 100)
    page = service.duplicates.page("photos", budget_s=None)
    for group in groups_of(page, "similar"):
        assert not {ids[0], ids[2]} <= set(group)
    assert any(ids[1] in g for g in groups_of(page, "similar"))  # B is grouped with one of them

    near = unit(rng.standard_normal((1, 32)))[0]
    h = 0x0123_4567_89AB_CDEF
    hashes = [h, h ^ 0xF, h ^ 0xFF]  # 4 bits, 4 bits; A-C 8 bits
    pictures = [near, *with_cosines(near, rng, [0.99, 0.99])]
    hashed = add(service, pictures, 200, hashes)
    resized = groups_of(service.duplicates.page("photos", "resized", budget_s=None), "resized")
    assert resized and all(not {hashed[0], hashed[2]} <= set(g) for g in resized)


def test_pages_cover_every_group_once_in_a_stable_order(catalog: SqlCatalog) -> None:
    service = fake_service(catalog)
    rng = np.random.default_rng(2)
    vectors: list[np.ndarray] = []
    for size in [2] * 20 + [3] * 4 + [4]:  # 25 groups
        base = unit(rng.standard_normal((1, 32)))[0]
        vectors += [base, *with_cosines(base, rng, [0.99] * (size - 1))]
    vectors += list(unit(rng.standard_normal((30, 32))))  # loners
    add(service, vectors, 1000)
    seen: list[list[int]] = []
    offset = 0
    while True:
        page = service.duplicates.page("photos", "similar", offset, 10, budget_s=None)
        assert page.total == 25 and len(page.groups) == min(10, 25 - offset)
        seen += groups_of(page, "similar")
        if not page.has_more:
            break
        offset += 10
    assert offset == 20 and len(seen) == 25
    assert [len(g) for g in seen] == [4] + [3] * 4 + [2] * 20  # largest first
    keys = [min(g) for g in seen[5:]]
    assert keys == sorted(keys)  # then by smallest id
    assert len({i for g in seen for i in g}) == sum(len(g) for g in seen)  # nobody twice
    assert service.duplicates.page("photos", "similar", 25, 10, budget_s=None).groups == []  # past the end: empty
    assert groups_of(service.duplicates.page("photos", "similar", 0, 10, budget_s=None), "similar") == seen[:10]


def test_a_partial_answer_is_marked_and_the_next_call_goes_on(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(near_vectors, "QUERY_CHUNK", 100)
    monkeypatch.setattr(near_vectors, "EXACT_UP_TO", 200)  # the IVF index, as on large collections
    service = fake_service(catalog)
    rng = np.random.default_rng(3)
    vectors = list(unit(rng.standard_normal((500, 32))))
    for i in range(0, 60, 2):
        vectors[i + 1] = with_cosines(vectors[i], rng, [0.99])[0]
    add(service, vectors, 5000)
    page = service.duplicates.page("photos", "similar", budget_s=1e-6)  # one chunk of queries per call
    assert not page.complete and page.examined == 100 and page.searchable == 500
    calls = 1
    while not page.complete:
        page = service.duplicates.page("photos", "similar", 0, 100, budget_s=1e-6)
        calls += 1
    assert calls == 5 and page.examined == 500
    fresh = DuplicateFinder(catalog, catalog.duplicates).find(catalog.collection("photos"), "similar", 0, 100)
    assert groups_of(page, "similar") == groups_of(fresh, "similar")
    assert len(groups_of(page, "similar")) == 30


def test_deletions_reuse_the_answer_and_additions_compute_it_again(catalog: SqlCatalog) -> None:
    service = fake_service(catalog)
    rng = np.random.default_rng(4)
    base = unit(rng.standard_normal((2, 32)))
    ids = add(
        service, [base[0], *with_cosines(base[0], rng, [0.99, 0.98]), base[1], *with_cosines(base[1], rng, [0.99])], 10
    )
    first = service.duplicates.page("photos", budget_s=None)
    assert sorted(map(sorted, groups_of(first, "similar"))) == [ids[:3], ids[3:]]
    snapshot = next(iter(service.duplicates.finder._cache.values()))
    service.delete_items([ids[1], ids[4]])
    after = service.duplicates.page("photos", budget_s=None)
    assert groups_of(after, "similar") == [[ids[0], ids[2]]]  # the pair lost a member: no group
    assert next(iter(service.duplicates.finder._cache.values())) is snapshot  # reused, not computed again
    add(service, with_cosines(base[1], rng, [0.99]), 50)
    again = service.duplicates.page("photos", budget_s=None)
    assert len(groups_of(again, "similar")) == 2
    assert next(iter(service.duplicates.finder._cache.values())) is not snapshot


def test_a_burst_larger_than_a_group_is_split_into_cliques(catalog: SqlCatalog) -> None:
    service = fake_service(catalog)
    rng = np.random.default_rng(5)
    base = unit(rng.standard_normal((1, 32)))[0]
    ids = add(service, [base, *with_cosines(base, rng, [0.995] * 49)], 300)
    page = service.duplicates.page("photos", budget_s=None)
    groups = groups_of(page, "similar")
    assert all(2 <= len(g) <= MAX_GROUP_SIZE for g in groups) and max(len(g) for g in groups) == MAX_GROUP_SIZE
    assert len({i for g in groups for i in g}) == sum(len(g) for g in groups) <= len(ids)


def test_what_is_refused(catalog: SqlCatalog) -> None:
    service = fake_service(catalog)
    service.create("words", "texts")
    service.writes.add_texts("words", [NewText("一只猫")], FakeEncoder().embed_texts_sync(["一只猫"]))
    with pytest.raises(InvalidInput, match="holds texts"):
        service.duplicates.page("words")
    with pytest.raises(NotFound):
        service.duplicates.page("nothing-here")
    for kwargs in ({"limit": 0}, {"limit": 101}, {"offset": -1}, {"offset": 10**7}, {"tier": "bogus"}):
        with pytest.raises(InvalidInput):
            service.duplicates.page("photos", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        service.duplicates.page("photos", threshold=0.2)
    empty = service.duplicates.page("photos")
    assert empty.groups == [] and empty.complete and empty.total == 0


def test_too_many_pairs_raise_the_threshold_and_say_so(catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(near_vectors, "MAX_PAIRS", 40)
    service = fake_service(catalog)
    rng = np.random.default_rng(6)
    base = unit(rng.standard_normal((1, 32)))[0]
    add(service, [base, *with_cosines(base, rng, list(np.linspace(0.97, 0.999, 29)))], 400)  # 435 pairs
    page = service.duplicates.page("photos", budget_s=None)
    assert page.threshold_source == "raised" and page.threshold > 0.95
    snapshot = next(iter(service.duplicates.finder._cache.values()))
    assert 0 < len(snapshot.shots.pairs) <= 40
    assert min(snapshot.shots.pairs.values()) >= page.threshold
    for group in page.groups:
        assert all(m.score >= page.threshold for m in group.members)
