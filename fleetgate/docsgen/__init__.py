"""The documentation site's generated reference pages, built from the code they describe.

Each page under `docs/reference/` that carries the generated banner is rendered here from the code at
documentation build time (`mkdocs_hooks.py`) and committed for reading in a repository browser; the
committed copy is checked against a fresh rendering by the test suite, so it can never drift:

- `inferenceservice.md`: the CRD's spec schema (the same pydantic models that produce the CRD) and status;
- `gateway-config.md`, `up-config.md`: every configuration key with its default, from the settings models;
- `cli.md`: every `fleetgate` command and option, from the argparse parsers;
- `metrics.md`: every Prometheus metric with its labels, from the metric constructors in the source;
- `helm-values.md`: every chart value, from `values.schema.json` and the comments of `values.yaml`.

`python -m fleetgate.docsgen` rewrites them; `--check` lists the stale ones and exits 1.
"""
