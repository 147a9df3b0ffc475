# Two commands do all the set-up: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0
PROFILE ?= paper-machine-b
GPUS ?= 4
SSDS ?= 8
# pytest-xdist workers: one more than the cores this process may run on (CI's machine has 2). Many tests wait
# on what they start (torchrun agents, rendezvous timeouts, a browser, sockets), leaving a core idle; the extra
# worker fills it. The whole suite on 2 cores, clean clone, 2 -> 3 workers in two pairs: 359 -> 308 s and 391 -> 383 s
# (the cores 179-180% -> 189-191% busy); 4 workers took 334 s
JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))

.PHONY: run test test-fast venv install install-dev test-tools liburing lint bench clean

# uv installs what pip would, from PyPI and pip's find-links (where the local torch file lies), in parallel,
# and compiles no bytecode: Python writes it for what is imported (compiling all of torch's tree took 16 s
# of the set-up; the suite imports a fraction of it). `make test`'s set-up from a clean clone on 2 cores:
# 69 s with pip, 33 s with uv compiling everything and installing twice, 11-15 s with the venv's own ensurepip,
# 5.5-6.0 s now
UV_VERSION := 0.13.9
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell { $(PY) -m pip config get global.find-links || \
  $(BIN)/python -m pip config get global.find-links; } 2>/dev/null))
# pip comes in with the rest (uv installs it from its cache), not from the venv's own ensurepip, which took 4 s
INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS)) pip

$(BIN)/python:
	$(PY) -m venv --without-pip $(VENV)

# its own target: a .venv made before uv was used gets it too. The system's pip installs it into the venv
# (`--python`, pip 22.3 and newer); where that pip is missing or older, the venv's own pip does (the venv
# and uv: 6.6 -> 3.2 s)
$(BIN)/uv: | $(BIN)/python
	$(PY) -m pip --python $(BIN)/python install -q uv==$(UV_VERSION) 2>/dev/null || \
	  { $(BIN)/python -m ensurepip >/dev/null && $(BIN)/python -m pip install -q uv==$(UV_VERSION); }

$(VENV)/.installed: $(BIN)/uv pyproject.toml | liburing
	$(INSTALL) -e .
	touch $@

# The io_uring read engine is compiled only where liburing's headers are (else a thread pool reads, at
# a lower 4 KiB IOPS). Installed here when missing and we are root with apt (CI is); anyone else is told.
liburing:
	@if [ -e /usr/include/liburing.h ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "make: installing liburing-dev from Debian for the io_uring read engine"; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
	    liburing-dev >/dev/null || echo "make: could not install liburing-dev: reads use the thread-pool engine"; \
	else echo "make: no liburing headers and not root: reads use the thread-pool engine" \
	  "(as root: apt-get install liburing-dev, then pip install -e . again)"; fi

# one resolve for all `make test` needs, the plain install's packages with them (so it is done too)
$(VENV)/.installed-dev: $(BIN)/uv pyproject.toml | liburing
	$(INSTALL) -e '.[dev,train,serve,parquet]' $(TORCH_PIN)
	touch $(VENV)/.installed $@

venv: $(VENV)/.installed
install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: $(VENV)/.installed
	$(BIN)/moment plan --profile $(PROFILE) --gpus $(GPUS) --ssds $(SSDS)

# Debian packages the suite drives: Chromium and its chromedriver (the planning page's browser test,
# tests/test_web_page.py) and fio (the I/O trace's replay and the bench's disk limit). Installed here when
# missing and we are root (CI is); anyone else gets the tests that need them skipped with the reason, except
# under CI=true, where a browser that cannot start fails the browser test. COMMAND:PACKAGE pairs.
TEST_TOOLS := chromium:chromium chromedriver:chromium-driver fio:fio
test-tools:
	@need=""; for t in $(TEST_TOOLS); do command -v $${t%%:*} >/dev/null || need="$$need $${t#*:}"; done; \
	if [ -z "$$need" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "make: installing$$need from Debian for the tests that drive them"; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
	    $$need >/dev/null || echo "make: could not install$$need: the tests that need them cannot run"; \
	else echo "make: missing$$need and not root: the tests that need them will be skipped (the browser test" \
	  "fails under CI=true) (as root: apt-get install$$need)"; fi

# every test, on JOBS cores (pytest-xdist; `python -m pytest` alone still runs them all in one process).
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: the suite starts Python hundreds of times
# (CLI runs, torchrun ranks, one collection per worker), and compiling Moment and re-writing the tests'
# asserts each time cost half of each collection (8.5 -> 3.8 CPU-s). It lists the 15 slowest tests and the 15
# costliest in CPU (tests/conftest.py): on two cores the suite is CPU-bound, so the second list is what to cut
TEST_ENV := PYTHONDONTWRITEBYTECODE=
test: $(VENV)/.installed-dev test-tools
	$(TEST_ENV) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal --durations=15 --cpu-costliest=15

# the edit loop: every test but those marked slow (torchrun launches, the README, the browser, exhaustive
# searches), in under a minute; `make test` runs them all
test-fast: $(VENV)/.installed-dev
	$(TEST_ENV) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -m "not slow"

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check moment tests bench tools

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/plan_time.py
	$(BIN)/python bench/maxflow_backends.py

clean:
	rm -rf $(VENV) build *.egg-info
