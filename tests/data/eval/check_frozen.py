"""Validate the frozen cache test sets and print their counts (a checker, not a generator).

Usage (from the repository root):

    PYTHONSAFEPATH=1 .venv/bin/python tests/data/eval/check_frozen.py [--set NAME] [--dev DEV_DIR]

Checks every row of `cache_pairs.<set>.jsonl` and `cache_conversations.<set>.jsonl` (set `frozen`, the default,
ids `cp-frz-`/`cc-frz-`; `frozen2`, ids `cp-fz2-`/`cc-fz2-`; `frozen3`, ids `cp-fz3-`/`cc-fz3-`;
`frozen4`, ids `cp-fz4-`/`cc-fz4-`; `frozen5`, ids `cp-fz5-`/`cc-fz5-`; or `frozen6`, ids `cp-fz6-`/`cc-fz6-`)
against the schema of the shared README (keys, id format, kind/label consistency, message shape, the structural
rule of each conversation kind), that ids and pairs are unique, and, with `--dev`, that no prompt or message text equals
(case-insensitively) one in the dev files. Prints the count tables used in this folder's README.
Exits 1 on the first list of problems found.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRUE_KINDS = ("paraphrase", "typo", "register", "politeness", "imperative", "reorder")
FALSE_KINDS = (
    "entity",
    "negation",
    "number",
    "slot",
    "format",
    "scope",
    "language",
    "proglang",
    "comparative",
    "constraint",
    "date",
    "unrelated",
    "version",
    "unit",
    "direction",
)
DOMAINS = (
    "programming",
    "customer_support",
    "devops",
    "general_knowledge",
    "health_finance",
    "math",
    "writing",
)
# `frozen3` (issue 12, third round) was written with a wider list of domains; the older sets keep `DOMAINS`.
DOMAINS_V3 = (
    "coding",
    "math",
    "general_knowledge",
    "health_finance",
    "writing",
    "travel",
    "science",
    "devops",
    "cooking",
    "legal_admin",
    "shopping",
    "education",
)
CONV_KINDS = ("paraphrase", "context", "system", "followup")
PAIR_KEYS = {"id", "a", "b", "same", "kind", "domain"}
CONV_KEYS = {"id", "conv_a", "conv_b", "same", "kind"}
ROLES = {"system", "user", "assistant"}
# Each frozen set: its file-name suffix and the id prefixes of its pair and conversation rows.
SETS = {
    "frozen": ("cp-frz", "cc-frz"),
    "frozen2": ("cp-fz2", "cc-fz2"),
    "frozen3": ("cp-fz3", "cc-fz3"),
    "frozen4": ("cp-fz4", "cc-fz4"),
    "frozen5": ("cp-fz5", "cc-fz5"),
    "frozen6": ("cp-fz6", "cc-fz6"),
}
# The domains a set's pair rows may use, by pair id prefix; a prefix not listed uses `DOMAINS`.
PAIR_DOMAINS = {"cp-fz3": DOMAINS_V3}


def _load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _head_ok(*, row: dict[str, Any], keys: set[str], id_pattern: str, seen_ids: set[str], problems: list[str]) -> bool:
    """Record key and id problems of one row; False when its keys are wrong and nothing else can be checked."""
    rid = str(row.get("id"))
    if set(row) != keys:
        problems.append(f"{rid}: keys {sorted(row)}")
        return False
    if not re.fullmatch(id_pattern, rid) or rid in seen_ids:
        problems.append(f"{rid}: bad or duplicate id")
    seen_ids.add(rid)
    return True


def check_pairs(*, rows: list[dict[str, Any]], id_prefix: str = "cp-frz") -> list[str]:
    """Schema and uniqueness problems in the cache pair rows."""
    problems: list[str] = []
    seen_ids: set[str] = set()
    seen_pairs: set[tuple[str, str]] = set()
    domains = PAIR_DOMAINS.get(id_prefix, DOMAINS)
    for row in rows:
        rid = str(row.get("id"))
        id_pattern = re.escape(id_prefix) + r"-\d{4}"
        if not _head_ok(row=row, keys=PAIR_KEYS, id_pattern=id_pattern, seen_ids=seen_ids, problems=problems):
            continue
        a, b = row["a"], row["b"]
        if not (isinstance(a, str) and isinstance(b, str) and a.strip() and b.strip()):
            problems.append(f"{rid}: empty or non-string prompt")
            continue
        key = tuple(sorted((a.strip().lower(), b.strip().lower())))
        if key[0] == key[1] or key in seen_pairs:
            problems.append(f"{rid}: identical sides or duplicate pair")
        seen_pairs.add((key[0], key[1]))
        if row["kind"] not in TRUE_KINDS + FALSE_KINDS:
            problems.append(f"{rid}: unknown kind {row['kind']}")
        elif row["same"] is not (row["kind"] in TRUE_KINDS):
            problems.append(f"{rid}: same={row['same']} contradicts kind {row['kind']}")
        if row["domain"] not in domains:
            problems.append(f"{rid}: unknown domain {row['domain']}")
    return problems


def _messages_ok(conv: Any) -> bool:
    return (
        isinstance(conv, list)
        and len(conv) > 0
        and all(
            isinstance(m, dict)
            and set(m) == {"role", "content"}
            and m["role"] in ROLES
            and isinstance(m["content"], str)
            and m["content"].strip()
            for m in conv
        )
        and conv[-1]["role"] == "user"
    )


def check_conversations(*, rows: list[dict[str, Any]], id_prefix: str = "cc-frz") -> list[str]:
    """Schema problems, and rows whose turns do not have the shape their kind promises."""
    problems: list[str] = []
    seen_ids: set[str] = set()
    for row in rows:
        rid = str(row.get("id"))
        id_pattern = re.escape(id_prefix) + r"-\d{3}"
        if not _head_ok(row=row, keys=CONV_KEYS, id_pattern=id_pattern, seen_ids=seen_ids, problems=problems):
            continue
        ca, cb, kind = row["conv_a"], row["conv_b"], row["kind"]
        if not (_messages_ok(ca) and _messages_ok(cb)):
            problems.append(f"{rid}: malformed messages")
            continue
        if kind not in CONV_KINDS or row["same"] is not (kind == "paraphrase"):
            problems.append(f"{rid}: kind {kind} with same={row['same']}")
            continue
        # The kinds are defined by which turns differ; check that the data matches its definition.
        if kind in ("paraphrase", "followup") and (ca[:-1] != cb[:-1] or ca[-1] == cb[-1]):
            problems.append(f"{rid}: {kind} must share the history and differ in the last turn")
        if kind == "context" and (ca[-1] != cb[-1] or ca[:-1] == cb[:-1]):
            problems.append(f"{rid}: context must share the last turn and differ earlier")
        if kind == "system" and (ca[0]["role"] != "system" or ca[0] == cb[0] or ca[1:] != cb[1:]):
            problems.append(f"{rid}: system must differ only in the system prompt")
    return problems


def dev_overlap(*, pairs: list[dict[str, Any]], convs: list[dict[str, Any]], dev_dir: Path) -> list[str]:
    """Frozen texts that equal (case-insensitively) a prompt or message of the dev files."""
    dev: set[str] = set()
    for row in _load(dev_dir / "cache_pairs.dev.jsonl"):
        dev.update((row["a"].strip().lower(), row["b"].strip().lower()))
    for row in _load(dev_dir / "cache_conversations.dev.jsonl"):
        dev.update(m["content"].strip().lower() for m in row["conv_a"] + row["conv_b"])
    texts = [(r["id"], t) for r in pairs for t in (r["a"], r["b"])]
    texts += [(r["id"], m["content"]) for r in convs for m in r["conv_a"] + r["conv_b"]]
    return [f"{rid}: also in dev: {t!r}" for rid, t in texts if t.strip().lower() in dev]


def _table(*, title: str, counts: Counter[str], order: tuple[str, ...]) -> str:
    lines = [f"| {title} | rows |", "|---|---:|"]
    lines += [f"| `{k}` | {counts[k]} |" for k in sorted(order, key=lambda k: (-counts[k], k))]
    return "\n".join(lines)


def report(*, pairs: list[dict[str, Any]], convs: list[dict[str, Any]], domains: tuple[str, ...] = DOMAINS) -> str:
    """The count tables, as Markdown."""
    n_true = sum(1 for r in pairs if r["same"])
    kinds = Counter(r["kind"] for r in pairs)
    parts = [
        f"Cache pairs: {len(pairs)} rows, {n_true} `same=true` ({100 * n_true / len(pairs):.0f}%), "
        f"{len(pairs) - n_true} `same=false`.",
        _table(title="kind (same=true)", counts=kinds, order=TRUE_KINDS),
        _table(title="kind (same=false)", counts=kinds, order=FALSE_KINDS),
        _table(title="domain", counts=Counter(r["domain"] for r in pairs), order=domains),
        f"Conversations: {len(convs)} rows, {sum(1 for r in convs if r['same'])} `same=true`.",
        _table(title="kind", counts=Counter(r["kind"] for r in convs), order=CONV_KINDS),
    ]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dev", type=Path, help="folder of the dev files, to check that no text is shared")
    parser.add_argument("--set", choices=sorted(SETS), default="frozen", help="which frozen set to check")
    args = parser.parse_args(argv)
    pair_prefix, conv_prefix = SETS[args.set]
    pairs = _load(HERE / f"cache_pairs.{args.set}.jsonl")
    convs = _load(HERE / f"cache_conversations.{args.set}.jsonl")
    problems = check_pairs(rows=pairs, id_prefix=pair_prefix) + check_conversations(rows=convs, id_prefix=conv_prefix)
    if args.dev is not None:
        problems += dev_overlap(pairs=pairs, convs=convs, dev_dir=args.dev)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(report(pairs=pairs, convs=convs, domains=PAIR_DOMAINS.get(pair_prefix, DOMAINS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
