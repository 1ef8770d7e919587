# smith-fast: `make serve` and `make test` set everything up from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
SOCK   ?= $(CURDIR)/.smith-fast.sock
TCP    ?= 127.0.0.1:7878
NPM    ?= npm
# tests/test_interop.py drives a session from Node.js (protobufjs), whose packages live here.
INTEROP := tests/interop

.PHONY: serve test bench bench-micro install clean proto

$(VENV)/.deps: requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip
	$(PIP) install -r requirements-dev.txt
	touch $@

# --no-build-isolation: build with the Cython pinned in requirements-dev.txt, already in the venv.
$(VENV)/.build: $(VENV)/.deps setup.py $(wildcard csrc/*.pyx csrc/*.pxd csrc/*_c.py smith_fast/*_py.py)
	$(PIP) install --no-build-isolation -e .
	touch $@

install: $(VENV)/.build

# npm ci installs exactly package-lock.json, after emptying node_modules (so the stamp goes too).
$(INTEROP)/node_modules/.deps: $(INTEROP)/package.json $(INTEROP)/package-lock.json
	$(NPM) ci --prefix $(INTEROP) --no-audit --no-fund
	touch $@

serve: install
	@echo "smith-fast: serving on unix:$(SOCK) and tcp:$(TCP) (Ctrl-C to stop)" >&2
	@echo "  try: $(VENV)/bin/smith-fast ping --connect unix:$(SOCK)" >&2
	$(VENV)/bin/smith-fast serve --unix $(SOCK) --tcp $(TCP)

test: install $(INTEROP)/node_modules/.deps
	$(VENV)/bin/pytest

bench-micro: install
	$(VENV)/bin/pytest bench --benchmark-only -p no:cacheprovider

proto: $(VENV)/.deps
	$(PY) proto/generate.py

clean:
	rm -rf build $(VENV) csrc/*.c smith_fast/*.so *.egg-info tests/interop/node_modules
