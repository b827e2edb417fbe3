"""The model directory's `manifest.json`: what the runtime needs to load a converted model.

Schema (format 1), documented in the README:

    {
      "format": 1,
      "name": "cnclip-demo",              # model id stored beside every vector
      "arch": "ViT-B-16",                 # or a custom architecture name
      "embed_dim": 512, "image_size": 224, "context_length": 52,
      "mean": [3 floats], "std": [3 floats], "interpolation": "bicubic",
      "logit_scale": 100.0,               # the multiplier, already exp()'d
      "towers": {
        "image": {"input": "image", "output": "image_features",
                  "graphs": {"fp32": {"1": "image.fp32.b1.onnx", "8": "..."}, "int8": {...}}},
        "text":  {"input": "text",  "output": "text_features", "graphs": {...}}
      },
      "files": {"image.fp32.b1.onnx": "<sha256>", "image.fp32.data": "<sha256>", ...},
      "extra": {...}                      # free-form: source checkpoint, convert report, ...
    }

Each graph has fixed shapes: image `[b, 3, R, R]` float32, text `[b, context_length]` int64, and
outputs L2-normalised float32 `[b, embed_dim]`. Bucket graphs of one tower and precision may
share one external-data file, so weights are stored once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval.errors import ModelError

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
PRECISIONS = ("fp32", "fp16", "int8")
CNCLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CNCLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def same_model(recorded: str, model_id: str) -> bool:
    """True when vectors recorded as made by `recorded` came from the model `model_id`.

    Collections made before model ids carried a fingerprint recorded the bare name; those are
    taken at their word, so that upgrading the service does not force a re-index."""
    return recorded == model_id or recorded == model_id.split("@", 1)[0]


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class TowerSpec:
    input_name: str
    output_name: str
    # precision -> batch bucket -> graph file (relative to the model directory)
    graphs: dict[str, dict[int, str]]

    def precisions(self) -> list[str]:
        return [p for p in PRECISIONS if p in self.graphs]

    def buckets(self, precision: str) -> list[int]:
        return sorted(self.graphs[precision])

    def to_json(self) -> dict[str, Any]:
        return {
            "input": self.input_name,
            "output": self.output_name,
            "graphs": {p: {str(b): f for b, f in sorted(g.items())} for p, g in self.graphs.items()},
        }


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

    def graph_path(self, tower: str, precision: str, bucket: int) -> Path:
        if self.directory is None:
            raise ModelError("manifest has no directory; load it with ModelManifest.load()")
        return self.directory / self.towers[tower].graphs[precision][bucket]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
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
        names = {f for t in self.towers.values() for g in t.graphs.values() for f in g.values()}
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
        if not path.is_file():
            raise ModelError(f"no {MANIFEST_NAME} in model directory {directory}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelError(f"{path} is not valid JSON: {exc}") from exc
        manifest = _parse(raw, path)
        manifest = ModelManifest(**{**manifest.__dict__, "directory": directory})
        if verify:
            manifest.verify()
        return manifest

    def verify(self) -> None:
        assert self.directory is not None
        listed = set(self.files)
        for tower_name, tower in self.towers.items():
            for precision, graphs in tower.graphs.items():
                for bucket, name in graphs.items():
                    if name not in listed:
                        raise ModelError(
                            f"{MANIFEST_NAME}: graph {name} ({tower_name}/{precision}/b{bucket}) "
                            "has no sha256 in 'files'"
                        )
        for name, expected in self.files.items():
            file = self.directory / name
            if not file.is_file():
                raise ModelError(f"model file missing: {file} (listed in {MANIFEST_NAME})")
            actual = sha256_file(file)
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


def _parse(raw: Any, where: Path) -> ModelManifest:
    if not isinstance(raw, dict):
        raise ModelError(f"{where}: top level must be an object")
    fmt = raw.get("format")
    if fmt != FORMAT_VERSION:
        raise ModelError(f"{where}: unsupported manifest format {fmt!r} (this version reads {FORMAT_VERSION})")
    towers_raw = _require(raw, "towers", dict, where)
    towers: dict[str, TowerSpec] = {}
    for tower in ("image", "text"):
        if tower not in towers_raw:
            raise ModelError(f"{where}: missing tower '{tower}'")
        t = towers_raw[tower]
        graphs_raw = _require(t, "graphs", dict, where)
        graphs: dict[str, dict[int, str]] = {}
        for precision, buckets in graphs_raw.items():
            if precision not in PRECISIONS:
                raise ModelError(f"{where}: tower '{tower}' has unknown precision '{precision}'")
            try:
                graphs[precision] = {int(b): str(f) for b, f in buckets.items()}
            except (AttributeError, ValueError) as exc:
                raise ModelError(f"{where}: tower '{tower}' precision '{precision}': bad buckets") from exc
            if not graphs[precision] or min(graphs[precision]) < 1:
                raise ModelError(f"{where}: tower '{tower}' precision '{precision}' has no valid bucket")
        if not graphs:
            raise ModelError(f"{where}: tower '{tower}' has no graphs")
        towers[tower] = TowerSpec(
            input_name=_require(t, "input", str, where), output_name=_require(t, "output", str, where), graphs=graphs
        )
    mean = tuple(float(x) for x in raw.get("mean", CNCLIP_MEAN))
    std = tuple(float(x) for x in raw.get("std", CNCLIP_STD))
    if len(mean) != 3 or len(std) != 3:
        raise ModelError(f"{where}: mean and std need 3 values each")
    files = raw.get("files", {})
    if not isinstance(files, dict):
        raise ModelError(f"{where}: 'files' must be an object of name -> sha256")
    return ModelManifest(
        name=_require(raw, "name", str, where),
        arch=_require(raw, "arch", str, where),
        embed_dim=_require(raw, "embed_dim", int, where),
        image_size=_require(raw, "image_size", int, where),
        context_length=_require(raw, "context_length", int, where),
        logit_scale=float(_require(raw, "logit_scale", (int, float), where)),
        towers=towers,
        mean=mean,  # type: ignore[arg-type]
        std=std,  # type: ignore[arg-type]
        interpolation=str(raw.get("interpolation", "bicubic")),
        files={str(k): str(v) for k, v in files.items()},
        extra=raw.get("extra", {}) or {},
    )
