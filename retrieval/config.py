"""The model runtime's settings. Built by the app factory or the CLI, never at import time.

Each layer owns its part: `retrieval.config.RuntimeSettings` (model, providers, buckets, remote
encoder), `indexer.config.StorageSettings` adds the catalog (database, vector engine),
`api.config.Settings` adds the HTTP server (address, key, timeouts) and is the one object users
configure. Every field is read from the environment with the prefix `CNCLIP_` (for example
`CNCLIP_MODEL_DIR`); list fields take JSON (`CNCLIP_BUCKETS='[1,4,8]'`). Every field is
documented in the settings table of docs/settings.md; a test keeps the two in sync.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from retrieval.encoder_url import parse_encoder_url
from retrieval.errors import CnclipError
from retrieval.machine_limits import inference_threads_refusal
from retrieval.settings_source import SafeEnvSource

REPO_ROOT = Path(__file__).resolve().parent.parent
# The small demo model the project trains and ships (see models/cnclip-demo/MODEL_CARD.md).
SHIPPED_MODEL_DIR = REPO_ROOT / "models" / "cnclip-demo"


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "cnclip"


class RuntimeSettings(BaseSettings):
    """The model runtime's part (and where the service keeps its files)."""

    # allow_inf_nan=False: `inf` passes every `gt=0` and `nan` every comparison-free use; no setting means either.
    model_config = SettingsConfigDict(
        env_prefix="CNCLIP_", env_nested_delimiter="__", extra="ignore", allow_inf_nan=False
    )

    # --- model runtime -------------------------------------------------------------------
    model_dir: Path = Field(SHIPPED_MODEL_DIR, description="Model directory with manifest.json.")
    model_dirs: list[Path] = Field(
        default_factory=list,
        description="More model directories a server holds besides CNCLIP_MODEL_DIR (JSON list): a collection is "
        "answered by its active model's encoder, so a collection can migrate to a new model (`cnclip migrate`). "
        "Each is checked in full before the port is bound (manifest, files, graph shapes, plan), as CNCLIP_MODEL_DIR is.",
    )
    provider: Literal["auto", "cann", "cuda", "cpu"] = Field(
        "auto", description="Execution provider; auto detects an Ascend NPU, then CUDA, then uses CPU."
    )
    precision: Literal["auto", "fp32", "fp16", "bf16", "int8"] = Field(
        "auto",
        description="Run precision; auto = the tuning file's choice, else fp16 on NPU/GPU, int8 on CPU when "
        "present, else fp32. bf16 needs OpenVINO on a CPU with AVX512_BF16 or AMX.",
    )
    backend: Literal["auto", "onnxruntime", "openvino"] = Field(
        "auto",
        description="Execution backend; auto = what a matching tuning file chose per tower (`cnclip tune`), "
        "else ONNX Runtime. openvino needs the `openvino` extra.",
    )
    openvino_device: str = Field(
        "auto",
        pattern=r"^(?i:auto|cpu|gpu(\.\d{1,2})?|npu)$",
        description="OpenVINO device: auto (the CPU), CPU, GPU, GPU.N or NPU where OpenVINO lists it.",
    )
    tuning_file: Path | None = Field(
        None,
        description="The tuning file `cnclip tune` wrote; unset = tuning.json in the model directory. Used only "
        "when it was made for this model on this machine. Naming something that is not a regular file (a FIFO, a "
        "device) stops `cnclip serve` at start in one line.",
    )
    memory_budget_mb: Literal["auto"] | Annotated[int, Field(ge=0)] = Field(
        "auto",
        description="Upper bound for the towers' weight copies in MB (shared copies once, each prepacked "
        "session once more, OpenVINO on the CPU once per stream); tuned prepacked sessions "
        "are dropped to fit. auto = one copy of each "
        "tower + 400 MB (or the budget the tuning file was made with); 0 = no bound.",
    )
    device_id: int = Field(0, description="NPU/GPU device index.")
    buckets: list[int] = Field(
        default_factory=lambda: [1, 4, 8, 16, 32],
        description="Batch sizes compiled at start-up; requests are padded to the nearest bucket.",
    )
    text_lengths: list[int] = Field(
        default_factory=list,
        description="Text length buckets to load (tokens, e.g. `[16,52]`); empty = every length the model has. "
        "A text runs in the shortest that holds it.",
    )
    streams: int = Field(
        1, ge=1, le=64, description="Parallel inference sessions per tower; at most the cores this process may run on."
    )
    threads_per_stream: int = Field(
        0,
        ge=0,
        description="intra_op threads of each CPU session; 0 = cores divided by streams. Streams × threads may not "
        "exceed the cores this process may run on (a tuning file's too).",
    )
    pin_threads: bool = Field(False, description="Pin each CPU stream's threads to its own cores.")
    share_weights: bool = Field(
        True,
        description="CPU, with a session per bucket (CNCLIP_DYNAMIC_SHAPES=false, or graphs that cannot be one): "
        "all bucket sessions of a tower share one memory-mapped copy of its weights, without prepacking or "
        "per-session arenas (a fraction of the memory, matmuls 10-20 % slower); false gives each session its own "
        "prepacked copy.",
    )
    dynamic_shapes: bool = Field(
        True,
        description="ONNX Runtime on the CPU: each stream runs every bucket and text length of a tower on one "
        "shape-dynamic session with its own prepacked copy of the weights (any batch size, unpadded); false: a "
        "session per bucket, holding the weights as CNCLIP_SHARE_WEIGHTS says.",
    )
    max_queue_delay_ms: float = Field(
        4.0, ge=0, description="How long the batcher waits to fill a bucket before running a partial one."
    )
    max_queue_size: int = Field(2048, ge=1, description="Queued items per tower before requests get 429.")
    dynamic_batching: bool = Field(
        True, description="Merge concurrent requests into one batch; false runs each request on its own."
    )
    query_cache_size: int = Field(
        4096,
        ge=0,
        description="Text embeddings (search queries, zero-shot prompts) the encoder keeps, keyed by model and "
        "token ids; also the size of the zero-shot label cache. 0 turns both off.",
    )
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1, description="Largest accepted image upload.")
    max_image_pixels: int = Field(
        50_000_000, ge=1, description="Largest accepted image in pixels (decompression-bomb guard)."
    )
    max_request_pixels: int | None = Field(
        None,
        ge=1,
        description="Pixels all images of one request may hold together, read from their headers before any is "
        "decoded (413 above it); unset = 8 × CNCLIP_MAX_IMAGE_PIXELS.",
    )
    ocr_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Photos read for text at once in collections with OCR (docs/ocr.md), one ONNX Runtime thread "
        "each, apart from the encoder's streams.",
    )

    # --- model download (`cnclip models pull`) ------------------------------------------------
    model_base_url: str = Field(
        "https://huggingface.co",
        description="Where `cnclip models pull` downloads checkpoints: a Hugging Face mirror root, or a URL "
        "template with {repo} and {file} (e.g. for ModelScope).",
    )

    # --- remote encoder (Triton / KServe v2) --------------------------------------------------
    encoder: str = Field(
        "local",
        description="`local` runs the model in this process; `triton://host:port` (or `http://host:port`) "
        "embeds through a remote Triton/KServe v2 server.",
    )
    encoder_timeout_s: float = Field(30.0, gt=0, description="Timeout of one request to the remote encoder.")
    encoder_retries: int = Field(
        3, ge=0, description="Retries (exponential backoff) on connection errors and 5xx from the remote encoder."
    )
    encoder_connections: int = Field(16, ge=1, description="Connection pool size to the remote encoder.")

    # --- files ---------------------------------------------------------------------------------
    data_dir: Path = Field(
        default_factory=default_data_dir, description="Where the SQLite file, FAISS indexes and media live."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment read by `SafeEnvSource`: JSON values parsed as hostile text."""
        return init_settings, SafeEnvSource(settings_cls), dotenv_settings, file_secret_settings

    @field_validator("model_dirs")
    @classmethod
    def _model_directories(cls, value: list[Path]) -> list[Path]:
        # Read and checked in full (manifest, files, graph shapes; retrieval/manifest.py) by every command
        # that loads them, before it starts: here only what needs no reading.
        from retrieval.regular_file import UnusableFile, check_regular

        for directory in value:
            try:
                check_regular(Path(directory) / "manifest.json")
            except UnusableFile as exc:
                raise ValueError(f"{directory} is not a model directory (its manifest.json {exc.reason})") from None
        return list(dict.fromkeys(Path(d) for d in value))

    @field_validator("streams")
    @classmethod
    def _streams_fit_the_cores(cls, value: int) -> int:
        refusal = inference_threads_refusal(value, 0)
        if refusal is not None:
            raise ValueError(refusal)
        return value

    @field_validator("threads_per_stream")
    @classmethod
    def _threads_fit_the_cores(cls, value: int, info: ValidationInfo) -> int:
        refusal = inference_threads_refusal(info.data.get("streams", 1), value)
        if refusal is not None:
            raise ValueError(refusal)
        return value

    @field_validator("text_lengths")
    @classmethod
    def _sorted_text_lengths(cls, value: list[int]) -> list[int]:
        if any(n < 2 for n in value):
            raise ValueError("text lengths must be at least 2 tokens ([CLS] and [SEP])")
        return sorted(set(value))

    @field_validator("encoder")
    @classmethod
    def _encoder_is_local_or_a_url(cls, value: str) -> str:
        # Checked with the settings (one line, status 2, before the port is bound), by the one parser
        # the remote encoder uses (retrieval/encoder_url.py), not when the server starts.
        if value != "local":
            try:
                parse_encoder_url(value)
            except CnclipError as exc:
                raise ValueError(exc.message) from None
        return value

    @field_validator("data_dir")
    @classmethod
    def _data_dir_is_a_folder(cls, value: Path) -> Path:
        # Made when missing; something else at that name (a file, a FIFO, /dev/null, a link to nothing, a
        # name too long) is a bad setting (retrieval/regular_file.py).
        from retrieval.regular_file import folder_problem

        problem = folder_problem(value)
        if problem is not None:
            raise ValueError(f"{ascii(str(value)) if 'UTF-8' in problem else value} {problem}")
        return value

    @field_validator("buckets")
    @classmethod
    def _sorted_positive_buckets(cls, value: list[int]) -> list[int]:
        if not value or any(b < 1 for b in value):
            raise ValueError("buckets must be a non-empty list of positive batch sizes")
        return sorted(set(value))
