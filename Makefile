# smith-fast: `make serve` and `make test` set everything up from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# `make serve`: a workspace of its own (never this repository: commands may write all of --root),
# the socket and state outside it; TCP only when asked for (TCP=127.0.0.1:7878), with a token.
WORKSPACE ?= $(HOME)/smith-fast-workspace
STATE     ?= $(HOME)/.local/state/smith-fast
SOCK      ?= $(STATE)/serve.sock
TCP       ?=
NPM    ?= npm
# tests/test_interop.py drives a session from Node.js (protobufjs) and tests/test_frontends.py runs
# Claude Code and the Codex CLI against serve --mcp: their npm packages (exact versions) live here.
INTEROP := tests/interop

.PHONY: serve test bench bench-quick bench-micro install clean proto

$(VENV)/.deps: requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip
	$(PIP) install -r requirements-dev.txt
	touch $@

# The modules compiled where they lie (smith_fast/_compat.py's COMPILED_IN_PLACE), as file names.
IN_PLACE := $(patsubst %,%.py,$(subst .,/,$(shell sed -n 's/^ *"\(smith_fast\.[a-z0-9_.]*\)",$$/\1/p' smith_fast/_compat.py)))

# --no-build-isolation: build with the Cython pinned in requirements-dev.txt, already in the venv.
$(VENV)/.build: $(VENV)/.deps setup.py smith_fast/_compat.py $(IN_PLACE) $(wildcard $(IN_PLACE:.py=.pxd)) $(wildcard csrc/sandbox_exec.c csrc/sandbox_spawn.c csrc/*.h csrc/*.pyx csrc/*.pxd csrc/*_c.py smith_fast/*_py.py)
	$(PIP) install --no-build-isolation -e .
	touch $@

install: $(VENV)/.build

# npm ci installs exactly package-lock.json, after emptying node_modules (so the stamp goes too);
# Claude Code's postinstall links its native binary (package.json's allowScripts lets it run).
$(INTEROP)/node_modules/.deps: $(INTEROP)/package.json $(INTEROP)/package-lock.json
	$(NPM) ci --prefix $(INTEROP) --no-audit --no-fund
	touch $@

# The Unix socket is made 0600 (only this user connects). A TCP port is open to every local
# account, so TCP=HOST:PORT serves it with a token: $SMITH_TOKEN, else one generated and printed.
serve: install
	@mkdir -p "$(WORKSPACE)" && mkdir -p -m 700 "$(STATE)"
	@echo "smith-fast: workspace $(WORKSPACE), serving on unix:$(SOCK)$(if $(TCP), and tcp:$(TCP)) (Ctrl-C to stop)" >&2
	@echo "  MCP clients (README, \"MCP clients\") spawn their own: command $(abspath $(VENV))/bin/smith-fast, args serve --mcp --root $(WORKSPACE)" >&2
ifeq ($(strip $(TCP)),)
	@echo "  try: $(VENV)/bin/smith-fast exec --connect unix:$(SOCK) 'uname -a'" >&2
	$(VENV)/bin/smith-fast serve --root "$(WORKSPACE)" --state-dir "$(STATE)" --unix "$(SOCK)"
else
	@SMITH_TOKEN="$${SMITH_TOKEN:-$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(24))')}"; export SMITH_TOKEN; \
	  echo "  token (both listeners): SMITH_TOKEN=$$SMITH_TOKEN" >&2; \
	  echo "  try: SMITH_TOKEN=$$SMITH_TOKEN $(VENV)/bin/smith-fast exec --connect tcp:$(TCP) 'uname -a'" >&2; \
	  exec $(VENV)/bin/smith-fast serve --root "$(WORKSPACE)" --state-dir "$(STATE)" --unix "$(SOCK)" --tcp "$(TCP)"
endif

# Tools the tests run that a bare machine may lack (tests/test_tool_home.py builds a Go module inside
# the sandbox; tests/test_sandbox_zygote.py watches a zygote's init with strace): Debian's packages,
# installed once when missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
build/.system-tools:
	command -v go >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq golang-go; }
	command -v go >/dev/null 2>&1 || { echo "make test: go is needed (Debian: apt-get install golang-go)" >&2; exit 1; }
	command -v socat >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq socat; }
	command -v strace >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq strace; }
	mkdir -p build && touch $@

test: install $(INTEROP)/node_modules/.deps build/.system-tools
	$(VENV)/bin/pytest

# The end-to-end report (bench/report, run from the repository root, not installed): real servers,
# every contender, Markdown + JSON + PNG charts. `make bench` writes bench/results/ (a few minutes on
# 2 cores); `make bench-quick` build/bench-quick/ (about 3 minutes on a loaded 2-core machine once
# installed: 3 longer repetitions; a fresh clone's first run adds ~35 s of install).
bench: install
	$(PY) -m bench.report --out bench/results

bench-quick: install
	$(PY) -m bench.report --quick --out build/bench-quick

# The micro view: the pytest-benchmark suites under bench/, twins and wires side by side.
bench-micro: install
	$(VENV)/bin/pytest bench --benchmark-only -p no:cacheprovider

proto: $(VENV)/.deps
	$(PY) proto/generate.py

clean:
	rm -rf build $(VENV) $(patsubst %.pyx,%.c,$(wildcard csrc/*.pyx)) $(patsubst %.py,%.c,$(wildcard csrc/*_c.py)) smith_fast/*.so $(IN_PLACE:.py=.c) $(wildcard $(IN_PLACE:.py=.cpython-*.so)) *.egg-info tests/interop/node_modules

# Coverage-guided fuzzing (fuzz/README.md): every harness for FUZZ_TIME seconds, one after another,
# from the committed corpus; what they find is written to build/fuzz/ (reproducers: *-crash-*).
FUZZ_TIME    ?= 600
FUZZ_TARGETS ?= framing chunking jsonl envelope events plan v0fields
.PHONY: fuzz
fuzz: install
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build/fuzz/$$t; \
	  echo "fuzz_$$t: $(FUZZ_TIME) s" >&2; \
	  $(PY) -m fuzz.fuzz_$$t -max_total_time=$(FUZZ_TIME) -rss_limit_mb=1024 -timeout=30 -print_final_stats=1 \
	    -artifact_prefix=build/fuzz/$$t- build/fuzz/$$t fuzz/corpus/$$t || exit 1; \
	done

# The soak of tests/test_reliability.py, longer than in `make test` (60 s): SOAK_SESSIONS concurrent
# sessions for SOAK_TIME seconds; its figures go to build/soak.json (RELIABILITY.md).
SOAK_TIME     ?= 600
SOAK_SESSIONS ?= 100
.PHONY: soak
soak: install
	@mkdir -p build
	SMITH_SOAK_SECONDS=$(SOAK_TIME) SMITH_SOAK_SESSIONS=$(SOAK_SESSIONS) SMITH_SOAK_REPORT=build/soak.json \
	  $(VENV)/bin/pytest tests/test_reliability.py -k test_soak -s -p no:cacheprovider --timeout 0
	@cat build/soak.json
