"""The configuration reference, generated from the config models themselves.

Every key of every config model, with its type, default and description, rendered as
Markdown. The documentation site builds its configuration page from this at build time
(`scripts/mkdocs_hooks.py`), so the page cannot drift from the code: a field added to a
model appears on the next build, with or without a description.

A field's description is, in order: its `Field(description=...)` or attribute docstring
(the string literal under the field; `StrictModel` turns those into descriptions), else
the comment on the field's line, else the comment lines directly above it. A field with
none of these is still listed.

    python -m sanlab.configref > config.md

The mixer tables of docs/variants.md and docs/architecture.md (from the mixer registry,
`sanlab.model.mixers`) and the verdict rules of docs/records.md (from each record kind's
claim units) are generated here too, between `<!-- sanlab:NAME -->` and
`<!-- /sanlab:NAME -->` markers; tests/test_docs.py fails while a committed table
differs from what the registry gives, and

    python -m sanlab.configref --write-docs

rewrites them.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import io
import json
import sys
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

from sanlab.config import STANDARD_MIXER, Config, format_tokens, parse_tokens
from sanlab.data.prepare import PrepareConfig
from sanlab.errors import ConfigError, SanlabError
from sanlab.data.probes import TASKS
from sanlab.model.mixers import MIXERS, STATE_MIXERS, MixerSpec, mixer_class, state_mixer_class
from sanlab.probes.runner import ProbeOptions
from sanlab.records import axis as records_axis
from sanlab.records import matched as records_matched
from sanlab.records import probes as records_probes
from sanlab.records import variants as records_variants
from sanlab.study.spec import StudySpec


@dataclass(frozen=True)
class Root:
    """A top-level config: a TOML file's whole content."""

    title: str
    model: type[BaseModel]
    used_by: str


def roots() -> list[Root]:
    """The configs a user writes, in the order the reference shows them."""
    return [
        Root("Run config", Config,
             "`sanlab train`, `sanlab match`, `sanlab signal`; stored as a run dir's `config.json`"),
        Root("Study spec", StudySpec, "`sanlab study plan|run`; stored as a study dir's `study.json`"),
        Root("Prepare config", PrepareConfig,
             "`sanlab prepare --config`; stored in a prepared dir's `manifest.json` (`config`)"),
        Root("Probe options", ProbeOptions,
             "`sanlab probe` (`sweep.*`, `capacity.*`, `runner.*`, `row_tokens`; `model.*` / `optim.*` / "
             "`train.*` go to the run config)"),
        *(Root(f"Probe task: {name}", task.config, f"`sanlab probe {name} task.KEY=VALUE`")
          for name, task in TASKS.items()),
        *(Root(f"Mixer options: {spec.name}", spec.Options,
               f"`model.mixer={spec.name}` with `model.mixer_options.KEY=VALUE`")
          for spec in mixer_specs() if spec.Options.model_fields),
    ]


@dataclass(frozen=True)
class Key:
    """One documented key."""

    path: str  # dotted, as in an override; a list of tables is written `arms[].name`
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Section:
    """One model's table: where it sits and its keys."""

    path: str  # "" for a root's top level
    model: type[BaseModel]
    keys: list[Key]


# --------------------------------------------------------------------------- descriptions


_IGNORED_COMMENTS = ("fmt:", "type:", "noqa", "pragma")


