"""Registries: the named entries (datasets, architectures, methods, formats, ...) behind the
Python API, the CLI choices and the parametrized tests; and the one options idiom of their
plug-ins (:class:`Configurable`: one frozen dataclass of :func:`option` fields, built by
:func:`parse_options`, listed by :func:`describe_options`).

A plug-in, e.g. a training method::

    @register_method("stability")
    class StabilityTraining(TrainingMethod):
        @dataclass(frozen=True)
        class Options:
            lbd: float = option(2.0, "λ: weight of the stability term (> 0)")

            def __post_init__(self):
                check_positive_finite("lbd", self.lbd)

        def loss(self, model, x, y, noise, generator):
            ...  # reads self.lbd

    StabilityTraining(lbd=1)  # == StabilityTraining(StabilityTraining.Options(lbd=1.0))
    build_method("stability", lbd="1")  # KEY=VALUE text too: hparams() == {"lbd": 1.0}
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import pkgutil
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from .errors import SmoothcertError, unknown_name

T = TypeVar("T")


def import_submodules(package: str, path, skip: tuple = ()) -> None:
    """Import every module of ``package`` (its ``__path__``) but ``skip``: each registers its
    entries on import, so a new method or certifier needs only its own file."""
    for module in pkgutil.iter_modules(path):
        if module.name not in skip:
            importlib.import_module(f"{package}.{module.name}")


class Registry(dict):
    """A dict from name to entry whose misses raise one SmoothcertError listing the known names."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def __missing__(self, name):
        raise unknown_name(self.kind, name, self)

    def register(self, name: str):
        """Decorator: add the decorated object under ``name`` (a name is registered once); a
        :class:`Configurable` plug-in without a ``name`` of its own takes this one (errors name
        it)."""

        def add(entry):
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self[name] = entry
            if isinstance(entry, type) and issubclass(entry, Configurable):
                if not entry.__dict__.get("name"):
                    entry.name = name
                entry.family = self  # its siblings: an error names the one that takes a key
            return entry

        return add


# --------------------------------------------------------------------------- plug-in options
# Every plug-in (a training method, a σ mode, a certifier, an attack) declares its options as ONE
# frozen dataclass whose fields are declared with :func:`option`; :func:`parse_options` is the
# one boundary that builds it from what a user gave, and :func:`option_values` is what a
# checkpoint, a config or a run identity stores.

_NULL_TEXTS = ("null", "none")  # KEY=VALUE text that means None for an optional field
_BOOL_TEXTS = {"true": True, "false": False}  # not YAML 1.1's yes/no/on/off: "yes" is refused


def option(default: Any, doc: str, *, choices: Sequence[str] | None = None,
           convert: Callable[[Any], Any] | None = None) -> Any:
    """A plug-in option: a dataclass field with ``default`` and a one-line ``doc`` (its meaning
    and unit) that ``--help`` prints. ``choices`` restricts a string option to those values (a
    ``Literal[...]`` annotation does the same); a registry-driven choice (e.g. an attack name)
    is checked in the options' ``__post_init__`` instead, so later registrations count.
    ``convert`` replaces the conversion by the annotation for a value with a text form of its
    own (e.g. a clamp ``"low,high"``); it raises SmoothcertError, and None stays None."""
    if isinstance(default, (list, dict, set)):
        raise TypeError(f"option default {default!r} is mutable; use a tuple")
    meta = {"doc": doc, "choices": tuple(choices) if choices is not None else None,
            "convert": convert}
    return dataclasses.field(default=default, metadata=meta)


def number_list(what: str, value, *, low: float, low_open: bool = False) -> tuple[float, ...]:
    """The numbers of a list option: a number, a list of them, or comma-separated text
    (``"0.1,0.25"``), each finite and ≥ ``low`` (> with ``low_open``); at least one. Anything
    else is one SmoothcertError line saying what is wrong with which item (``what``: the
    option's name for messages, e.g. "median eps")."""
    bound = f"{'>' if low_open else '>='} {low:g}"
    if value is None or (isinstance(value, str) and not value.strip()):
        raise SmoothcertError(f"{what} is empty: give one number {bound} or several separated "
                              "by commas")
    items = value.split(",") if isinstance(value, str) else \
        list(value) if isinstance(value, (list, tuple)) else [value]
    numbers = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            raise SmoothcertError(f"{what} {value!r} has an empty item (a stray comma?)")
        try:
            if isinstance(item, bool):
                raise TypeError
            number = float(item)
        except (TypeError, ValueError):
            raise SmoothcertError(f"{what}: {item!r} is not a number") from None
        if not math.isfinite(number) or number < low or (low_open and number == low):
            raise SmoothcertError(f"{what} must be finite numbers {bound}, got {item!r}")
        numbers.append(number)
    return tuple(numbers)


def list_text(value) -> str:
    """A list option's value as the text the run identity stores: text as given, a number or a
    list of numbers comma-joined (``0.1`` -> ``"0.1"``); checked by the option's parser."""
    if isinstance(value, str):
        return value
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return ",".join(repr(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool)
                    else str(v) for v in items)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a plug-in that has none."""


def option_defaults(options_cls: type) -> dict[str, Any]:
    """The options' defaults in declaration order (every field has one)."""
    return {f.name: f.default for f in dataclasses.fields(options_cls)}


