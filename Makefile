# The README's two commands: `make up` (the local stack) and `make test` (the whole suite).
.PHONY: up test install lint bench clean docs docs-ref docs-serve

install:
	scripts/install

up: install
	.venv/bin/fleetgate up $(ARGS)

test:
	scripts/test $(ARGS)

lint: install
	.venv/bin/ruff check . && .venv/bin/python scripts/static_checks.py

clean:
	rm -rf build dist site .pytest_cache .mypy_cache .ruff_cache

# The documentation site (docs/, mkdocs.yml): references regenerated from the code, then a strict build.
docs-ref: install
	PYTHONSAFEPATH=1 .venv/bin/python -m fleetgate.docsgen

docs: docs-ref
	PYTHONSAFEPATH=1 NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict

docs-serve: docs-ref
	PYTHONSAFEPATH=1 NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs serve --dev-addr 127.0.0.1:8000
