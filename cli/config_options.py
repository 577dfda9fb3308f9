"""Typer options built from a config dataclass: one option per field, its help the field's docstring.

``simulate`` and ``calibrate-simulator`` take every :class:`~replay_theory.simulate.config.SimConfig`
field as an option (``capacity`` -> ``--capacity``, the buffer size N of the experience-replay paper,
Sec. 3). Field help is written once, as the attribute docstring right under the field, and read here
from the source of every dataclass in the class's MRO (so fields inherited from a base config keep
their help). A field that names a registry entry (``buffer``, ``loss``) carries ``metadata={"choices":
callable}`` (``core.designs.CHOICES``): the callable returns {name: one-line help} from the registry, and
the option's help lists them after the docstring, so the choices and their help are written once, at
the registry entry. Typer reads the options from the ``inspect.Signature`` of the wrapped command: no
hand-parsed argv.

Booleans take a value, parsed like typer/click's BOOLEAN type (``--replacement false``, ``--replacement
0``, ``--measure-drift yes``), and ``--no-FIELD`` is accepted as ``--FIELD false``. A value-taking option
is what lets ``--replacement False`` (what ``--help`` shows as the default) work: typer makes every
``bool``-annotated option a pure flag, which then rejects the value as an extra argument.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import types
import typing
from typing import Annotated, Any, Callable, Optional

import typer

TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")
FALSE_WORDS = ("0", "false", "f", "no", "n", "off")
UNION_TYPES = (typing.Union, getattr(types, "UnionType", typing.Union))  # Optional[X] and X | None (3.10+)
CONTEXT = "cli_context"
"""Name of the typer.Context parameter added to every wrapped command (to tell typed values from defaults)."""
NO_PREFIX = "no__"
"""Parameter-name prefix of the ``--no-FIELD`` flags (double underscore: cannot clash with a field)."""
OPTIONS_DOC = "docs/OPTIONS.md"
"""Where the options built here are printed in full (cli/options_doc.py writes it from the same docstrings)."""
CHOICES = "choices"
"""Field-metadata key of a registry name field: the key ``core.designs.CHOICES`` names (not imported: the command
modules load before numpy)."""
VALID = "valid"
"""Field-metadata key of a checked field: the valid range its check states (``theory.optimal.VALID``), shown in
``--help`` and named when typer rejects a value before the check runs (``--mu abc``; cli/app.py, ``valid_range``)."""
CONFIG_CLASS = "config_class"
"""Attribute of a command built by :func:`with_dataclass_options`: the config class its options come from."""


def field_help(field: dataclasses.Field, doc: str) -> str:
    """A field's full text: its docstring, then the registry's choices with their one-line help, if it has any
    (docs/OPTIONS.md prints it; ``--help`` prints :func:`option_help`)."""
    doc += _valid_text(field)
    listed = field.metadata.get(CHOICES)
    if listed is None:
        return doc
    return f"{doc} One of: " + "; ".join(f"{name}: {text}" for name, text in listed().items()) + "."


def _valid_text(field: dataclasses.Field) -> str:
    """`` Valid: <range>.`` for a field whose metadata states its range (not for one of a few choices: they are
    listed), else nothing."""
    valid = field.metadata.get(VALID)
    return "" if valid is None or CHOICES in field.metadata else f" Valid: {valid}."


def option_range(callback: Callable[..., Any], name: str) -> Optional[str]:
    """The valid range of the option ``name`` (a parameter name) of a command built by :func:`with_dataclass_options`,
    as its field's metadata states it; None for another command or a field without one."""
    cls = getattr(callback, CONFIG_CLASS, None)
    fields = {} if cls is None else {f.name: f for f in dataclasses.fields(cls)}
    return fields[name].metadata.get(VALID) if name in fields else None


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
    listed = field.metadata.get(CHOICES)
    return short if listed is None else f"{short} One of: {', '.join(listed())}."


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
def _class_nodes(path: str | None) -> dict[str, ast.ClassDef]:
    """Top-level class definitions of a source file, parsed once: every command's options are built at start-up,
    and ``inspect.getsource`` per class re-tokenises the whole file each time (about 200 ms in all)."""
    if path is None:
        return {}
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string right under each field) of ``cls`` and its dataclass bases.

    A subclass's docstring wins over its base's for a field both define.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            node = _class_nodes(inspect.getsourcefile(klass)).get(klass.__qualname__)
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


