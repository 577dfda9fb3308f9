"""Typer options built from config dataclasses: one option per field, its ``--help`` the first sentence of the field's
docstring, its default and valid range the field's (each docstring in full: docs/OPTIONS.md, cli/options_doc.py)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Union

import typer

from ..checks import invalid, range_of

TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")
FALSE_WORDS = ("0", "false", "f", "no", "n", "off")
UNION_TYPES = (typing.Union, getattr(types, "UnionType", typing.Union))  # Optional[X] and X | None (3.10+)
CONTEXT = "cli_context"  # the typer.Context parameter of every wrapped command (typed values vs defaults)
NO_PREFIX = "no__"  # parameter-name prefix of the --no-FIELD flags (cannot clash with a field)
OPTIONS_DOC = "docs/OPTIONS.md"  # every option in full (cli/options_doc.py)
# A field's values, help and check are one checks.Range in its metadata (range_of): its text is the valid range
# --help and the messages state, its choices are listed, its low is typer's min where it says at_parse.


def field_help(field: dataclasses.Field, doc: str) -> str:
    """A field's full text (docs/OPTIONS.md): its docstring, its valid range, then a registry field's choices with
    their help."""
    doc += _valid_text(field)
    listed = _listed(field)
    if listed is None:
        return doc
    return f"{doc} One of: " + "; ".join(f"{name}: {text}" for name, text in listed.items()) + "."


def _listed(field: dataclasses.Field) -> Optional[dict[str, str]]:
    """{choice: help} of a field that names one of a few choices, else None."""
    valid = range_of(field)
    return None if valid is None else valid.named()


def _valid_text(field: dataclasses.Field) -> str:
    """`` Valid: <range>.`` for a field whose metadata states its range (not for one of a few choices: they are
    listed), else nothing."""
    valid = range_of(field)
    return "" if valid is None or valid.choices is not None else f" Valid: {valid.text}."


#: Words that end in a point inside a sentence (paper references, Latin): not a sentence end.
_ABBREVIATIONS = ("Sec", "Secs", "Eq", "Eqs", "App", "Thm", "Alg", "Fig", "Tab", "e.g", "i.e", "cf", "vs", "al",
                  "resp", "approx")


def first_sentence(text: str) -> str:
    """The first sentence of ``text``: up to the first ". " outside parentheses that does not end an abbreviation
    (``Sec. 3``, ``e.g.``); the whole text if there is none."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if char == "." and depth <= 0 and (i + 1 == len(text) or text[i + 1] == " "):
            word = text[:i].rsplit(" ", 1)[-1].lstrip("(")
            if word not in _ABBREVIATIONS and not word.replace(".", "").isdigit() and word.strip("."):  # "...": on
                return text[:i + 1]
    return text


def _without_asides(text: str) -> str:
    """``text`` without its parenthesised asides (round brackets; an interval's ``[0, 1)`` is kept)."""
    out, depth = [], 0
    for i, char in enumerate(text):
        if char == "(" and (depth or i == 0 or text[i - 1] == " "):  # an aside opens after a space, not "[0, 1)"
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif not depth:
            out.append(char)
    return re.sub(r"\s+([.,:;])(?=\s|$)", r"\1", " ".join("".join(out).split()))  # "word (aside)." -> "word."


def option_help(field: dataclasses.Field, doc: str) -> str:
    """A field's ``--help`` entry: the docstring's first sentence without its asides, and a registry field's choice
    names; each choice's help and the whole docstring are in docs/OPTIONS.md, so ``--help`` stays a short list."""
    short = _without_asides(first_sentence(doc) + _valid_text(field))
    listed = _listed(field)
    return short if listed is None else f"{short} One of: {', '.join(listed)}."


def parse_bool(value: Any) -> bool:
    """A boolean from the words click's BOOLEAN type accepts (case-insensitive)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise typer.BadParameter(f"{value!r} is not a boolean (true/false, yes/no, 1/0, on/off)")


def option_name(field: str) -> str:
    """The option a user types for a field: ``batch_size`` -> ``--batch-size``."""
    return "--" + field.replace("_", "-")


@functools.lru_cache(maxsize=None)
def _source(path: str) -> str:
    """A source file's text, read once (``inspect.getsource`` per class re-reads it)."""
    with open(path, encoding="utf-8") as handle:
        return handle.read()


@functools.lru_cache(maxsize=None)
def _class_nodes(path: str | None) -> dict[str, ast.ClassDef]:
    """Top-level class definitions of a source file, parsed once."""
    if path is None:
        return {}
    return {node.name: node for node in ast.parse(_source(path)).body if isinstance(node, ast.ClassDef)}


