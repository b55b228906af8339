"""The command-line reference: every `fleetgate` command, subcommand and option, from the argparse parsers.

Commands come from the CLI's lazy dispatch tables (`fleetgate.cli.COMMANDS`, and a command module's own
table such as `fleetgate.bench.cli.BENCHMARKS`); each module's `add_arguments` builds the parser exactly as
`fleetgate` does, and argparse subparsers (`fleetgate tier train`) are walked too. Defaults that depend on
the machine (the home directory, the working directory, the CPU count) are written as such, so the page is
the same wherever it is generated.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleetgate.docsgen.markdown import cell, code, table

DISPATCH_TABLES = ("COMMANDS", "BENCHMARKS")  # module attributes: {name: (module, one-line help)}
WIDTH = 100


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=WIDTH)


def _machine_free(text: str) -> str:
    home, cwd = str(Path.home()), os.getcwd()
    text = text.replace(cwd, ".") if cwd != "/" else text
    return text.replace(home, "~")


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return code("false" if isinstance(action, argparse._StoreTrueAction) else "true")
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == argparse.REMAINDER:
        return "—"
    if isinstance(default, (list, tuple)):
        default = " ".join(str(d) for d in default)
    if action.dest in ("workers", "threads", "cpus") and default == os.cpu_count():
        return "CPU count"
    return code(_machine_free(str(default)))


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%" in text:
        params: dict[str, Any] = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        params["prog"] = parser.prog
        with contextlib.suppress(KeyError, TypeError, ValueError):
            text = text % params
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        text += (" " if text else "") + "(one of " + ", ".join(code(str(c)) for c in action.choices) + ")"
    return cell(_machine_free(text)) or "—"


def _name(action: argparse.Action) -> str:
    if action.option_strings:
        flags = ", ".join(action.option_strings)
        if action.nargs != 0 and action.metavar is not None:
            flags += f" {action.metavar}"
        elif action.nargs != 0:
            flags += f" {action.dest.upper()}"
        return code(flags)
    return code(str(action.metavar or action.dest))


def _parser_section(parser: argparse.ArgumentParser, *, depth: int) -> list[str]:
    parser.formatter_class = _formatter
    parts = [f"{'#' * depth} `{parser.prog}`", ""]
    if parser.description:
        parts += [cell(parser.description), ""]
    parts += ["```text", _machine_free(parser.format_usage().strip()), "```", ""]
    rows = [(_name(a), _default(a), _help(a, parser)) for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS]
    if rows:
        parts += [table(("Argument", "Default", "Description"), rows), ""]
    for sub in parser._actions:
        if isinstance(sub, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in sub._choices_actions}
            for name, child in sub.choices.items():
                child.description = child.description or helps.get(name)
                parts += _parser_section(child, depth=depth + 1)
    return parts


def _commands(table_: dict[str, tuple[str, str]], prefix: str) -> Iterator[tuple[str, Any, str]]:
    for name, (module_name, help_text) in table_.items():
        yield f"{prefix} {name}", importlib.import_module(module_name), help_text


def _command_sections(prog: str, module: Any, help_text: str, *, depth: int) -> list[str]:
    nested = next((getattr(module, t) for t in DISPATCH_TABLES if isinstance(getattr(module, t, None), dict)), None)
    parser = argparse.ArgumentParser(prog=prog, description=help_text, formatter_class=_formatter)
    if nested is None or module.__name__ == "fleetgate.cli":
        module.add_arguments(parser)
        return _parser_section(parser, depth=depth)
    parts = [f"{'#' * depth} `{prog}`", "", cell(help_text), "",
             table(("Command", "What it does"), [(code(f"{prog} {n}"), cell(h)) for n, (_m, h) in nested.items()]), ""]
    for sub_prog, sub_module, sub_help in _commands(nested, prog):
        parts += _command_sections(sub_prog, sub_module, sub_help, depth=depth + 1)
    return parts


def render(banner: str) -> str:
    from fleetgate import cli

    parts = [banner, "", "# Command line", "",
             "Every `fleetgate` command and its options, generated from the parsers the CLI builds. Run "
             "`fleetgate COMMAND --help` for the same text in a terminal.", "",
             table(("Command", "What it does"),
                   [(code(f"fleetgate {n}"), cell(h)) for n, (_m, h) in cli.COMMANDS.items()]),
             ""]
    for prog, module, help_text in _commands(cli.COMMANDS, "fleetgate"):
        parts += _command_sections(prog, module, help_text, depth=2)
    return "\n".join(parts) + "\n"


def commands() -> list[str]:
    """Every documented command line prefix (`fleetgate bench cost`, `fleetgate tier train`, ...)."""
    return [line.split("`")[1] for line in render("").splitlines() if line.startswith("#") and "`" in line]
