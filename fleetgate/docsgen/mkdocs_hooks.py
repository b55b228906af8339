"""MkDocs hooks (mkdocs.yml `hooks:`): generated references, the nav for new pages, report metadata.

- Reference pages listed in `pages.PAGES` are rendered from the code at build time; a committed copy that
  differs is reported (a warning: the strict build fails, naming `make docs-ref`).
- Guides and reports that mkdocs.yml's nav does not list are added to their section (`site.extend_nav`).
- Report pages must carry `date`, `machine` and `command` front matter; the build shows them in a box under
  the title, and `<!-- reports-table -->` in the reports index becomes the table of every report.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fleetgate.docsgen import pages, site

log = logging.getLogger("mkdocs.plugins.fleetgate")


def on_config(config: Any) -> Any:
    docs_dir = Path(config["docs_dir"])
    for rel in site.extend_nav(config["nav"], docs_dir):
        log.info("nav: added %s (list it in mkdocs.yml to choose its place)", rel)
    return config


def on_page_read_source(page: Any, config: Any) -> str | None:
    src = page.file.src_uri
    if not src.startswith("reference/") or src.split("/", 1)[1] not in pages.PAGES:
        return None
    name = src.split("/", 1)[1]
    text = pages.generate(name)
    committed = Path(config["docs_dir"]) / src
    if not committed.is_file() or committed.read_text(encoding="utf-8") != text:
        log.warning("docs/%s is stale: run `make docs-ref` (python -m fleetgate.docsgen) and commit it", src)
    return text


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    docs_dir = Path(config["docs_dir"])
    if src == "reports/index.md":
        return markdown.replace(site.REPORTS_TABLE, site.reports_table(docs_dir))
    if src.startswith("reports/") and src.endswith(".md"):
        problems = site.report_problems(page.meta)
        if problems:
            log.warning("docs/%s: a report states its date, machine and command: %s", src, "; ".join(problems))
            return markdown
        head, _sep, rest = markdown.partition("\n")
        if head.startswith("# "):
            return f"{head}\n\n{site.report_banner(page.meta)}\n{rest}"
        return f"{site.report_banner(page.meta)}\n{markdown}"
    return markdown
