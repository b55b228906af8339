"""Comments beside class attributes, for fields documented by a comment rather than a `description`.

Many settings carry their explanation as a trailing `# comment` (`ttl_s: float = 3600.0  # ...`) or as
comment lines just above the field. `field_comments(cls)` reads the class's source and returns, per
attribute name, the trailing comment of its statement, else the comment block right above it.
"""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
from functools import cache


@cache
def field_comments(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not text.startswith(("fmt:", "type:", "noqa")):
                comments[tok.start[0]] = text
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    tree = ast.parse(source)
    klass = tree.body[0]
    assert isinstance(klass, ast.ClassDef)
    out: dict[str, str] = {}
    for node in klass.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        trailing = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
        if trailing:
            out[node.target.id] = " ".join(trailing)
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        if above:
            out[node.target.id] = " ".join(above)
    return out
