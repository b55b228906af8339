"""The documentation site builds in strict mode, fails on a broken link or a stale reference, works
offline, and a new user reaches the common tasks within two clicks; the README is short and its links hold."""

from __future__ import annotations

import functools
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
from markdown.extensions.toc import slugify

from .conftest import REPO, mkdocs

pytestmark = pytest.mark.slow


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "a" and a.get("href"):
            self.links.append(str(a["href"]))
        for key in ("src", "href"):
            value = a.get(key) or ""
            if tag in ("link", "script", "img") and value.startswith(("http://", "https://", "//")):
                self.external.append(value)


@functools.cache
def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_the_site_builds_strictly_and_loads_nothing_from_the_network(built_site: Path) -> None:
    pages = list(built_site.rglob("*.html"))
    assert len(pages) > 30
    assert (built_site / "reference" / "inferenceservice.html").is_file()
    for page in pages:
        assert not _parse(page).external, f"{page.name} loads {_parse(page).external}"


def test_common_tasks_are_within_two_clicks_of_the_home_page(built_site: Path) -> None:
    wanted = {"create-a-tenant-key", "set-a-budget", "read-statuscapacityplan"}
    found: set[str] = set()
    frontier = [("index.html", 0)]
    seen = set()
    while frontier:
        rel, clicks = frontier.pop(0)
        if rel in seen:
            continue
        seen.add(rel)
        page = _parse(built_site / rel)
        for href in page.links:
            url = urlparse(urljoin(rel, href))
            if url.scheme or not url.path.endswith(".html"):
                continue
            target = _parse(built_site / url.path)
            if url.fragment in wanted and url.fragment in target.ids:
                found.add(url.fragment)
            if clicks + 1 < 2:
                frontier.append((url.path, clicks + 1))
    assert found == wanted


def _mini_site(tmp_path: Path, pages: dict[str, str]) -> Path:
    """A small site with the real mkdocs.yml settings and hooks, and the given pages."""
    config = (REPO / "mkdocs.yml").read_text().split("\nnav:\n")[0]
    config = config.replace("fleetgate/docsgen/mkdocs_hooks.py", str(REPO / "fleetgate/docsgen/mkdocs_hooks.py"))
    nav = "\nnav:\n  - Home: index.md\n  - Guides:\n      - A: guides/a.md\n  - Reports:\n      - reports/index.md\n"
    (tmp_path / "mkdocs.yml").write_text(config + nav)
    for name, text in {"reports/index.md": "# Reports\n\n<!-- reports-table -->\n", **pages}.items():
        (tmp_path / "docs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "docs" / name).write_text(text)
    return tmp_path / "mkdocs.yml"


GOOD = {"index.md": "# Home\n\n[a](guides/a.md#first)\n", "guides/a.md": "# A\n\n## First\n"}
REPORT = "---\ndate: 2026-11-27\nmachine: a box\ncommand: fleetgate bench cost\n---\n\n# A report\n\nFigures.\n"


def test_a_new_guide_and_report_join_the_nav_and_the_reports_table(tmp_path: Path) -> None:
    config = _mini_site(tmp_path, {**GOOD, "guides/b.md": "# New guide\n", "reports/r.md": REPORT})
    result = mkdocs(config, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "New guide" in home and "A report" in home  # in the nav of every page
    index = (tmp_path / "site" / "reports" / "index.html").read_text()
    assert 'href="r.html"' in index and "2026-11-27" in index
    report = re.sub(r"<[^>]+>", "", (tmp_path / "site" / "reports" / "r.html").read_text())
    assert "Measured 2026-11-27 on a box" in report and "fleetgate bench cost" in report


def test_the_strict_build_fails_on_each_broken_thing(tmp_path: Path) -> None:
    """One build with four problems: strict mode reports every warning before it aborts."""
    pages = {**GOOD, "index.md": "# Home\n\n[a](guides/missing.md) [b](guides/a.md#no-such-heading)\n",
             "reports/r.md": "# A report without its date\n",
             "reference/cli.md": "# Command line\n\nan old copy\n"}
    result = mkdocs(_mini_site(tmp_path, pages), tmp_path / "site")
    assert result.returncode != 0
    for message in ("guides/missing.md", "no-such-heading", "date, machine and command",
                    "docs/reference/cli.md is stale"):
        assert message in result.stderr, (message, result.stderr[-3000:])


README = REPO / "README.md"


def test_the_readme_is_short_and_keeps_its_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "make up " in text and "make test " in text
    assert "make test" in (REPO / ".ci" / "run").read_text()


def _anchors(markdown: str) -> set[str]:
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_links_reach_existing_pages_and_headings() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not link.startswith(("http://", "https://", "#"))]
    assert len(local) > 20
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.is_file(), f"README links to missing {path}"
        if anchor:
            assert anchor in _anchors(target.read_text()), f"README links to missing heading {link}"


def test_the_heading_ids_the_readme_relies_on_match_mkdocs(built_site: Path) -> None:
    ids = _parse(built_site / "guides" / "capacity-plan.html").ids
    assert "read-statuscapacityplan" in ids and "read-statuscapacityplan" in _anchors(
        (REPO / "docs" / "guides" / "capacity-plan.md").read_text())
