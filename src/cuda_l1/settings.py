"""Settings dataclasses: every field carries its one-line help in field metadata.

Help written as a comment is read by people only; in metadata it is read by code too: `--help`
texts, `cuda-l1 config` and `docs/configuration.md` are printed from it, so they cannot drift from
the defaults. Write `name: type = setting(default, "help")`, or `setting(factory=list, help=...)`
for a mutable default.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import MISSING
from typing import Any, Iterator


def setting(default: Any = MISSING, help: str = "", *, factory: Any = MISSING) -> Any:
    """A dataclass field with its help in metadata (one default: a value or a factory)."""
    if not help:
        raise ValueError("a setting needs its help line")
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": help})


def helps_of(cls: type) -> dict[str, str]:
    """The help line of every field of a settings dataclass that has one, by field name."""
    return {item.name: item.metadata["help"] for item in dataclasses.fields(cls) if item.metadata.get("help")}


@dataclasses.dataclass(frozen=True)
class SettingDoc:
    """One documented field: its dotted key within the top-level settings class."""

    key: str = setting(help="dotted key, e.g. timing.window_s")
    type: str = setting(help="the annotation as written")
    default: str = setting(help="the default, as Python writes it ('' when the field is required)")
    help: str = setting(help="the field's help line")


def describe(cls: type, prefix: str = "") -> Iterator[SettingDoc]:
    """Every field of a settings dataclass, nested settings dataclasses expanded under their key."""
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        key = prefix + item.name
        nested = hints.get(item.name)
        if isinstance(nested, type) and dataclasses.is_dataclass(nested):
            yield from describe(nested, key + ".")
            continue
        yield SettingDoc(key=key, type=_type_name(item.type), default=_default_text(item),
                         help=item.metadata.get("help", ""))


def undocumented(cls: type) -> list[str]:
    """Keys of fields without a help line (nested settings included): what a test refuses."""
    return [doc.key for doc in describe(cls) if not doc.help]


def markdown(classes: list[type]) -> str:
    """A Markdown table per settings class: key, default, help."""
    parts = []
    for cls in classes:
        parts.append(f"## `{cls.__module__}.{cls.__name__}`\n\n{_first_line(cls.__doc__)}\n")
        parts.append("| key | default | help |\n|---|---|---|")
        for doc in describe(cls):
            default = f"`{doc.default}`" if doc.default else "(required)"
            text = doc.help.replace("|", "\\|")
            parts.append(f"| `{doc.key}` | {default} | {text} |")
        parts.append("")
    return "\n".join(parts)


def _default_text(item: dataclasses.Field) -> str:
    if item.default is not MISSING:
        return repr(item.default)
    if item.default_factory is not MISSING:
        try:
            return repr(item.default_factory())
        except Exception:  # a factory that needs the environment: name it instead
            return f"{getattr(item.default_factory, '__name__', 'factory')}()"
    return ""


def _type_name(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc and doc.strip() else ""
