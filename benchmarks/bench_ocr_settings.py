"""OCR settings compared in one interleaved run (docs/ocr.md, Speed): this project's engine
(retrieval/ocr/engine.py) against RapidOCR used directly with its defaults and against variations
(the detector's size rule, ONNX Runtime threads, the memory arena, the direction classifier), on the
same pictures, each picture read by every setting in a rotating order so that the machine's load
hits them alike. Every reading is checked: a setting that misses a line of a picture's text is listed.

    python benchmarks/bench_ocr_settings.py                       # rendered signs at 1280×960
    python benchmarks/bench_ocr_settings.py --hard                # small in a 12-Mpx photo, phone screens
    python benchmarks/bench_ocr_settings.py --only "det max"      # settings whose name holds this

Pictures: the rendered signs and screenshots of the tests (tests/support/ocr_pictures.py) scaled to
1280×960, and two demo pictures without text; with --hard, each sign pasted at its own size into a
4000×3000 photo and each screenshot onto a 1080×2400 phone screen. Nothing is downloaded: every
setting opens the wheel's model files by path. Prints per setting the median, min and max seconds per
picture, and the load average at each round.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from indexer.domain.text_grams import normalize_text  # noqa: E402
from retrieval.backends.base import SessionConfig  # noqa: E402
from retrieval.ocr.engine import MODEL_FILES, RapidOcrEngine, model_dir  # noqa: E402
from retrieval.preprocess import decode_image  # noqa: E402
from tests.support.ocr_pictures import PICTURES, render_text_picture  # noqa: E402

Reader = Callable[[Image.Image], str]
Picture = tuple[str, tuple[str, ...], bytes]


def ours(threads: int = 1, arena: bool = False, params: dict[str, Any] | None = None) -> Reader:
    """The project's engine, with its sessions' threads and arena and RapidOCR parameters changed."""
    import onnxruntime as ort

    from retrieval.backends.onnxruntime import ort_session_options

    config = SessionConfig(provider="cpu", precision="fp32", cores=list(range(threads)))
    engine = RapidOcrEngine(config)
    if arena:
        for stage, file in MODEL_FILES.items():
            options = ort_session_options(config)
            options.enable_cpu_mem_arena = True
            engine._sessions[stage] = ort.InferenceSession(str(model_dir() / file), sess_options=options)
    pipeline = engine._pipeline()
    for key, value in (params or {}).items():  # the detector is built from its config at the first call
        stage, name = key.split(".")
        pipeline.cfg[stage][name] = value
        if stage == "Global":
            setattr(pipeline, name, value)
    return lambda image: engine.read(image).text


def rapidocr_defaults() -> Reader:
    """`RapidOCR()` as its documentation shows it: its own sessions (all cores), its default sizes;
    the model paths are the very files its defaults resolve to, so nothing can download."""
    from rapidocr import RapidOCR

    directory = model_dir()
    params: dict[str, Any] = {"Global.log_level": "error"}
    params.update({f"{stage}.model_path": str(directory / file) for stage, file in MODEL_FILES.items()})
    pipeline = RapidOCR(params=params)

    def read(image: Image.Image) -> str:
        output = pipeline(np.ascontiguousarray(np.asarray(image.convert("RGB"))[:, :, ::-1]))
        return "\n".join(getattr(output, "txts", None) or ())  # a pipeline of every stage: RapidOCROutput

    return read


SETTINGS: dict[str, Callable[[], Reader]] = {
    "ours (det max 736, 1 thread, arena off)": ours,
    "RapidOCR() defaults": rapidocr_defaults,
    "ours, det min 736 (RapidOCR's rule)": lambda: ours(params={"Det.limit_type": "min"}),
    "ours, det max 960": lambda: ours(params={"Det.limit_side_len": 960}),
    "ours, det max 640": lambda: ours(params={"Det.limit_side_len": 640}),
    "ours, 2 threads": lambda: ours(threads=2),
    "ours, arena on": lambda: ours(arena=True),
    "ours, no direction classifier": lambda: ours(params={"Global.use_cls": False}),
}


def _jpeg(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.convert("RGB").save(out, "JPEG", quality=88)
    return out.getvalue()


def pictures(hard: bool) -> list[Picture]:
    from demo.dataset import demo_gallery

    found: list[Picture] = []
    for index, picture in enumerate(PICTURES):
        drawn = render_text_picture(picture)
        if not hard:
            image = drawn.resize((1280, 960))
        elif picture.kind == "sign":
            image = Image.new("RGB", (4000, 3000), (90, 110, 100))
            image.paste(drawn, (300 + 400 * index, 500 + 300 * index))  # 54-70 px characters
        else:
            image = Image.new("RGB", (1080, 2400), (248, 248, 250))
            image.paste(drawn.resize((704, 528)), (40, 200))  # 44-px characters, as on a phone
        found.append((picture.name, picture.lines, _jpeg(image)))
    if not hard:
        for index, sample in enumerate(demo_gallery(2, seed=5)):
            found.append((f"photo-{index}", (), _jpeg(sample.image().resize((1280, 960)))))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hard", action="store_true", help="small text in large photos, phone screens")
    parser.add_argument("--only", default="", help="settings whose name holds this ('|' for several)")
    args = parser.parse_args()
    chosen = {n: make for n, make in SETTINGS.items() if not args.only or any(o in n for o in args.only.split("|"))}
    readers = {name: make() for name, make in chosen.items()}
    shown = pictures(args.hard)
    for read in readers.values():  # warm up outside the clock
        read(decode_image(shown[0][2], 100_000_000, 100_000_000))
    times: dict[str, list[float]] = {name: [] for name in readers}
    missed: dict[str, set[str]] = {name: set() for name in readers}
    loads = []
    for round_ in range(args.rounds):
        loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
        for index, (name, lines, data) in enumerate(shown):
            order = list(readers)
            shift = (index + round_) % len(order)
            for setting in order[shift:] + order[:shift]:
                image = decode_image(data, 100_000_000, 100_000_000)
                started = time.perf_counter()
                text = normalize_text(readers[setting](image))
                times[setting].append(time.perf_counter() - started)
                if any(normalize_text(line) not in text for line in lines):
                    missed[setting].add(name)
    loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{len(shown)} pictures{' (hard)' if args.hard else ''}, {args.rounds} rounds; load average: {loads}")
    print("| setting | median s | min s | max s | missed |")
    print("| --- | --- | --- | --- | --- |")
    for setting, taken in times.items():
        print(
            f"| {setting} | {statistics.median(taken):.3f} | {min(taken):.3f} | {max(taken):.3f} "
            f"| {', '.join(sorted(missed[setting])) or '-'} |"
        )


if __name__ == "__main__":
    main()
