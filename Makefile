# The README and docs/development.md name these targets; .ci/run calls `install` and `test` exactly as a user would.
PY ?= python3
PYTEST_ARGS ?=

LOCK_VENV := build/lock-venv
APT_LOCK_WAIT_S ?= 600

.PHONY: install lock demo test test-all lint format bench

install:  ## Everything the product and its tests need, on a fresh machine, at the versions CI tested
	# constraints.txt holds the versions the suite was last green with (see `make lock`); pyproject.toml keeps ranges.
	$(PY) -m pip install -c constraints.txt -e ".[dev]"
	# cn_clip is the reference for parity tests; its own dependencies (torchvision, lmdb) are not wanted.
	$(PY) -m pip install -c constraints.txt --no-deps cn_clip
	# Debian's Chromium for the browser tests (Playwright drives it; it downloads no browser of its own).
	# WenQuanYi Micro Hei: screenshots of the Chinese UI are readable, and the text-in-photos tests render
	# their signs with this very file (any other CJK font would not do).
	# .ci/apt-install waits while another apt (unattended upgrades on a fresh machine) holds its lock.
	@{ command -v chromium >/dev/null 2>&1 && test -f /usr/share/fonts/truetype/wqy/wqy-microhei.ttc; } || \
	  APT_LOCK_WAIT_S=$(APT_LOCK_WAIT_S) .ci/apt-install chromium fonts-wqy-microhei

lock:  ## Re-resolve every dependency to the newest that pyproject.toml allows, into constraints.txt; then run make install test
	rm -rf $(LOCK_VENV)
	$(PY) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q -e ".[dev]"
	$(LOCK_VENV)/bin/python -m pip install -q --no-deps cn_clip==1.6.0
	{ sed -n '/^#/p' constraints.txt; $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable | grep -v "^pip=="; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(LOCK_VENV)

demo:  ## Index the demo gallery and serve the UI at http://127.0.0.1:8000
	cnclip demo

test:  ## The default suite (no slow benchmarks); PYTEST_ARGS=… adds pytest options (.ci/run's two runs)
	$(PY) -m pytest $(PYTEST_ARGS)

test-all:  ## Including the slow soak/benchmark tests
	$(PY) -m pytest -m ""

lint:
	ruff check .
	ruff format --check .
	mypy

format:
	ruff format .
	ruff check --fix .