def option_values(options) -> dict[str, Any]:
    """The options as plain values in declaration order: what checkpoints, configs and run
    identities store (not :func:`dataclasses.asdict`, which would copy nested containers)."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


def parse_options(kind: str, name: str, options_cls: type[T], given: Mapping[str, Any], *,
                  what: str = "option", others: Mapping[str, type] | None = None) -> T:
    """``options_cls`` built from ``given`` (KEY -> value), the other fields at their defaults.

    A value may be typed (a recipe, the Python API) or text from ``KEY=VALUE`` (the CLI); either
    is converted to the field's annotated type: ``int`` (not a bool, not 2.5), ``float`` (an
    int is widened), ``bool`` (``true``/``false`` as text), ``str``, ``Literal[...]`` or
    :func:`option` choices, ``X | None`` (``null``/``none`` as text), ``tuple[X, ...]`` (a list,
    or comma-separated text). The options' ``__post_init__`` then checks ranges and relations.
    Guarantee: the result's :func:`option_values` are typed as annotated, so equal settings give
    equal values whatever spelling they arrived in. Raises one :class:`SmoothcertError` line
    naming ``kind`` ``name`` (e.g. method 'catrs'), the key, and the valid keys (an unknown
    key; ``what`` is the family's word for an option; ``others``, the family's other plug-ins'
    ``Options`` by name, to say which of them takes it) or the allowed values (a bad value).
    """
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    unknown = [key for key in given if key not in fields]
    if unknown:
        raise SmoothcertError(_unknown_options(kind, name, what, unknown, fields, others or {}))
    hints = _type_hints(options_cls)
    try:
        values = {key: _converted(fields[key], hints[key], value) for key, value in given.items()}
        return options_cls(**values)
    except SmoothcertError as err:
        raise SmoothcertError(f"{kind} {name!r}: {err}") from None


def _unknown_options(kind: str, name: str, what: str, unknown: list, fields: Mapping,
                     others: Mapping[str, type]) -> str:
    """The one line for keys a plug-in does not take: its valid keys (or that it takes none),
    and which other plug-ins of its family take each key."""
    keys = ", ".join(map(str, unknown))
    said = (f"unknown {what}(s) {keys} for {kind} {name!r}; valid: {', '.join(fields)}"
            if fields else f"{kind} {name!r} takes no {what}s, got {keys}")
    article = "an" if what[:1] in "aeiou" else "a"
    for key in unknown:
        owners = sorted(repr(other) for other, options in others.items() if other != name
                        and key in {f.name for f in dataclasses.fields(options)})
        if owners:
            listed = owners[0] if len(owners) == 1 else \
                f"{', '.join(owners[:-1])} and {owners[-1]}"
            said += f"; {key} is {article} {what} of {kind}{'s' * (len(owners) > 1)} {listed}"
    return said


def describe_options(options_cls: type) -> list[str]:
    """One line per option for ``--help``: ``key (type, default D): doc``."""
    hints = _type_hints(options_cls)
    return [f"{f.name} ({_type_text(hints[f.name], f)}, default {_default_text(f.default)}): "
            f"{f.metadata.get('doc', '')}" for f in dataclasses.fields(options_cls)]


@functools.cache
def _type_hints(options_cls: type) -> dict[str, Any]:
    """The fields' annotations, evaluated once per class (they are strings under PEP 563)."""
    return typing.get_type_hints(options_cls)


class _Mismatch(Exception):
    """A value that does not convert to a type (turned into a SmoothcertError by the caller)."""


def _converted(f: dataclasses.Field, hint, value):
    """``value`` as the field's type, or a SmoothcertError naming the key and what it takes."""
    choices, convert = _choices(hint, f), f.metadata.get("convert")
    if convert is not None:
        return None if value is None or _is_text(value, _NULL_TEXTS) else convert(value)
    try:
        converted = _convert(hint, value)
    except _Mismatch:
        if choices:
            raise SmoothcertError(f"unknown {f.name} {value!r}; {f.name} must be one of "
                                  f"{', '.join(map(str, choices))}") from None
        raise SmoothcertError(f"{f.name} must be {_expected(hint)}, got {value!r}") from None
    if choices and converted is not None and converted not in choices:
        raise SmoothcertError(f"unknown {f.name} {value!r}; {f.name} must be one of "
                              f"{', '.join(map(str, choices))}")
    return converted


def _convert(hint, value):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise _Mismatch
    if origin in (typing.Union, types.UnionType):
        return _convert_union(args, value)
    if origin is tuple:
        return _convert_tuple(args, value)
    if hint in _SCALARS:
        return _SCALARS[hint](value)
    if hint is Any or isinstance(value, hint):
        return value
    raise _Mismatch


def _convert_union(args: tuple, value):
    if type(None) in args and (value is None or _is_text(value, _NULL_TEXTS)):
        return None
    for arg in args:
        if arg is not type(None):
            try:
                return _convert(arg, value)
            except _Mismatch:
                continue
    raise _Mismatch