@functools.lru_cache(maxsize=None)
def _source_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line, else the comment block directly above it."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    full_line: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if text and not text.startswith(_IGNORED_COMMENTS):
                comments[tok.start[0]] = text
                if not tok.line[: tok.start[1]].strip():
                    full_line.add(tok.start[0])
    found: dict[str, str] = {}
    class_def = ast.parse(source).body[0]
    for node in getattr(class_def, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        trailing = [comments[n] for n in range(node.lineno, end + 1) if n in comments and n not in full_line]
        above: list[str] = []
        n = node.lineno - 1
        while n in full_line:
            above.insert(0, comments[n])
            n -= 1
        text = " ".join(trailing) or " ".join(above)
        if text:
            found[node.target.id] = text
    return found


def field_description(model: type[BaseModel], name: str) -> str:
    """The description of `model.name` (see the module docstring); "" when it has none."""
    field = model.model_fields[name]
    if field.description:
        return " ".join(field.description.split())
    for cls in model.__mro__:  # the class that declares the field holds its comment
        if name in cls.__dict__.get("__annotations__", {}):
            return _source_comments(cls).get(name, "")
    return ""


# --------------------------------------------------------------------------- types and defaults


def _is_tokens(annotation: Any, field: FieldInfo | None = None) -> bool:
    metadata = list(field.metadata) if field is not None else []
    if typing.get_origin(annotation) is typing.Annotated:
        metadata += list(annotation.__metadata__)
    return any(isinstance(m, BeforeValidator) and m.func is parse_tokens for m in metadata)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model a field holds (directly, optionally, or as a list of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (m := _model_in(arg)) is not None:
            return m
    return None


def type_name(annotation: Any, field: FieldInfo | None = None) -> str:
    """A readable type: `int`, `float | none`, `"muon" | "adamw"`, `list[float]`, `tokens`."""
    if _is_tokens(annotation, field):
        base = "tokens"
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation):
            return f"{base} | none"
        return base
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin in (list, tuple, dict, set):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = args[:1]
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "none"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def default_text(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(table)"
    if value is None:
        return "none"
    if isinstance(value, int) and not isinstance(value, bool) and _is_tokens(field.annotation, field):
        return f"{value} ({format_tokens(value)})" if value >= 1000 else str(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        args = typing.get_args(field.annotation)
        if args and _is_tokens(args[0]):
            return json.dumps(list(value)) + " (" + ", ".join(format_tokens(v) for v in value) + ")"
    return json.dumps(value, default=list)


# --------------------------------------------------------------------------- walking


def sections(root: type[BaseModel], prefix: str = "", seen: set[type] | None = None) -> list[Section]:
    """Every model reachable from `root`, each once, at the first path that holds it.

    `seen` is shared across roots: a model met again (the study spec's `model`, `optim`,
    `train` are the run config's sections) is not repeated; its row links to its table.
    """
    seen = set() if seen is None else seen
    seen.add(root)
    keys: list[Key] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in root.model_fields.items():
        path = f"{prefix}{name}"
        sub = _model_in(field.annotation)
        if sub is None:
            typ = type_name(field.annotation, field)
        else:
            listed = typing.get_origin(field.annotation) is list
            link = f"[{sub.__name__}](#{anchor(sub)})"
            typ = f"list of {link}" if listed else f"table {link}"
            if sub not in seen:
                seen.add(sub)
                nested.append((f"{path}[]." if listed else f"{path}.", sub))
        keys.append(Key(path, typ, default_text(root, name), field_description(root, name)))
    out = [Section(prefix.rstrip("."), root, keys)]
    for sub_prefix, sub in nested:
        out.extend(sections(sub, sub_prefix, seen))
    return out


def anchor(model: type[BaseModel]) -> str:
    return f"cfg-{model.__module__.replace('.', '-')}-{model.__name__}".lower()


# --------------------------------------------------------------------------- rendering


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """The reference as Markdown: one part per root config, one table per model."""
    out: list[str] = []
    seen: set[type] = set()
    for root in roots():
        out.append(f"## {root.title}\n")
        out.append(f"Used by {root.used_by}.\n")
        for sec in sections(root.model, seen=seen):
            title = f"`[{sec.path}]`" if sec.path else "top level"
            out.append(f"### {title} {{#{anchor(sec.model)}}}\n")
            doc = " ".join((inspect.getdoc(sec.model) or "").split())
            out.append(f"`{sec.model.__module__}.{sec.model.__name__}`" + (f": {doc}" if doc else "") + "\n")
            out.append("| key | type | default | description |")
            out.append("|---|---|---|---|")
            for k in sec.keys:
                default = k.default if k.default in ("required", "(table)") else f"`{_cell(k.default)}`"
                out.append(f"| `{k.path}` | {_cell(k.type)} | {default} | {_cell(k.description) or '—'} |")
            out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- mixer tables


def mixer_specs() -> list[type[MixerSpec]]:
    """The registered sequence mixers in the docs' order: the standard one, then by name."""
    return sorted(MIXERS.values(), key=lambda s: (s.name != STANDARD_MIXER, s.name))


def _options_text(spec: type[MixerSpec]) -> str:
    fields = spec.Options.model_fields
    if not fields:
        return "—"
    return ", ".join(f"`{name}` ({default_text(spec.Options, name).strip(chr(34))})" for name in fields)


def render_mixer_table() -> str:
    """docs/variants.md: every sequence mixer, what it does and its options; the state mixers."""
    rows = ["| `model.mixer` | paper | what it does | options (`model.mixer_options`, default) |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.paper or '—'} | {_cell(s.summary)} | {_options_text(s)} |" for s in mixer_specs()]
    rows += ["", "| `model.state_mixer` | paper | what it does |", "|---|---|---|",
             "| `none` | SPEC §1.1 | no FFN: the SAN (`model.ffn=false`) |"]
    rows += [f"| `{s.name}` | {s.paper} | {_cell(s.summary)} (`model.ffn=true`) |" for s in STATE_MIXERS.values()]
    return "\n".join(rows)


def render_mixer_files() -> str:
    """docs/architecture.md: each mixer's file, spec, module and decode cache (imports torch:
    the module classes)."""
    rows = ["| mixer | file (`src/sanlab/model/mixers/`) | spec | module | decode |", "|---|---|---|---|---|"]
    for s in mixer_specs():
        cls = mixer_class(s.name)
        cache = cls.decode_cache
        decode = f"`{cache.__name__}`" if cache is not None else "full forward"
        rows.append(f"| `{s.name}` | `{s.__module__.rsplit('.', 1)[1]}.py` | `{s.__name__}` | `{cls.__name__}` | {decode} |")
    for s in STATE_MIXERS.values():
        rows.append(f"| `{s.name}` (state) | `{s.__module__.rsplit('.', 1)[1]}.py` | `{s.__name__}` | "
                    f"`{state_mixer_class(s.name).__name__}` | — |")
    return "\n".join(rows)


# file (relative to the repository root) -> marker name -> what goes between its markers
GENERATED: dict[str, dict[str, Any]] = {
    "docs/variants.md": {"mixers": render_mixer_table},
    "docs/architecture.md": {"mixer-files": render_mixer_files},
    # each record kind's verdict rules, from its claim units (`sanlab.records.common.ClaimSet`)
    "docs/records.md": {f"claims-{kind.__name__.rsplit('.', 1)[1]}": kind.CLAIMS.markdown
                        for kind in (records_axis, records_matched, records_variants, records_probes)},
}


def regenerated(text: str, blocks: dict[str, Any], where: str) -> str:
    """`text` with every marked block replaced by its rendering (ConfigError: a marker missing)."""
    for name, render in blocks.items():
        start, end = f"<!-- sanlab:{name} -->", f"<!-- /sanlab:{name} -->"
        if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
            raise ConfigError(f"{where}: expected one {start} … {end} block")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{start}\n{render()}\n{end}{tail}"
    return text


def stale_docs(root: Path, write: bool = False) -> list[str]:
    """The generated docs under `root` that differ from the registry (rewritten with `write`)."""
    new: dict[Path, str] = {}
    for rel, blocks in GENERATED.items():
        text = (root / rel).read_text()
        if (fresh := regenerated(text, blocks, rel)) != text:
            new[root / rel] = fresh
    if write:  # every file checked first: a missing marker writes nothing
        for path, text in new.items():
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
    return [str(path.relative_to(root)) for path in new]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sanlab.configref", description="the configuration reference "
                                     "(stdout), or the mixer tables of the docs")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the generated blocks of docs/*.md")
    parser.add_argument("--check-docs", action="store_true", help="exit 1 when a generated block is stale")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2], help="the repository")
    args = parser.parse_args(argv)
    if not (args.write_docs or args.check_docs):
        print(render_markdown())
        return 0
    try:
        stale = stale_docs(args.root, write=args.write_docs)
    except (OSError, SanlabError) as e:
        print(f"configref: error: {e}", file=sys.stderr)
        return 2
    for rel in stale:
        print(f"{rel}: {'rewritten' if args.write_docs else 'stale (python -m sanlab.configref --write-docs)'}")
    return 1 if stale and args.check_docs else 0


if __name__ == "__main__":
    raise SystemExit(main())
