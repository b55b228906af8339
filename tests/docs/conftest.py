"""Shared by the documentation tests: the site built once per session, and the marked code blocks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
_MARKER = re.compile(r"^<!-- check: ([a-z-]+) -->\s*$")
_FENCE = re.compile(r"^(\s*)```")


@dataclass(frozen=True)
class Block:
    kind: str
    path: Path
    line: int  # 1-based line of the marker
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def marked_blocks(path: Path) -> list[Block]:
    """Fenced blocks preceded by `<!-- check: KIND -->` (an error when no fence follows the marker)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    out = []
    for i, line in enumerate(lines):
        match = _MARKER.match(line.strip())
        if not match:
            continue
        j = i + 1
        if j >= len(lines) or not _FENCE.match(lines[j]):
            raise AssertionError(f"{name}:{i + 1}: a check marker must precede a ``` block")
        indent = len(_FENCE.match(lines[j]).group(1))  # type: ignore[union-attr]
        body = []
        for k in range(j + 1, len(lines)):
            if lines[k].strip().startswith("```"):
                break
            body.append(lines[k][indent:])
        else:
            raise AssertionError(f"{name}:{j + 1}: unterminated code block")
        out.append(Block(kind=match.group(1), path=path, line=i + 1, text="\n".join(body) + "\n"))
    return out


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def all_blocks() -> list[Block]:
    return [b for p in doc_files() for b in marked_blocks(p)]


def mkdocs(config: Path, site: Path, *, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONSAFEPATH": "1", "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The real site, built once in strict mode (the documentation test of `make test`)."""
    site = tmp_path_factory.mktemp("site")
    result = mkdocs(REPO / "mkdocs.yml", site)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    yield site