_TOP_LEVEL_LINE = re.compile(r"^[^\s#]", flags=re.MULTILINE)  # a line at column 0 that is not a comment


@functools.lru_cache(maxsize=None)
def _class_node(path: str | None, name: str) -> ast.ClassDef | None:
    """The top-level class ``name`` of a source file. Only its own lines are parsed, from ``class name`` to the next
    line at column 0 (a command's options read one class; parsing the whole module was most of building ``optimal``'s
    options): a cut that is not the class's end (inside a string, a bracket) does not parse alone, and then the whole
    file is."""
    if path is None:
        return None
    text = _source(path)
    starts = [m.start() for m in re.finditer(rf"^class {re.escape(name)}\b", text, flags=re.MULTILINE)]
    if len(starts) == 1:  # (a name defined twice: the whole file says which definition stands)
        header_end = text.find("\n", starts[0])
        end = _TOP_LEVEL_LINE.search(text, len(text) if header_end < 0 else header_end + 1)
        try:
            body = ast.parse(text[starts[0]:end.start() if end else len(text)]).body
        except SyntaxError:
            body = []
        if len(body) == 1 and isinstance(body[0], ast.ClassDef) and body[0].name == name:
            return body[0]
    return _class_nodes(path).get(name)


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string right under each field) of ``cls`` and its dataclass bases (a subclass's
    wins)."""
    return dict(_field_docs(cls))


@functools.lru_cache(maxsize=None)
def _field_docs(cls: type) -> dict[str, str]:
    """``field_docs``, read once per class (a command's options ask for it field by field)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            node = _class_node(inspect.getsourcefile(klass), klass.__qualname__)
        except (OSError, TypeError):  # no source (e.g. a class built at run time): no help text
            continue
        if node is None:
            continue
        for stmt, following in zip(node.body, node.body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[stmt.target.id] = " ".join(following.value.value.split())
    return docs


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, resolved once per class: under ``from __future__ import annotations`` each call
    evaluates every field's annotation string again, and a command's options ask field by field (read only)."""
    return typing.get_type_hints(cls)


def _field_type(hint: Any) -> tuple[type, bool]:
    """(scalar type, optional) of a field's resolved type hint."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in UNION_TYPES and len(args) == 1:
        return args[0], True
    return hint, False


def field_owner(cls: type, path: str) -> tuple[type, dataclasses.Field]:
    """(the dataclass that defines the field at dotted ``path``, the field): ``what_if.ppo_clip`` reaches the nested
    WhatIfConfig."""
    head, _, rest = path.partition(".")
    field = {f.name: f for f in dataclasses.fields(cls)}[head]
    return (cls, field) if not rest else field_owner(_type_hints(cls)[head], rest)


def list_default(value: tuple) -> str:
    """A tuple default as it is typed: ``(0.2, 0.28)`` -> ``0.2,0.28``, ``(2.0, 5.0)`` -> ``2,5``."""
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)


def every_field(cls: type, aliases: Optional[dict[str, tuple[str, ...]]] = None) -> dict[str, tuple[str, ...]]:
    """Every init field of ``cls`` as an option: ``--field-name``, then the field's ``aliases``."""
    return {f.name: (option_name(f.name), *(aliases or {}).get(f.name, ())) for f in dataclasses.fields(cls) if f.init}


def _parameter(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def field_parameters(cls: type, path: str, names: tuple[str, ...], valued_bool: bool) -> list[inspect.Parameter]:
    """The option of the field at ``path`` of ``cls``, named ``names``: help, default and lower bound (``MIN``) the
    field's; a tuple is comma-separated text (parsed by :func:`config_from_options`); a bool is a flag, or with
    ``valued_bool`` takes a value (see :func:`with_field_options`) and gets a hidden ``--no-FIELD``."""
    owner, field = field_owner(cls, path)
    kind, optional = _field_type(_type_hints(owner)[field.name])
    default = (field.default if field.default is not dataclasses.MISSING else ...
               if field.default_factory is dataclasses.MISSING else field.default_factory())
    if typing.get_origin(kind) is tuple:
        kind, default = str, default if default is ... else list_default(default)
    if kind not in (int, float, str, bool, Path):
        raise TypeError(f"{owner.__name__}.{field.name}: no command-line option for type {kind!r}")
    text, name = option_help(field, field_docs(owner).get(field.name, "")), path.replace(".", "__")
    if kind is bool and valued_bool:  # a str annotation, or typer makes it a flag that refuses the value
        negated = option_name("no_" + field.name)
        option = typer.Option(*names, help=f"{text} ({negated}: false)", parser=parse_bool, metavar="BOOLEAN")
        return [_parameter(name, Annotated[str, option], default),
                _parameter(NO_PREFIX + name, Annotated[bool, typer.Option(negated, hidden=True)], False)]
    valid = range_of(field)
    bound = {"min": valid.low} if valid is not None and valid.at_parse else {}
    option = typer.Option(*names, help=text, **bound)
    return [_parameter(name, Annotated[Optional[kind] if optional else kind, option], default)]


Table = Union[type, tuple[type, dict[str, tuple[str, ...]]]]
"""A config class (every init field an option) or (a config class, {dotted field path: the option's names})."""


def with_field_options(*tables: Table, aliases: Optional[dict[str, tuple[str, ...]]] = None
                       ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``func(typed_1, ..., typed_n, **own)`` becomes a command whose options are the fields of ``tables``,
    after its own parameters. A class gives every init field (``--field-name`` and its ``aliases``), booleans taking a
    value (``--replacement false``; ``--no-replacement`` is false); a (class, table) pair the listed fields (nested
    configs by dotted path), booleans as flags. ``typed_i`` holds only what the user typed, by path, so the config's
    own defaults apply to the rest (:func:`config_from_options`); called as a plain function, it is empty."""
    specs = [(t, every_field(t, aliases), True) if isinstance(t, type) else (*t, False) for t in tables]
    params = [p for cls, options, valued in specs for path, names in options.items()
              for p in field_parameters(cls, path, names, valued)]
    ranges = {path.replace(".", "__"): valid.text for cls, options, _ in specs for path in options
              for valid in [range_of(field_owner(cls, path)[1])] if valid is not None}

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(func, include_extras=True)  # resolves `from __future__` string annotations
        own = [p.replace(annotation=hints.get(p.name, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
               for p in list(inspect.signature(func).parameters.values())[len(tables):]]
        clash = {p.name for p in own} & ({p.name for p in params} | {CONTEXT})
        if clash:
            raise TypeError(f"{func.__name__}: parameters {sorted(clash)} clash with its config fields")

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            ctx: Optional[typer.Context] = kwargs.pop(CONTEXT, None)
            return func(*[_typed(ctx, kwargs, options) for _, options, _ in specs], **kwargs)

        # the full text of every option (the field docstrings) is one file away; --help gives each one line
        command.__doc__ = inspect.cleandoc(func.__doc__ or "") + f"\n\nEvery option in full: {OPTIONS_DOC}."
        command.valid_ranges = ranges  # type: ignore[attr-defined]  # cli/app.py's hint when typer rejects a value
        signature = own + params + [inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY,
                                                      annotation=typer.Context)]
        command.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in signature}
        del command.__wrapped__  # typer must read __signature__, not the wrapped function's
        return command

    return decorate


def _typed(ctx: Optional[typer.Context], kwargs: dict[str, Any], options: dict[str, tuple[str, ...]]) -> dict:
    """The values of ``options`` the user typed (popped from ``kwargs``), by path; ``--no-FIELD`` types false."""
    typed = {}
    for path in options:
        name = path.replace(".", "__")
        value, negated = kwargs.pop(name, None), kwargs.pop(NO_PREFIX + name, False)
        source = None if ctx is None else ctx.get_parameter_source(name)
        given = source is not None and source.name != "DEFAULT"
        if negated and given:
            raise typer.BadParameter(f"give {options[path][0]} or {option_name('no_' + path)}, not both")
        if negated or given:
            typed[path] = False if negated else value
    return typed


def _parsed(value: Any, field: dataclasses.Field, hint: Any, option: str) -> Any:
    """A typed value of a field: a tuple field's comma-separated text as the tuple (empty parts skipped)."""
    if typing.get_origin(hint) is not tuple or not isinstance(value, str):
        return value
    kind = typing.get_args(hint)[0]
    try:
        return tuple(kind(v.strip()) for v in value.split(",") if v.strip())
    except ValueError:
        stated = range_of(field)
        valid = stated.text if stated else f"comma-separated {'numbers' if kind is float else 'integers'}"
        raise invalid(option, valid, value) from None


def config_from_options(cls: type, options: Optional[dict[str, tuple[str, ...]]], typed: dict[str, Any],
                        **given: Any) -> Any:
    """``cls`` built from the ``typed`` option values of its ``options`` (None: every field; dotted paths fill nested
    config dataclasses) and ``given``; every other field keeps its default, and the config's own checks run."""
    options = every_field(cls) if options is None else options
    hints, fields = _type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in typed.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            given[head] = _parsed(value, fields[head], _field_type(hints[head])[0], options[path][0])
    for head, values in nested.items():
        sub = {rest: options[f"{head}.{rest}"] for rest in values}
        given[head] = config_from_options(hints[head], sub, values)
    return cls(**given)
