"""What the documentation build adds to the hand-written pages, kept free of MkDocs so it is unit-testable.

- `extend_nav`: a page under `docs/guides/` or `docs/reports/` that the nav in mkdocs.yml does not list is
  appended to the nav section holding that folder's pages, titled by its first heading; so a new guide or
  report slots in without a mkdocs.yml edit (list it there to choose its place).
- `report_meta` / `report_banner`: every report page states when, where and how it was measured, in its
  front matter (`date`, `machine`, `command`); the build puts them in a box under the title and into the
  reports index (`reports_table`), and a report that lacks one is an error of the strict build.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPORT_KEYS = ("date", "machine", "command")
REPORTS_TABLE = "<!-- reports-table -->"
_FRONT = re.compile(r"\A---\n(.*?)\n---\n", re.S)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def title_of(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip().strip("`")
    return path.stem.replace("-", " ").capitalize()


def _listed(nav: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(nav, str):
        out.add(nav)
    elif isinstance(nav, list):
        for item in nav:
            out |= _listed(item)
    elif isinstance(nav, dict):
        for v in nav.values():
            out |= _listed(v)
    return out


def _section_for(nav: list[Any], folder: str) -> list[Any] | None:
    """The nav list whose entries are pages of `folder` (the first found, depth first)."""
    for item in nav:
        if isinstance(item, dict):
            for v in item.values():
                if isinstance(v, list):
                    if any(isinstance(e, dict) and any(str(p).startswith(f"{folder}/") for p in e.values())
                           for e in v) or any(isinstance(e, str) and e.startswith(f"{folder}/") for e in v):
                        return v
                    found = _section_for(v, folder)
                    if found is not None:
                        return found
    return None


def extend_nav(nav: list[Any], docs_dir: Path, folders: tuple[str, ...] = ("guides", "reports")) -> list[str]:
    """Append unlisted pages of `folders` to their nav sections, in place; returns the pages added."""
    listed = _listed(nav)
    added = []
    for folder in folders:
        section = _section_for(nav, folder)
        if section is None:
            continue
        for path in sorted((docs_dir / folder).glob("*.md")):
            rel = f"{folder}/{path.name}"
            if rel not in listed:
                section.append({title_of(path): rel})
                added.append(rel)
    return added


@dataclass(frozen=True)
class Report:
    path: str  # relative to docs/
    title: str
    date: str
    machine: str
    command: str


def front_matter(text: str) -> dict[str, Any]:
    match = _FRONT.match(text)
    if not match:
        return {}
    data = yaml.safe_load(match.group(1))
    return data if isinstance(data, dict) else {}


def report_problems(meta: dict[str, Any]) -> list[str]:
    problems = [f"no `{k}` in its front matter" for k in REPORT_KEYS if not str(meta.get(k) or "").strip()]
    if meta.get("date") and not _DATE.match(str(meta["date"])):
        problems.append(f"date {meta['date']!r} is not YYYY-MM-DD")
    return problems


def report_banner(meta: dict[str, Any]) -> str:
    """An admonition under the title: when and where, then the command(s) that produced the figures."""
    commands = meta["command"] if isinstance(meta["command"], list) else [meta["command"]]
    body = "\n".join(f"    {line}" for c in commands for line in str(c).splitlines())
    return f'!!! info "Measured {meta["date"]} on {meta["machine"]}"\n\n    ```bash\n{body}\n    ```\n'


def reports(docs_dir: Path) -> list[Report]:
    out = []
    for path in sorted((docs_dir / "reports").glob("*.md")):
        if path.name == "index.md":
            continue
        meta = front_matter(path.read_text(encoding="utf-8"))
        command = meta.get("command", "")
        first = command[0] if isinstance(command, list) and command else str(command)
        out.append(Report(path=f"reports/{path.name}", title=title_of(path), date=str(meta.get("date", "")),
                          machine=str(meta.get("machine", "")), command=first))
    return sorted(out, key=lambda r: (r.date, r.title), reverse=True)


def reports_table(docs_dir: Path) -> str:
    rows = ["| Report | Date | Machine | Command |", "|---|---|---|---|"]
    for r in reports(docs_dir):
        command = r.command.replace("|", "&#124;")
        rows.append(f"| [{r.title}]({Path(r.path).name}) | {r.date} | {r.machine} | <code>{command}</code> |")
    return "\n".join(rows)
