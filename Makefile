# The README names these targets; .ci/run calls `install` and `test` exactly as a user would.
PY ?= python3

.PHONY: install demo test test-all lint format bench

install:  ## Everything the product and its tests need, on a fresh machine
	$(PY) -m pip install -e ".[dev]"
	# cn_clip is the reference for parity tests; its own dependencies (torchvision, lmdb) are not wanted.
	$(PY) -m pip install --no-deps cn_clip==1.6.0
	# Debian's Chromium for the browser tests (Playwright drives it; it downloads no browser of its own).
	# A CJK font so that screenshots of the Chinese UI are readable.
	@{ command -v chromium >/dev/null 2>&1 && fc-list :lang=zh | grep -q .; } || { apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium fonts-wqy-microhei; }

demo:  ## Index the demo gallery and serve the UI at http://127.0.0.1:8000
	cnclip demo

test:  ## The default suite (no slow benchmarks)
	$(PY) -m pytest

test-all:  ## Including the slow soak/benchmark tests
	$(PY) -m pytest -m ""

lint:
	ruff check .
	ruff format --check .
	mypy

format:
	ruff format .
	ruff check --fix .