def _field_type(hint: Any) -> tuple[type, bool]:
    """(scalar type, optional) of a field's resolved type hint."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in UNION_TYPES and len(args) == 1:
        return args[0], True
    return hint, False


def dataclass_parameters(cls: type, aliases: Optional[dict[str, tuple[str, ...]]] = None
                         ) -> list[inspect.Parameter]:
    """Keyword-only parameters, one per field of ``cls`` (plus ``--no-FIELD`` for booleans), for typer."""
    aliases = aliases or {}
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    params = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        kind, optional = _field_type(hints[field.name])
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = ...  # required
        names = (option_name(field.name), *aliases.get(field.name, ()))
        help_text = option_help(field, docs.get(field.name, ""))
        if kind is bool:
            # value-taking (see the module docstring); str annotation so typer does not force a flag
            option = typer.Option(*names, help=help_text + f" ({option_name('no_' + field.name)}: false)",
                                  parser=parse_bool, metavar="BOOLEAN")
            annotation: Any = Annotated[str, option]
            params.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=annotation))
            params.append(inspect.Parameter(
                NO_PREFIX + field.name, inspect.Parameter.KEYWORD_ONLY, default=False,
                annotation=Annotated[bool, typer.Option(option_name("no_" + field.name), hidden=True)]))
            continue
        if kind not in (int, float, str):
            raise TypeError(f"{cls.__name__}.{field.name}: no command-line option for type {kind!r}")
        annotation = Annotated[Optional[kind] if optional else kind, typer.Option(*names, help=help_text)]
        params.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=annotation))
    return params


def with_dataclass_options(cls: type, aliases: Optional[dict[str, tuple[str, ...]]] = None
                           ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``func(fields: dict, **own)`` becomes a command with every field of ``cls`` as an option.

    ``fields`` maps each field name to the value given (or its default); the command's own parameters
    keep their annotations. The returned function's ``__signature__`` is what typer reads.
    """
    field_params = dataclass_parameters(cls, aliases)
    field_names = [p.name for p in field_params if not p.name.startswith(NO_PREFIX)]

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(func, include_extras=True)  # resolves `from __future__` string annotations
        own = [p.replace(annotation=hints.get(p.name, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
               for p in list(inspect.signature(func).parameters.values())[1:]]
        clash = {p.name for p in own} & ({p.name for p in field_params} | {CONTEXT})
        if clash:
            raise TypeError(f"{func.__name__}: parameters {sorted(clash)} clash with {cls.__name__} fields")

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            ctx: typer.Context = kwargs.pop(CONTEXT)
            fields = {}
            for name in field_names:
                value = kwargs.pop(name)
                if NO_PREFIX + name in kwargs:
                    negated = kwargs.pop(NO_PREFIX + name)
                    value = parse_bool(value)
                    if negated:
                        if value is not True or _typed(ctx, name):
                            raise typer.BadParameter(f"give {option_name(name)} or {option_name('no_' + name)}, "
                                                     f"not both")
                        value = False
                fields[name] = value
            return func(fields, **kwargs)

        # the full text of every option (the field docstrings) is one file away; --help gives each one line
        command.__doc__ = inspect.cleandoc(func.__doc__ or "") + f"\n\nEvery option in full: {OPTIONS_DOC}."
        context = inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        signature = own + field_params + [context]
        command.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in signature}
        del command.__wrapped__  # typer must read __signature__, not the wrapped function's
        setattr(command, CONFIG_CLASS, cls)  # typer's callback copies it: cli/app.py finds the options' ranges
        return command

    return decorate


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether the user typed the option of field ``name`` (not just left its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


# --- a chosen set of fields, nested configs included (diagnose, calibrate --from-log, experiment theory-test) ---


def field_owner(cls: type, path: str) -> tuple[type, dataclasses.Field]:
    """(the dataclass that defines the field at dotted ``path``, the field): ``what_if.ppo_clip`` reaches the nested
    WhatIfConfig."""
    head, _, rest = path.partition(".")
    field = {f.name: f for f in dataclasses.fields(cls)}[head]
    return (cls, field) if not rest else field_owner(typing.get_type_hints(cls)[head], rest)


def list_default(value: tuple) -> str:
    """A tuple default as it is typed: ``(0.2, 0.28)`` -> ``0.2,0.28``, ``(2.0, 5.0)`` -> ``2,5``."""
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)


def field_parameter(cls: type, path: str, names: tuple[str, ...]) -> inspect.Parameter:
    """One option for the field at ``path`` of ``cls``, named ``names``, its help the field's docstring and its default
    the field's: a bool is a flag, a tuple a comma-separated text (parsed by :func:`config_from_options`)."""
    owner, field = field_owner(cls, path)
    kind, optional = _field_type(typing.get_type_hints(owner)[field.name])
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if typing.get_origin(kind) is tuple:
        kind, default = str, list_default(default)
    option = typer.Option(*names, help=option_help(field, field_docs(owner).get(field.name, "")))
    annotation = Annotated[Optional[kind] if optional else kind, option]
    return inspect.Parameter(path.replace(".", "__"), inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=annotation)


def with_field_options(cls: type, options: dict[str, tuple[str, ...]]) -> Callable[[Callable[..., Any]], Callable]:
    """Decorator: ``func(typed: dict, **own)`` becomes a command with the fields of ``cls`` that ``options`` lists
    (dotted path -> flag names) as options. ``typed`` holds only what the user typed, by path, so the config's own
    defaults apply to the rest (:func:`config_from_options`); called as a plain function, ``typed`` is empty."""
    field_params = [field_parameter(cls, path, names) for path, names in options.items()]

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(func, include_extras=True)
        own = [p.replace(annotation=hints.get(p.name, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
               for p in list(inspect.signature(func).parameters.values())[1:]]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            ctx: Optional[typer.Context] = kwargs.pop(CONTEXT, None)
            values = {path: kwargs.pop(path.replace(".", "__"), None) for path in options}
            typed = {path: value for path, value in values.items()
                     if ctx is not None and _source(ctx, path.replace(".", "__")) != "DEFAULT"}
            return func(typed, **kwargs)

        command.__doc__ = inspect.cleandoc(func.__doc__ or "") + f"\n\nEvery option in full: {OPTIONS_DOC}."
        context = inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        signature = own + field_params + [context]
        command.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in signature}
        del command.__wrapped__
        return command

    return decorate


def _source(ctx: typer.Context, name: str) -> str:
    source = ctx.get_parameter_source(name)
    return "DEFAULT" if source is None else source.name


def _parsed(value: Any, hint: Any, option: str) -> Any:
    """A typed value of a field: a tuple field's comma-separated text as the tuple (empty parts skipped)."""
    if typing.get_origin(hint) is not tuple or not isinstance(value, str):
        return value
    kind = typing.get_args(hint)[0]
    try:
        return tuple(kind(v.strip()) for v in value.split(",") if v.strip())
    except ValueError:
        from ..theory.checks import invalid

        raise invalid(option, f"comma-separated {'numbers' if kind is float else 'integers'}", value) from None


def config_from_options(cls: type, options: dict[str, tuple[str, ...]], typed: dict[str, Any], **given: Any) -> Any:
    """``cls`` built from the ``typed`` option values (dotted paths fill nested config dataclasses) and ``given``;
    every other field keeps its default, and the config's own checks run."""
    hints = typing.get_type_hints(cls)
    nested: dict[str, dict[str, Any]] = {}
    for path, value in typed.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            given[head] = _parsed(value, _field_type(hints[head])[0], options[path][0])
    for head, values in nested.items():
        sub = {rest: options[f"{head}.{rest}"] for rest in values}
        given[head] = config_from_options(hints[head], sub, values)
    return cls(**given)
