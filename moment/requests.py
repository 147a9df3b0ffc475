"""Typed requests: one pydantic model per use case (`PlanRequest`, `PlaceRequest`), the only place its
options' defaults, types and help are declared.

A field's `Cli` marker (in its `Annotated` metadata) says how the command line spells it: the flag and
its short alias, the metavar, whether --help shows the default, and, where the CLI differs from the
model, the CLI's own default or the type it parses. The command's options are generated from the
fields (moment.cli.requests), the service derives its request bodies from the same models (adding its
limits), so an option declared here is taken by both with one default.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError, create_model, model_validator
from pydantic_core import PydanticCustomError, PydanticUndefined

from moment.errors import MomentError, validation_error

#: Cli.default left out: the CLI's default is the field's
FIELD_DEFAULT: Any = type("FieldDefault", (), {"__repr__": lambda self: "FIELD_DEFAULT"})()


@dataclass(frozen=True)
class Cli:
    """How a request field is given on the command line (its help is the field's description, unless
    `help` says otherwise)."""

    flags: tuple[str, ...] = ()  # default: ("--field-name",); "--x/--no-x" for a bool switch pair
    help: str | None = None
    metavar: str | None = None
    show_default: bool | str = True
    default: Any = FIELD_DEFAULT  # the CLI's default where it differs (None: left to the model's default)
    type: Any = None  # the type the CLI parses where it differs from the field's (e.g. str for "25,10")
    cli: bool = True  # False: not an option of the command (e.g. what only the service sets)
    argument: bool = False  # True: a positional argument of the command, not an option (flags unused)


#: the error type of a truth value given for a number; its `field` (ctx) is the field of the model it is about
TRUTH_VALUE = "truth_value"


class NoTruthValueForANumber(BaseModel):
    """A model whose number fields refuse `true`/`false`: pydantic takes a bool for a number (`gpus: true` planned
    1 GPU, `bandwidth_gbps: true` in a profile or a `--set` was 1 GB/s), and strict mode would refuse the enums'
    names too. The one rule of the machine models, the library's requests and the service's bodies."""

    @model_validator(mode="before")
    @classmethod
    def _no_truth_value_for_a_number(cls, data: object) -> object:
        if isinstance(data, dict):
            for key in _number_keys(cls):
                if isinstance(data.get(key), bool):
                    raise PydanticCustomError(TRUTH_VALUE, "{field}: {value} is a truth value, not a number",
                                              {"field": key, "value": str(data[key]).lower()})
        return data


@cache
def _number_keys(cls: type[BaseModel]) -> tuple[str, ...]:
    """The names (and aliases) of a model's fields that take a number (asked once a class: every node of every
    topology is validated)."""
    return tuple(key for name, field in cls.model_fields.items() if _numeric(field.annotation)
                 for key in dict.fromkeys((name, field.alias or name)))


def _numeric(annotation: object) -> bool:
    """Whether a field's type takes an int or a float (its own, or one of a union's or Annotated's)."""
    if annotation in (int, float):
        return True
    return any(_numeric(a) for a in getattr(annotation, "__args__", ()) if a is not bool)


class Request(NoTruthValueForANumber):
    """A typed request. Built wrong in a script (a field of the wrong type, one it does not have, one missing), it
    is one MomentError naming each field, what `except moment.MomentError` catches (pydantic's ValidationError
    escaped it). The service reads its bodies with `model_validate`, which answers them as 422s itself."""

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise validation_error(e, type(self).__name__) from None


def expect(req: Any, kind: type, call: str) -> None:
    """`req` is a `kind` (a script passed None or a dict to `moment.plan`: an AttributeError deep inside)."""
    if not isinstance(req, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise MomentError(f"{call} takes {article} {kind.__name__}, not {type(req).__name__}",
                          hint=f"build one: moment.{kind.__name__}(...) (docs/python-api.md)")


def cli_of(field: Any) -> Cli | None:
    """The field's Cli marker (a pydantic FieldInfo's metadata), or None."""
    for m in getattr(field, "metadata", ()):
        if isinstance(m, Cli):
            return m
    return None


def given_fields(req: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields of `names` the request set itself (None for those left at their defaults)."""
    return {k: getattr(req, k) if k in req.model_fields_set else None for k in names}


def derive(base: Any, name: str, *, bases: tuple[type, ...] = (), exclude: tuple[str, ...] = (),
           only: tuple[str, ...] | None = None, types: dict[str, Any] | None = None,
           limits: dict[str, dict[str, Any]] | None = None, describe: dict[str, str | None] | None = None,
           extra: dict[str, Any] | None = None, doc: str | None = None, module: str | None = None) -> Any:
    """A request model made from `base`'s fields (their defaults, aliases, descriptions and markers),
    after `bases`' own: `only`/`exclude` choose the fields, `types` replaces a field's type (a closed
    choice where the library takes any string and names a bad one itself), `limits` adds constraints
    (`{"gpus": {"ge": 0, "le": 256}}`; a default there replaces the field's), `describe` replaces
    descriptions, `extra` adds fields (`name: (type, FieldInfo)`) after them. The service's bodies are
    made this way from the library's requests, so a default is declared once."""
    types, limits, describe = types or {}, limits or {}, describe or {}
    fields: dict[str, Any] = {}
    for n, f in base.model_fields.items():
        if n in exclude or (only is not None and n not in only):
            continue
        kw: dict[str, Any] = {"description": describe.get(n, f.description)}
        if f.default_factory is not None:
            kw["default_factory"] = f.default_factory
        elif f.default is not PydanticUndefined:
            kw["default"] = f.default
        if {"default", "default_factory"} & set(limits.get(n, {})):  # the service's own default
            kw.pop("default", None)
            kw.pop("default_factory", None)
        kw |= limits.get(n, {})
        if f.alias is not None:
            kw["alias"] = f.alias
        kind = types.get(n, f.annotation)
        fields[n] = (Annotated[(kind, *f.metadata)] if f.metadata else kind, Field(**kw))
    fields.update(extra or {})
    return create_model(name, __base__=bases or (BaseModel,), __module__=module or base.__module__,
                        __doc__=doc if doc is not None else base.__doc__, **fields)


def narrow(model: Any, req: Any, **values: Any) -> Any:
    """`req` (a request derived from `model`, or one with more fields) as a `model`: its values of
    `model`'s fields, those it set itself still set, the others left at `model`'s defaults; `values`
    set the fields it has no value for (the paths the service made of its names)."""
    return model.model_validate({k: getattr(req, k) for k in model.model_fields
                                 if k in req.model_fields_set and hasattr(req, k)} | values)
