"""The model directory's `manifest.json`: what the runtime needs to load a converted model.

Schema (format 2; format 1 is the same without "lengths"), documented in docs/models.md:

    {
      "format": 2,
      "name": "cnclip-demo",              # model id stored beside every vector
      "arch": "ViT-B-16",                 # or a custom architecture name
      "embed_dim": 512, "image_size": 224, "context_length": 52,
      "mean": [3 floats], "std": [3 floats], "interpolation": "bicubic",
      "logit_scale": 100.0,               # the multiplier, already exp()'d
      "towers": {
        "image": {"input": "image", "output": "image_features",
                  "graphs": {"fp32": {"1": "image.fp32.b1.onnx", "8": "..."}, "int8": {...}}},
        "text":  {"input": "text",  "output": "text_features", "graphs": {...},
                  "lengths": {"int8": {"16": {"1": "text.int8.b1.l16.onnx", ...}, "32": {...}}}}
      },
      "files": {"image.fp32.b1.onnx": "<sha256>", "image.fp32.data": "<sha256>", ...},
      "extra": {...}                      # free-form: source checkpoint, convert report, ...
    }

Each graph has fixed shapes: image `[b, 3, R, R]` float32, text `[b, context_length]` int64, and
outputs L2-normalised float32 `[b, embed_dim]`. "lengths" (format 2, text only) adds text graphs
`[b, L]` for lengths L shorter than `context_length`, for the same batch buckets (see
`retrieval/text_lengths.py`). Bucket graphs of one tower and precision may share one
external-data file, so weights are stored once.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval.errors import ModelError
from retrieval.json_text import loads
from retrieval.model_files import Dims, GraphShapes, check_model_files, sha256_file
from retrieval.regular_file import UnusableFile, read_regular_text

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)  # format 1: no text length buckets
# int8: ONNX Runtime's dynamic quantization; int8-qdq: NNCF's calibrated static int8 (for OpenVINO).
PRECISIONS = ("fp32", "fp16", "int8", "int8-qdq")
CNCLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CNCLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_MANIFEST_BYTES = 16 << 20
# Bounds of the numbers a manifest may hold (beyond them no model runs, and a SQL INTEGER overflows).
LIMITS = {"embed_dim": (1, 65_536), "image_size": (8, 8_192), "context_length": (2, 8_192), "bucket": (1, 65_536)}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def same_model(recorded: str, model_id: str) -> bool:
    """True when vectors recorded as made by `recorded` came from the model `model_id`.

    Collections made before model ids carried a fingerprint recorded the bare name; those are
    taken at their word, so that upgrading the service does not force a re-index."""
    return recorded == model_id or recorded == model_id.split("@", 1)[0]


@dataclass(frozen=True)
class TowerSpec:
    input_name: str
    output_name: str
    # precision -> batch bucket -> graph file (relative to the model directory), at the full input length
    graphs: dict[str, dict[int, str]]
    # text only: precision -> shorter sequence length -> batch bucket -> graph file
    short_graphs: dict[str, dict[int, dict[int, str]]] = field(default_factory=dict)

    def precisions(self) -> list[str]:
        return [p for p in PRECISIONS if p in self.graphs]

    def buckets(self, precision: str) -> list[int]:
        return sorted(self.graphs[precision])

    def short_lengths(self, precision: str) -> list[int]:
        """The shorter sequence lengths that have a graph for every batch bucket of `precision`."""
        full = set(self.graphs[precision])
        return sorted(n for n, g in self.short_graphs.get(precision, {}).items() if set(g) >= full)

    def graph_files(self) -> list[str]:
        """Every graph file of this tower."""
        names = [f for g in self.graphs.values() for f in g.values()]
        names += [f for by_length in self.short_graphs.values() for g in by_length.values() for f in g.values()]
        return names

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "input": self.input_name,
            "output": self.output_name,
            "graphs": {p: {str(b): f for b, f in sorted(g.items())} for p, g in self.graphs.items()},
        }
        if self.short_graphs:
            out["lengths"] = {
                p: {str(n): {str(b): f for b, f in sorted(g.items())} for n, g in sorted(by_length.items())}
                for p, by_length in self.short_graphs.items()
            }
        return out


@dataclass(frozen=True)
class ModelManifest:
    name: str
    arch: str
    embed_dim: int
    image_size: int
    context_length: int
    logit_scale: float
    towers: dict[str, TowerSpec]
    mean: tuple[float, float, float] = CNCLIP_MEAN
    std: tuple[float, float, float] = CNCLIP_STD
    interpolation: str = "bicubic"
    files: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    directory: Path | None = None

    @property
    def model_id(self) -> str:
        """The name plus a fingerprint of every file's sha256 ("cnclip-demo@3f2a9c01b4de").

        Collections record the model their vectors came from; with the name alone, a retrained or
        re-converted model of the same name would be searched against the old weights' vectors."""
        if not self.files:
            return self.name
        listing = "\n".join(f"{name} {digest}" for name, digest in sorted(self.files.items()))
        return f"{self.name}@{hashlib.sha256(listing.encode('utf-8')).hexdigest()[:12]}"

    def text_lengths(self, precision: str) -> list[int]:
        """The text graphs' sequence lengths for `precision`, ascending; the last is `context_length`."""
        return [*self.towers["text"].short_lengths(precision), self.context_length]

    def graph_path(self, tower: str, precision: str, bucket: int, length: int | None = None) -> Path:
        """The graph of one batch bucket; for text, `length` picks a length bucket (default: the full one)."""
        if self.directory is None:
            raise ModelError("manifest has no directory; load it with ModelManifest.load()")
        spec = self.towers[tower]
        if length is None or (tower == "text" and length == self.context_length):
            return self.directory / spec.graphs[precision][bucket]
        try:
            return self.directory / spec.short_graphs[precision][length][bucket]
        except KeyError:
            raise ModelError(
                f"the model has no {tower}/{precision} graph for batch {bucket} at length {length}"
            ) from None

    def graph_shapes(self) -> dict[str, GraphShapes]:
        """graph file -> the input and output names and shapes this manifest promises for it."""
        shapes: dict[str, GraphShapes] = {}
        for tower_name, tower in self.towers.items():
            graphs = [(b, self.context_length, f) for g in tower.graphs.values() for b, f in g.items()]
            graphs += [(b, n, f) for by_n in tower.short_graphs.values() for n, g in by_n.items() for b, f in g.items()]
            for bucket, length, name in graphs:
                side = self.image_size
                shape: Dims = (bucket, 3, side, side) if tower_name == "image" else (bucket, length)
                shapes[name] = GraphShapes(tower.input_name, shape, tower.output_name, (bucket, self.embed_dim))
        return shapes

    def to_json(self) -> dict[str, Any]:
        return {
            # Without length buckets a manifest stays format 1, readable by earlier versions too.
            "format": FORMAT_VERSION if any(t.short_graphs for t in self.towers.values()) else 1,
            "name": self.name,
            "arch": self.arch,
            "embed_dim": self.embed_dim,
            "image_size": self.image_size,
            "context_length": self.context_length,
            "mean": list(self.mean),
            "std": list(self.std),
            "interpolation": self.interpolation,
            "logit_scale": self.logit_scale,
            "towers": {name: t.to_json() for name, t in self.towers.items()},
            "files": dict(sorted(self.files.items())),
            "extra": self.extra,
        }

    def save(self, directory: Path, data_files: list[str] | None = None) -> ModelManifest:
        """Hash every graph file (and listed data files) and write `manifest.json`."""
        directory = Path(directory)
        names = {f for t in self.towers.values() for f in t.graph_files()}
        names.update(data_files or [])
        names.update(self.files)
        missing = sorted(n for n in names if not (directory / n).is_file())
        if missing:
            raise ModelError(f"cannot write manifest: missing files in {directory}: {', '.join(missing)}")
        hashed = {n: sha256_file(directory / n) for n in sorted(names)}
        saved = ModelManifest(**{**self.__dict__, "files": hashed, "directory": directory})
        tmp = directory / (MANIFEST_NAME + ".tmp")
        tmp.write_text(json.dumps(saved.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(directory / MANIFEST_NAME)
        return saved

    @classmethod
    def load(cls, directory: Path, verify: bool = True) -> ModelManifest:
        """Read and check a model directory; every problem is reported with the file it concerns."""
        directory = Path(directory)
        path = directory / MANIFEST_NAME
        try:
            raw = loads(read_regular_text(path, MAX_MANIFEST_BYTES, MANIFEST_NAME), unique_keys=True)
        except UnusableFile as exc:
            if exc.missing:
                raise ModelError(f"no {MANIFEST_NAME} in model directory {directory}") from None
            raise ModelError(exc.message) from None
        except json.JSONDecodeError as exc:
            raise ModelError(f"{path} is not valid JSON: {exc}") from None
        manifest = _parse(raw, path)
        manifest = ModelManifest(**{**manifest.__dict__, "directory": directory})
        # Regular files of plausible size, graphs of the shapes this manifest promises.
        check_model_files(directory, manifest.files, manifest.graph_shapes())
        if verify:
            manifest.verify()
        return manifest

    def verify(self) -> None:
        assert self.directory is not None
        listed = set(self.files)
        for tower_name, tower in self.towers.items():
            for name in tower.graph_files():
                if name not in listed:
                    raise ModelError(f"{MANIFEST_NAME}: graph {name} ({tower_name}) has no sha256 in 'files'")
        for name, expected in self.files.items():
            file = self.directory / name
            try:
                actual = sha256_file(file)
            except UnusableFile as exc:
                if exc.missing:
                    raise ModelError(f"model file missing: {file} (listed in {MANIFEST_NAME})") from None
                raise ModelError(f"model file {exc.message}") from None
            if actual != expected:
                raise ModelError(
                    f"model file corrupt: {file} has sha256 {actual[:12]}…, manifest says {expected[:12]}…"
                )


def _require(raw: dict[str, Any], key: str, kind: type | tuple[type, ...], where: Path) -> Any:
    if key not in raw:
        raise ModelError(f"{where}: missing field '{key}'")
    value = raw[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ModelError(f"{where}: field '{key}' has the wrong type ({type(value).__name__})")
    return value


def _bounded(raw: dict[str, Any], key: str, where: Path) -> int:
    """An integer field within `LIMITS[key]`."""
    value: int = _require(raw, key, int, where)
    low, high = LIMITS[key]
    if not low <= value <= high:
        raise ModelError(f"{where}: field '{key}' must lie in [{low}, {high}], not {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(raw: dict[str, Any], key: str, where: Path, default: str | None = None, limit: int = 200) -> str:
    value = raw.get(key, default) if default is not None else _require(raw, key, str, where)
    if not isinstance(value, str) or not value or len(value) > limit or not value.isprintable():
        raise ModelError(f"{where}: field '{key}' must be printable text of 1 to {limit} characters")
    return value


def _file_name(name: Any, where: Path) -> str:
    """A file of the model directory: a relative path inside it, no `..`, no control characters."""
    if not isinstance(name, str) or not name or len(name) > 255 or not name.isprintable():
        raise ModelError(f"{where}: file name {_short(name)} is not a file of the model directory")
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or "\\" in name:
        raise ModelError(f"{where}: file name {_short(name)} leaves the model directory")
    return name


def _triple(raw: dict[str, Any], key: str, default: tuple[float, float, float], where: Path) -> tuple[float, ...]:
    value = raw.get(key, list(default))
    good = isinstance(value, list) and len(value) == 3
    good = good and all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in value)
    if not good or (key == "std" and min(value) <= 0) or max(abs(x) for x in value) > 1e6:
        raise ModelError(f"{where}: '{key}' must be 3 finite numbers{' above 0' if key == 'std' else ''}")
    return tuple(float(x) for x in value)


def _parse(raw: Any, where: Path) -> ModelManifest:
    if not isinstance(raw, dict):
        raise ModelError(f"{where}: top level must be an object")
    fmt = raw.get("format")
    if fmt not in READABLE_FORMATS or isinstance(fmt, bool):
        readable = " and ".join(map(str, READABLE_FORMATS))
        raise ModelError(f"{where}: unsupported manifest format {_short(fmt)} (this version reads formats {readable})")
    context_length = _bounded(raw, "context_length", where)
    towers_raw = _require(raw, "towers", dict, where)
    towers: dict[str, TowerSpec] = {}
    for tower in ("image", "text"):
        if tower not in towers_raw:
            raise ModelError(f"{where}: missing tower '{tower}'")
        t = towers_raw[tower]
        if not isinstance(t, dict):
            raise ModelError(f"{where}: tower '{tower}' must be an object, not {type(t).__name__}")
        graphs_raw = _require(t, "graphs", dict, where)
        graphs = {
            _text({"p": precision}, "p", where, limit=32): _parse_buckets(
                buckets, f"tower '{tower}' precision '{_short(precision)}'", where
            )
            for precision, buckets in graphs_raw.items()
        }
        if not graphs:
            raise ModelError(f"{where}: tower '{tower}' has no graphs")
        towers[tower] = TowerSpec(
            input_name=_text(t, "input", where),
            output_name=_text(t, "output", where),
            graphs=graphs,
            short_graphs=_parse_lengths(t.get("lengths", {}), tower, set(graphs), context_length, where),
        )
    files = raw.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(v, str) and _SHA256.match(v) for v in files.values()):
        raise ModelError(f"{where}: 'files' must be an object of file name -> sha256 (64 hex digits)")
    extra = raw.get("extra", {}) or {}
    if not isinstance(extra, dict):
        raise ModelError(f"{where}: 'extra' must be an object")
    logit_scale = float(_require(raw, "logit_scale", (int, float), where))
    if not math.isfinite(logit_scale) or not 0 < logit_scale <= 1e4:
        raise ModelError(f"{where}: field 'logit_scale' must be a finite number in (0, 10000]")
    return ModelManifest(
        name=_text(raw, "name", where),
        arch=_text(raw, "arch", where),
        embed_dim=_bounded(raw, "embed_dim", where),
        image_size=_bounded(raw, "image_size", where),
        context_length=context_length,
        logit_scale=logit_scale,
        towers=towers,
        mean=_triple(raw, "mean", CNCLIP_MEAN, where),  # type: ignore[arg-type]
        std=_triple(raw, "std", CNCLIP_STD, where),  # type: ignore[arg-type]
        interpolation=_text(raw, "interpolation", where, default="bicubic", limit=32),
        files={_file_name(k, where): v for k, v in files.items()},
        extra=extra,
    )


def _integer_key(key: Any, what: str, where: Path) -> int:
    """A JSON object key that is a whole number within `LIMITS["bucket"]` (batch sizes, text lengths)."""
    low, high = LIMITS["bucket"]
    if (
        not isinstance(key, str)
        or len(key) > 6
        or not key.isascii()
        or not key.isdigit()
        or not low <= int(key) <= high
    ):
        raise ModelError(f"{where}: {what}: {_short(key)} is not a whole number in [{low}, {high}]")
    return int(key)


def _parse_buckets(buckets: Any, what: str, where: Path) -> dict[int, str]:
    if not isinstance(buckets, dict) or not buckets:
        raise ModelError(f"{where}: {what} has no valid bucket")
    return {_integer_key(b, what, where): _file_name(f, where) for b, f in buckets.items()}


def _parse_lengths(
    raw: Any, tower: str, precisions: set[str], context_length: int, where: Path
) -> dict[str, dict[int, dict[int, str]]]:
    """The "lengths" object of a tower (format 2): precision -> length -> batch -> file."""
    if not raw:
        return {}
    if tower != "text" or not isinstance(raw, dict):
        raise ModelError(f"{where}: only the text tower may have 'lengths', as an object")
    parsed: dict[str, dict[int, dict[int, str]]] = {}
    for precision, by_length in raw.items():
        if precision not in precisions or not isinstance(by_length, dict):
            raise ModelError(f"{where}: text 'lengths' names precision {_short(precision)}, which has no graphs")
        for key, buckets in by_length.items():
            length = _integer_key(key, f"text 'lengths' of '{precision}': lengths must be integers", where)
            if not 2 <= length < context_length:
                raise ModelError(f"{where}: text length {length} must lie in [2, context_length)")
            what = f"text precision '{precision}' length {length}"
            parsed.setdefault(precision, {})[length] = _parse_buckets(buckets, what, where)
    return parsed
