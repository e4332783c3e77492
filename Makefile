# gemini-opstate — the two commands a newcomer runs: `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Lambda's runtime (template.yaml: python3.13) and the development environment run one minor
# version. scripts/find-python.sh finds its interpreter (PATH, then pyenv's versions, then
# Debian's) or says in one sentence how to get one; PYTHON=/path/to/python3.13 overrides it.
# Searched once, on first use (not for `make help`).
LAMBDA_MINOR := 3.13
PYTHON ?= $(eval PYTHON := $(shell scripts/find-python.sh $(LAMBDA_MINOR)))$(PYTHON)
# aws-sam-cli and cfn-lint run on any interpreter they support (the machine's python3).
TOOLS_PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEPS := pyproject.toml layers/opstate/requirements.txt functions/reconcile/requirements.txt \
	functions/archiver/requirements.txt
# Python writes its bytecode caches (__pycache__, git-ignored) for what these targets run,
# even where the environment says PYTHONDONTWRITEBYTECODE (this project's machines do): with
# it, every process compiled opstate from source again, and pytest re-wrote the asserts of
# every test module in each worker and in each pytest it starts (issue 49: collecting the suite
# 13.5 CPU s the first time, 5.4 once the caches exist).
unexport PYTHONDONTWRITEBYTECODE
# --no-compile: pip byte-compiles every module it installs (moto's hundreds of services, sympy,
# ...), most of which nothing here imports; Python compiles what is imported, once, and keeps it
# (make writes bytecode caches: above). .venv's install: 48 -> 30 CPU s (issue 49).
PIP_FLAGS := --disable-pip-version-check --no-input --quiet --no-compile
# The project's own install shows pip's progress (what it collects, downloads and installs), so
# that a first `make run` / `make test` never looks hung.
PIP_PROGRESS_FLAGS := --disable-pip-version-check --no-input --no-compile
# Build/lint tools (aws-sam-cli, cfn-lint) live in their own virtualenv so that their pins never
# shape the runtime environment; the e2e tests' runtime interface client lives in another one
# that holds nothing else.
TOOLS_VENV := .tools-venv
TOOLS_STAMP := $(TOOLS_VENV)/.installed
RIE_VENV := .rie-venv
RIE_STAMP := $(RIE_VENV)/.installed
# Checkov has a virtualenv of its own: it pins boto3 1.35.x, aws-sam-cli needs 1.43.x
# (requirements-checkov.txt).
CHECKOV_VENV := .checkov-venv
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
CHECKOV := $(CHECKOV_VENV)/bin/checkov
SAM := SAM_CLI_TELEMETRY=0 $(TOOLS_VENV)/bin/sam
CFN_LINT := $(TOOLS_VENV)/bin/cfn-lint

.PHONY: help run test test-setup builds unit lint typecheck pytest venv bench bench-quick bench-check clean \
	tools rie-venv checkov-venv template-lint template-check build build-arm64 e2e dashboard mutate lambda-base-image \
	lambda-base-image-if-docker samlocal package fake-gemini collect

help:
	@echo "make run    - set up .venv if needed (the runtime only), then serve the app on http://127.0.0.1:3000"
	@echo "make test   - set up .venv (and .tools-venv, .rie-venv) if needed, then ruff, mypy,"
	@echo "              the template checks and sam build side by side, then the whole pytest"
	@echo "              suite (incl. e2e) on one worker more than the cores (PYTEST_WORKERS=0:"
	@echo "              in one process)"
	@echo "make unit   - the inner loop: the domain and unit tests only (tests/unit)"
	@echo "make fake-gemini - try opstate without a Gemini key: the tests' fake Gemini on"
	@echo "              127.0.0.1:8790 (prints the line to paste; README, Try it offline)"
	@echo "make bench  - benchmarks (not part of make test; cold start also in a Lambda-like container"
	@echo "              when Docker answers); make bench-quick for a short run"
	@echo "make bench-check - the AWS cost benchmark's quick day as a pytest (.ci/run runs it"
	@echo "              after make test)"
	@echo "make mutate - the mutation gate over the retry room's and the job queue's pure"
	@echo "              modules (not part of make test; slow: fails on a survivor not marked"
	@echo "              equivalent)"
	@echo "make template-check - sam validate --lint, cfn-lint (+ serverless rules) and checkov on template.yaml"
	@echo "              (make template-lint: the first two, as make test runs them)"
	@echo "make build  - sam build (cached, parallel) into .aws-sam/build"
	@echo "make package - without AWS credentials: the CLI's wheel and sdist in dist/, the built"
	@echo "              template with its code as zips in dist/sam/ (and the SAR variant)"
	@echo "make build-arm64 - the same for Architecture=arm64 into .aws-sam/arm64/build"
	@echo "make dashboard - regenerate template.yaml's dashboard and saved queries (scripts/)"
	@echo "make e2e    - the built functions through the Lambda runtime interface (no Docker)"
	@echo "make samlocal - sam local invoke / start-api on the build (needs Docker; part of make test)"
	@echo "make lambda-base-image - AWS's Lambda Python 3.13 image, or its offline stand-in"

