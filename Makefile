# The README's two commands: `make up` (the local stack) and `make test` (the whole suite).
.PHONY: up test install lint bench clean

install:
	scripts/install

up: install
	.venv/bin/fleetgate up $(ARGS)

test:
	scripts/test $(ARGS)

lint: install
	.venv/bin/ruff check . && .venv/bin/python scripts/static_checks.py

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache
