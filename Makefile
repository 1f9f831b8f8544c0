# The two commands of the README: `make demo` (the local demo) and `make test` (the tests).
# Both install what they need first (scripts/setup.sh is idempotent and fast when warm), then
# build the sdist and the wheel and install the wheel alone into a clean venv
# (scripts/wheel_check.py): the operator the demo and the cluster tests start is that install's
# (KVTUNE_OPERATOR_BIN), the artifact the operator image ships, not the editable checkout.
WHEEL_CHECK := $(CURDIR)/build/wheel-check
WHEEL_ENV := KVTUNE_WHEEL_DIR=$(WHEEL_CHECK)/dist KVTUNE_OPERATOR_BIN=$(WHEEL_CHECK)/venv/bin/kvtune
.PHONY: setup setup-python demo test test-fast lint bench crds knob-fields images

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/python scripts/wheel_check.py --out $(WHEEL_CHECK) --install-only
	$(WHEEL_ENV) .venv/bin/kvtune demo

# The tests run in TEST_WORKERS processes (pytest-xdist): the cluster tests mostly wait on a
# control plane (each worker starts its own), the planner tests on CPU. loadfile: a test file
# runs whole in one worker, in order, with its module fixtures set up once (docs/testing.md).
# The slowest files go first (tests/file_seconds.json; --no-loadscope-reorder keeps that order),
# so the two workers end together. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
FAST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The wheel check also imports every module and runs every command's --help from the install.
test: setup
	.venv/bin/python scripts/wheel_check.py --out $(WHEEL_CHECK)
	$(WHEEL_ENV) .venv/bin/python -m pytest $(PYTEST_PARALLEL)

# The fast loop while editing: no control plane, Prometheus, vLLM engine or image build, and
# no test marked slow (tests/conftest.py marks the first four by what they need). Python only.
test-fast: setup-python
	.venv/bin/python -m pytest -m "not slow" -n $(FAST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup-python
	.venv/bin/ruff check .
	scripts/mypy.sh

setup-python:
	scripts/setup.sh python

bench:
	.venv/bin/python bench/plan_bench.py && .venv/bin/python bench/simulate_bench.py

crds:
	.venv/bin/kvtune crds --write && charts/kvtune/hack/sync_crds.sh

# The knob fields of KVPlan, Pins, PinSpec, PlanStatus and RuntimeKnobs, from tuner/knobs.py
# (after a knob row changes; then `make crds`). tests/tuner/test_tuner_knob_fields.py checks.
knob-fields:
	.venv/bin/python scripts/gen_knob_fields.py

# The operator image and the runtime image's kvtune layer, built here (docs/images.md).
images: setup-python
	scripts/setup.sh packages
	.venv/bin/python -m kvtune.e2e.images
