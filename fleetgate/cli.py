"""The `fleetgate` command line.

Each subcommand lives in the module that owns the work and exposes two functions:
`add_arguments(parser)` and `run(args) -> int`. They are imported only when chosen, so
`fleetgate --help` stays fast and never loads torch, vLLM or Kopf.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fleetgate.core.errors import ConfigError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("fleetgate.local.up", "run the local stack: engines + gateway, no cluster needed"),
    "gateway": ("fleetgate.gateway.serve", "run the gateway alone from a config file"),
    "epp": ("fleetgate.gateway.epp.server", "serve the router as a Gateway API Endpoint Picker (Envoy ext_proc)"),
    "sim": ("fleetgate.sim.serve", "run simulated vLLM engines (OpenAI API + vLLM metrics)"),
    "prepare-model": ("fleetgate.local.model_prep", "turn the packaged Gemma 3 270M GGUF into a vLLM model dir"),
    "prepare-adapters": ("fleetgate.local.adapter_prep", "train the packaged LoRA adapters (pirate, signoff) on CPU"),
    "plan": ("fleetgate.operator.plan_cli", "capacity plan for an InferenceService spec file"),
    "crd": ("fleetgate.operator.crd_cli", "print the InferenceService CRD generated from the typed spec"),
    "operator": ("fleetgate.operator.run_cli", "run the Kubernetes operator"),
    "cache-eval": ("fleetgate.cache.eval_cli", "precision/recall of the response cache on labelled pairs"),
    "tier": ("fleetgate.router.tiers.cli", "train, calibrate and evaluate the tier router"),
    "bench": ("fleetgate.bench.cli", "benchmarks: gateway overhead, routing policies, cost report"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetgate", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args or args[0] in {"-h", "--help"} or args[0] not in COMMANDS:
        if args and args[0] not in {"-h", "--help"}:
            parser.print_usage(sys.stderr)
            print(f"fleetgate: unknown command {args[0]!r}", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    name, rest = args[0], args[1:]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(prog=f"fleetgate {name}", description=help_text)
    module.add_arguments(sub)
    parsed = sub.parse_args(rest)
    try:
        return int(module.run(parsed) or 0)
    except ConfigError as exc:
        print(f"fleetgate {name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