# The environment: recreated when missing or built by another python, refreshed when the
# dependency files change.
$(STAMP): $(DEPS)
	@echo "make: installing $(VENV), the Python environment of opstate and its tests, from PyPI" \
		"(first time: every dependency is downloaded; pip's progress follows)"
	@if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(0 if "%d.%d" % sys.version_info[:2] == "$(LAMBDA_MINOR)" else 1)'; then \
		test -n "$(PYTHON)" || exit 1; \
		rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); \
	fi
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_PROGRESS_FLAGS) -c layers/opstate/requirements.txt \
		-c functions/reconcile/requirements.txt -c functions/archiver/requirements.txt \
		-e '.[dev]'
	@touch $(STAMP)
	@echo "make: $(VENV) is ready"

venv: $(STAMP)

# What `make run` needs: the runtime extra (`opstate serve`'s HTTP server, google-genai for the
# reconciler, archiver and retries) into the same .venv, with its own stamp; not the dev
# toolchain (`make test` / `make venv` add that). A .venv that already has the dev install is
# used as it is.
RUN_STAMP := $(VENV)/.installed-run
RUN_EXTRA := local,gemini
$(RUN_STAMP): $(DEPS)
	@echo "make: installing $(VENV) with what serving needs (.[$(RUN_EXTRA)], not the dev tools)" \
		"from PyPI (first time: every dependency is downloaded; pip's progress follows)"
	@if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(0 if "%d.%d" % sys.version_info[:2] == "$(LAMBDA_MINOR)" else 1)'; then \
		test -n "$(PYTHON)" || exit 1; \
		rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); \
	fi
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_PROGRESS_FLAGS) -c layers/opstate/requirements.txt \
		-c functions/reconcile/requirements.txt -c functions/archiver/requirements.txt \
		-e '.[$(RUN_EXTRA)]'
	@touch $(RUN_STAMP)
	@echo "make: $(VENV) is ready to serve"

# A virtualenv (1) is (re)created with interpreter (4) when missing or, given a minor version
# (5), built by another python; refreshed when its requirements (2) change. Its pip is brought
# up to date first, as .venv's is: the pip a venv starts with is the interpreter's bundled one
# (23.2 on Python 3.11 here), which spent 26 of the tools' 28 CPU s evaluating the ~90,000
# files listed on PyPI's pages of botocore and its kin; pip 26 installs them in 10 (issue 49).
define make_venv
	@if [ ! -x $(1)/bin/python ] || { [ -n "$(5)" ] && ! $(1)/bin/python -c 'import sys; sys.exit(0 if "%d.%d" % sys.version_info[:2] == "$(5)" else 1)'; }; then \
		test -n "$(4)" || exit 1; \
		rm -rf $(1) && $(4) -m venv $(1); \
	fi
	$(1)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(1)/bin/python -m pip install $(PIP_FLAGS) -r $(2)
	@touch $(3)
endef

$(TOOLS_STAMP): requirements-tools.txt
	$(call make_venv,$(TOOLS_VENV),requirements-tools.txt,$(TOOLS_STAMP),$(TOOLS_PYTHON),)

# The runtime interface client runs the built functions: on the runtime's minor version.
$(RIE_STAMP): requirements-rie.txt
	$(call make_venv,$(RIE_VENV),requirements-rie.txt,$(RIE_STAMP),$(PYTHON),$(LAMBDA_MINOR))

# Checkov, like the tools, runs on the machine's python3 (pip's byte-compiling cost 23 CPU s of
# its install's 52).
$(CHECKOV_STAMP): requirements-checkov.txt
	$(call make_venv,$(CHECKOV_VENV),requirements-checkov.txt,$(CHECKOV_STAMP),$(TOOLS_PYTHON),)

tools: $(TOOLS_STAMP)

rie-venv: $(RIE_STAMP)

checkov-venv: $(CHECKOV_STAMP)

# The linters of template.yaml; `make test` runs these before pytest.
template-lint: $(TOOLS_STAMP)
	$(SAM) validate --lint
	$(CFN_LINT) --append-rules cfn_lint_serverless.rules -- template.yaml

# Checkov: every finding is fixed or skipped in its resource's Metadata with a one-line reason
# (docs/deploy.md, "Security scan"); --skip-download: no call to Prisma Cloud's API.
template-check: template-lint $(CHECKOV_STAMP)
	$(CHECKOV) -f template.yaml --framework cloudformation --compact --quiet --skip-download

