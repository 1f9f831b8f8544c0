# The two commands of the README: `make demo` (the local demo) and `make test` (the tests).
# Both install what they need first (scripts/setup.sh is idempotent and fast when warm).
.PHONY: setup setup-python demo test lint bench crds images

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/kvtune demo

test: setup
	.venv/bin/python -m pytest

lint: setup-python
	.venv/bin/ruff check .
	scripts/mypy.sh

setup-python:
	scripts/setup.sh python

bench:
	.venv/bin/python bench/plan_bench.py && .venv/bin/python bench/simulate_bench.py

crds:
	.venv/bin/kvtune crds --write && charts/kvtune/hack/sync_crds.sh

# The operator image and the runtime image's kvtune layer, built here (docs/images.md).
images: setup-python
	scripts/setup.sh packages
	.venv/bin/python -m kvtune.e2e.images