def _convert_tuple(args: tuple, value) -> tuple:
    if isinstance(value, str):
        text = value.strip().removeprefix("[").removesuffix("]").strip()
        value = [item.strip() for item in text.split(",")] if text else []
    if not isinstance(value, (list, tuple)):
        raise _Mismatch
    kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
    if len(kinds) != len(value):
        raise _Mismatch
    return tuple(_convert(kind, item) for kind, item in zip(kinds, value))


def _is_text(value, texts) -> bool:
    return isinstance(value, str) and value.strip().lower() in texts


def _to_int(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise _Mismatch


def _to_float(value) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise _Mismatch from None
    raise _Mismatch


def _to_bool(value) -> bool:
    if isinstance(value, bool):
        return value
    if _is_text(value, _BOOL_TEXTS):
        return _BOOL_TEXTS[value.strip().lower()]
    raise _Mismatch


def _to_str(value) -> str:
    if isinstance(value, str):
        return value
    raise _Mismatch


_SCALARS = {int: _to_int, float: _to_float, bool: _to_bool, str: _to_str}
_SCALAR_TEXT = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _choices(hint, f: dataclasses.Field) -> tuple | None:
    if f.metadata.get("choices"):
        return f.metadata["choices"]
    literal = [a for a in (hint, *typing.get_args(hint)) if typing.get_origin(a) is typing.Literal]
    return typing.get_args(literal[0]) if literal else None


def _expected(hint) -> str:
    """What a value of type ``hint`` must be, in words ("an integer", "a number or null")."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _expected(a) for a in args)
    if origin is tuple:
        return f"a list of {_plural(args[0])}" if args and args[-1] is Ellipsis else \
            f"a list of {len(args)} values"
    return _SCALAR_TEXT.get(hint, getattr(hint, "__name__", str(hint)))


def _plural(hint) -> str:
    return {int: "integers", float: "numbers", bool: "booleans", str: "strings"}.get(hint, "values")


def _type_text(hint, f: dataclasses.Field) -> str:
    """A short type name for ``--help``: int, float, bool, str, a|b|c, float|null, list."""
    choices = _choices(hint, f)
    if choices:
        text = "|".join(map(str, choices))
        nullable = type(None) in typing.get_args(hint)
        return text + "|null" if nullable else text
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return "|".join("null" if a is type(None) else _type_text(a, f) for a in args)
    if origin is tuple:
        return "list"
    return getattr(hint, "__name__", str(hint))


def _default_text(default) -> str:
    if default is None:
        return "null"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, tuple):
        return ",".join(map(str, default)) or "empty"
    return str(default)


class Configurable:
    """A plug-in configured by one frozen dataclass of options, its class attribute ``Options``.

    ``Plugin(**given)`` (keywords: typed values or ``KEY=VALUE`` text) and ``Plugin(options)``
    (an ``Options`` instance) both go through :func:`parse_options`, so every way of building a
    plug-in is checked and typed alike. The instance keeps the options as ``self.settings`` and,
    for the plug-in's own code, each option as an attribute of the same name (``self.lbd``);
    :meth:`option_values` is what is stored. Subclasses set ``plugin_kind`` (the word in errors:
    "method", "certifier", ...) and ``option_word`` (the family's word for an option), and put
    state derived from the options in :meth:`setup`.
    """

    Options: ClassVar[type] = NoOptions
    plugin_kind: ClassVar[str] = "plug-in"
    option_word: ClassVar[str] = "option"
    name: str = ""
    family: ClassVar[Mapping[str, type] | None] = None  # the registry it was registered in

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        shadowed = [f.name for f in dataclasses.fields(cls.Options) if hasattr(cls, f.name)]
        if shadowed:  # an option copied to an attribute would hide a method or property
            raise TypeError(f"{cls.__name__}: option(s) {', '.join(shadowed)} shadow attributes")

    def __init__(self, settings=None, /, **given: Any):
        if settings is not None and (given or not isinstance(settings, self.Options)):
            raise TypeError(f"{type(self).__name__} takes one {self.Options.__qualname__} or "
                            "keyword options, not both")
        if settings is not None:
            given = option_values(settings)  # re-parsed: typed as annotated whoever built it
        others = {name: cls.Options for name, cls in (self.family or {}).items()
                  if isinstance(cls, type) and issubclass(cls, Configurable)}
        self.settings = parse_options(self.plugin_kind, self.name or type(self).__name__,
                                      self.Options, given, what=self.option_word, others=others)
        for key, value in option_values(self.settings).items():
            setattr(self, key, value)
        self.setup()

    def setup(self) -> None:
        """State derived from the options (an attack object, a schedule's start); none here."""
        return None

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """The options' defaults in declaration order."""
        return option_defaults(cls.Options)

    def option_values(self) -> dict[str, Any]:
        """The options as plain values: what checkpoints, configs and run identities store."""
        return option_values(self.settings)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.option_values().items())
        return f"{type(self).__name__}({args})"