# The dashboard and the saved Logs Insights queries are generated from opstate's metric table.
dashboard: $(STAMP)
	$(PY) scripts/observability_block.py --write

# Always run: with --cached SAM itself rebuilds only what changed (about 8 s when nothing did).
# The functions' and the layer's Makefiles compile with $(LAMBDA_PYTHON) (found the same way
# when `sam build` is run directly).
build: $(TOOLS_STAMP)
	@test -n "$(PYTHON)" || exit 1
	LAMBDA_PYTHON=$(PYTHON) $(SAM) build --cached --parallel

# What a deploy or a publish needs, made without AWS credentials (README.md, "Use it without a
# clone"): dist/ gets the CLI's wheel and sdist (python -m build, with the build backend the dev
# extra installs: no throwaway environment per build); dist/sam/ the built template
# with each function's and the layer's code as a zip (scripts/package.py; `sam deploy` uploads
# them), template-sar.yaml (the variant the Serverless Application Repository accepts:
# scripts/sar_template.py; SOURCE_URL=https://... fills its placeholder URLs), LICENSE and
# README.md. Only `sam package` / `sam publish` / `sam deploy` need AWS.
package: $(STAMP) build
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	$(PY) scripts/package.py .aws-sam/build dist/sam
	$(PY) scripts/sar_template.py $(if $(SOURCE_URL),--source-url $(SOURCE_URL)) \
		dist/sam/template.yaml dist/sam/template-sar.yaml

# The same stack for arm64 (Architecture=arm64: the layer and the reconciler from their -arm64
# code directories, aarch64 wheels) in a build directory of its own; tests/e2e/
# test_architectures.py checks every shared object in it is aarch64.
ARM64_BUILD := .aws-sam/arm64/build
build-arm64: $(TOOLS_STAMP)
	@test -n "$(PYTHON)" || exit 1
	LAMBDA_PYTHON=$(PYTHON) $(SAM) build --cached --parallel --parameter-overrides Architecture=arm64 \
		--build-dir $(ARM64_BUILD) --cache-dir .aws-sam/arm64/cache

e2e: $(STAMP) build $(RIE_STAMP)
	$(PY) -m pytest -m e2e tests/e2e $(PYTEST_ARGS)

# The image `sam local` builds its containers on: AWS's when present or pullable, else an offline
# stand-in (Debian trixie + CPython 3.13 + awslambdaric), rebuilt only when its inputs change.
lambda-base-image:
	scripts/lambda-base-image.sh

# In `make test`: only where a Docker engine answers, and never fatal here (without the image
# the sam local tests skip - or fail under CI=true - with one line saying what is missing).
lambda-base-image-if-docker:
	@if command -v docker >/dev/null && docker info >/dev/null 2>&1; then \
		scripts/lambda-base-image.sh || echo "lambda-base-image failed: the sam local tests will say so"; \
	fi

samlocal: $(STAMP) build lambda-base-image
	$(PY) -m pytest -m samlocal tests/samlocal $(PYTEST_ARGS)

# The dev install (when present and current) holds the runtime extra too.
run: $(if $(wildcard $(STAMP)),$(STAMP),$(RUN_STAMP))
	@echo "make run: the opstate command is $(VENV)/bin/opstate; to type plain 'opstate' in another" \
		"shell, run 'source $(VENV)/bin/activate' there first"
	$(VENV)/bin/opstate serve $(SERVE_ARGS)

