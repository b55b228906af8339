"""Configuration references: every key of a pydantic settings model, with type, default and description.

`sections(model)` walks the model: each nested model becomes a section (`server`, `server.scale_from_zero`,
`models[]` for a list of models, `tenancy.prices.<name>` for a mapping of them, one section per variant of
a union) whose rows are its scalar keys. A key's description is its `Field(description=...)`, else the
comment beside it in the source (`comments.field_comments`). A section whose absence means something
other than its keys' defaults (the gateway's `cache`, off when absent) says so.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from fleetgate.docsgen.comments import field_comments
from fleetgate.docsgen.markdown import cell, code, first_paragraph, table, value

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_CONSTRAINTS = (("gt", "> {}"), ("ge", ">= {}"), ("lt", "< {}"), ("le", "<= {}"), ("min_length", "length >= {}"),
                ("max_length", "length <= {}"), ("pattern", "matches {}"))


@dataclass
class Row:
    key: str
    type: str
    default: str
    description: str


@dataclass
class Section:
    path: str
    doc: str
    rows: list[Row] = field(default_factory=list)
    absent: str = ""  # what the section's absence means, when that differs from its keys' defaults


def _strip(annotation: Any) -> tuple[Any, bool]:
    """(annotation without `None` and `Annotated`, whether None is allowed)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            return _strip(args[0])[0], nullable
        return Union[tuple(args)], nullable  # noqa: UP007  (a runtime union of the remaining members)
    return annotation, False


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a (possibly union) annotation can hold, in order."""
    annotation, _ = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def type_name(annotation: Any) -> str:
    annotation, nullable = _strip(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        text = "one of " + ", ".join(code(str(a).lower() if isinstance(a, bool) else str(a)) for a in args)
    elif origin in (list, tuple, set, frozenset):
        text = f"list of {type_name(args[0])}" if args else "list"
    elif origin is dict:
        text = f"map of {type_name(args[1])}" if args else "map"
    elif origin in (Union, types.UnionType):
        text = " or ".join(type_name(a) for a in args)
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        text = "section"
    elif annotation in _SCALARS:
        text = _SCALARS[annotation]
    elif annotation is Any:
        text = "any"
    else:
        text = getattr(annotation, "__name__", str(annotation)).lower()
    return text + (" or null" if nullable else "")


def constraints(info: FieldInfo) -> list[str]:
    out: list[str] = []
    for meta in info.metadata:
        for attr, template in _CONSTRAINTS:
            bound = getattr(meta, attr, None)
            if bound is not None:
                out.append(template.format(code(str(bound)) if attr == "pattern" else bound))
    return out


def default_of(info: FieldInfo) -> Any:
    """The default value (a factory is called), or PydanticUndefined for a required key."""
    if info.default_factory is not None:
        return info.default_factory()  # type: ignore[call-arg]
    return info.default


def _key(name: str, info: FieldInfo) -> str:
    return info.alias or name


def _description(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    if info.description:
        return info.description
    for klass in model.__mro__:
        if isinstance(klass, type) and issubclass(klass, BaseModel) and name in field_comments(klass):
            return field_comments(klass)[name]
    return ""


def _default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    default = default_of(info)
    if default is None:
        return "unset (null)"
    if isinstance(default, BaseModel):
        return "—"
    if isinstance(default, list) and any(isinstance(v, BaseModel) for v in default):
        return "see below"
    return value(default)


def _sub_path(full: str, variant: type[BaseModel], nested: list[type[BaseModel]]) -> str:
    return full if len(nested) == 1 else f"{full} ({variant.__name__})"


def anchor(path: str) -> str:
    r"""The id MkDocs gives the heading `## \`path\`` (toc's slugify: word characters, spaces become -)."""
    kept = "".join(c for c in path.lower() if c.isalnum() or c in "-_ ")
    return "-".join(kept.split())


def sections(model: type[BaseModel], *, path: str = "", doc: str | None = None) -> list[Section]:
    """Every section of `model`, depth first, starting with its own (`path` "" is the file's top level)."""
    own = Section(path=path, doc=first_paragraph(doc if doc is not None else model.__doc__))
    out = [own]
    for name, info in model.model_fields.items():
        key = _key(name, info)
        full = f"{path}.{key}" if path else key
        nested = _models_in(info.annotation)
        annotation, _ = _strip(info.annotation)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if not nested and origin in (list, dict) and args:
            nested = _models_in(args[-1])
            if nested:
                full = f"{full}[]" if origin is list else f"{full}.<name>"
        description = _description(model, name, info)
        if nested:
            links = ", ".join(f"[{code(_sub_path(full, v, nested))}](#{anchor(_sub_path(full, v, nested))})"
                              for v in nested)
            description = f"{description.rstrip('.')}. See {links}." if description else f"See {links}."
        checks = constraints(info)
        if checks:
            description = f"{description} ({'; '.join(checks)})" if description else "; ".join(checks)
        own.rows.append(Row(key=full, type=type_name(info.annotation), default=_default_text(info),
                            description=description))
        for variant in nested:
            subs = sections(variant, path=_sub_path(full, variant, nested))
            default = default_of(info)
            if isinstance(default, BaseModel) and len(nested) == 1:
                differs = default.model_dump(mode="json", by_alias=True, exclude_defaults=True)
                if differs:
                    subs[0].absent = f"When `{full}` is absent: {value(differs)}."
            elif isinstance(default, list) and default and len(nested) == 1:
                dumped = [d.model_dump(mode="json", by_alias=True, exclude_defaults=True) for d in default]
                subs[0].absent = f"When the list is absent: {value(dumped)}."
            out.extend(subs)
    return out


def render(model: type[BaseModel], *, title: str, intro: str, source: str, banner: str) -> str:
    parts = [banner, "", f"# {title}", "", intro.strip(), ""]
    for section in sections(model):
        heading = f"`{section.path}`" if section.path else "Top level"
        parts += [f"## {heading}", ""]
        if section.doc:
            parts += [section.doc, ""]
        if section.absent:
            parts += [section.absent, ""]
        rows = [(code(r.key), cell(r.type), r.default, cell(r.description) or "—") for r in section.rows]
        parts += [table(("Key", "Type", "Default", "Description"), rows), ""]
    parts.append(f"Source: {source}.")
    return "\n".join(parts) + "\n"


def all_keys(model: type[BaseModel]) -> dict[str, str]:
    """Every documented key path and its default text (for the completeness test)."""
    return {row.key: row.default for s in sections(model) for row in s.rows}