# Try it offline (README): the tests' fake Gemini, playing Gemini by itself; FAKE_GEMINI_ARGS
# e.g. --port N --finish-after SECONDS.
fake-gemini: $(if $(wildcard $(STAMP)),$(STAMP),$(RUN_STAMP))
	$(PY) -m tests.support.offline_gemini $(FAKE_GEMINI_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The package is checked as the oldest Python the CLI supports (pyproject: 3.12) and as the
# newest (3.14); the Lambda handlers, tests and scripts as pyproject says.
# The handlers in one run (--explicit-package-bases names each functions.<name>.app) with the
# package's options, so that run and the last reuse the first one's cache of opstate.
# mypy's cache is also kept in MYPY_SHARED_CACHE (beside pip's cache) and seeds a checkout
# that has none: a fresh clone's four mypy runs took 35 CPU s cold, 2 warm (issue 49).
# MYPY_SHARED_CACHE= turns it off; mypy itself re-checks whatever changed.
MYPY_SHARED_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gemini-opstate/mypy
typecheck: $(STAMP)
	@scripts/mypy-cache.sh seed "$(MYPY_SHARED_CACHE)"
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --python-version 3.14
	$(VENV)/bin/mypy --strict --explicit-package-bases functions/*/app.py
	$(VENV)/bin/mypy --strict tests/support tests/e2e tests/samlocal benchmarks scripts
	@scripts/mypy-cache.sh keep "$(MYPY_SHARED_CACHE)"

# pytest on every core (pytest-xdist; a module's tests on one worker, so that what they share -
# a server, a built wheel, a browser - is made once; the slowest modules first: tests/conftest.py).
# --no-loadscope-reorder: xdist would otherwise send the modules with the most tests first, not
# the slowest. PYTEST_WORKERS=0: one process, as before; PYTEST_WORKERS=4: four workers.
# One worker more than the cores: the tests wait on subprocesses, Docker and servers often
# enough that a third worker on two cores filled them (a fresh clone's pytest: 523 s on two
# workers, 467 s on three, one run each, issue 49).
PYTEST_WORKERS ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1); echo $$((n + 1)))
PYTEST_XDIST := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
# The benchmark checks (marker bench: the AWS cost benchmark's quick day) are left to
# `make bench-check`, which .ci/run runs after make test.
# The run's temporary files (pytest's tmp_path, and TMPDIR for what the tests start) go to a
# directory of their own under PYTEST_TMP_ROOT (scripts/test-tmp-root.sh: a RAM disk when there
# is one with room), removed after a run that passed and kept (its path printed) after one that
# did not.
PYTEST_TMP_ROOT ?= $(shell scripts/test-tmp-root.sh)
pytest: $(STAMP)
	@run=$$(mktemp -d "$(PYTEST_TMP_ROOT)/opstate-pytest.XXXXXX") || exit 1; status=0; \
	echo "make: pytest's temporary files in $$run"; \
	TMPDIR="$$run" $(PY) -m pytest $(if $(filter 0,$(PYTEST_WORKERS)),,$(PYTEST_XDIST)) \
		--basetemp="$$run/basetemp" -m "not bench" $(PYTEST_ARGS) || status=$$?; \
	if [ $$status = 0 ]; then rm -rf "$$run"; else echo "make: kept $$run (pytest exited $$status)"; fi; \
	exit $$status

# The inner loop: tests/unit (the domain and the modules around it; no servers, no AWS, no
# build). A unit test marked `slow` leaves this loop; `make test` still runs it.
unit: $(STAMP)
	$(PY) -m pytest tests/unit -q -m "not slow" $(PYTEST_ARGS)

# The checks and the builds come first, side by side (make -j: the environments install, the
# linters and the two builds run while the others wait on pip or Docker), then pytest: its e2e
# and sam local tests run the build. TEST_JOBS=1 runs them one after another.
# The two sam builds run side by side: each has its own folder under .aws-sam (sam keeps its
# build.toml in the build folder's parent, so the arm64 build lives in .aws-sam/arm64/).
# Checkov is not run here: tests/e2e/test_template_scan.py runs the same scan and holds more
# (nothing failed, something passed and something skipped), so only its virtualenv is made.
TEST_JOBS ?= 4
test-setup: lint typecheck template-lint checkov-venv builds rie-venv lambda-base-image-if-docker \
	collect

# pytest's collection once, beside the checks: it writes the test modules' rewritten bytecode
# (and opstate's), which both workers then read: about 5 CPU s each to collect, not 14.
collect: $(STAMP)
	@echo "$(PY) -m pytest --collect-only -q -p no:cacheprovider"; \
	out=$$($(PY) -m pytest --collect-only -q -p no:cacheprovider 2>&1) || { \
		printf '%s\n' "$$out" | grep -v '::'; exit 1; }

builds: build build-arm64

test:
	$(MAKE) --no-print-directory -j$(TEST_JOBS) test-setup
	$(MAKE) --no-print-directory pytest

bench: $(STAMP) build lambda-base-image-if-docker
	$(PY) benchmarks/run.py

bench-quick: $(STAMP) build lambda-base-image-if-docker
	$(PY) benchmarks/run.py --quick

# The benchmarks that must keep running (issue 48: a change that breaks the AWS cost
# benchmark fails the build): the pytest marked bench. .ci/run runs it after make test.
bench-check: $(STAMP)
	$(PY) -m pytest -m bench tests/integration/test_bench_aws_cost_quick.py $(PYTEST_ARGS)

# Mutation testing (tools/mutate.py): every mutant of the gated modules (its GATED: domain.retry,
# domain.refusals, retry.rules, retry.final, domain.parts, retry.jobs) against their
# tests, those marked '# mutant: equivalent — why' skipped; exits 1 and lists the survivors if
# any. MUTATE_ARGS e.g. --module names, --all (every module it knows), --marked.
mutate: $(STAMP)
	$(PY) tools/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS_VENV) $(RIE_VENV) $(CHECKOV_VENV) .mypy_cache .pytest_cache .ruff_cache .aws-sam \
		dist
