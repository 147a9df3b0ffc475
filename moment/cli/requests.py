"""A command's options made from a request model's fields (moment.requests): the help is the field's
description (or its `Cli` marker's help), the default the field's (or the marker's), the spelling, short
alias, metavar and show_default the marker's. Typer reads the command's `__signature__`, so the
generated options are parameters of that signature, and the command receives them as keywords."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from moment.requests import FIELD_DEFAULT, Cli, cli_of


def request_params(model: Any, *, exclude: Sequence[str] = ()) -> dict[str, inspect.Parameter]:
    """One typer option (or argument, where its marker says so) per field of `model` that the command line
    takes, in the model's order."""
    out = {}
    for name, field in model.model_fields.items():
        mark = cli_of(field) or Cli()
        if name in exclude or not mark.cli:
            continue
        if mark.default is not FIELD_DEFAULT:
            default = mark.default
        elif field.is_required():
            default = inspect.Parameter.empty
        else:
            default = field.get_default(call_default_factory=True)
        text = mark.help if mark.help is not None else field.description
        option = (typer.Argument(help=text, metavar=mark.metavar, show_default=mark.show_default) if mark.argument
                  else typer.Option(*(mark.flags or ("--" + name.replace("_", "-"),)), help=text,
                                    metavar=mark.metavar, show_default=mark.show_default))
        kind = mark.type if mark.type is not None else field.annotation
        out[name] = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind, option],
                                      default=default)
    return out


def request_options(*models: Any, exclude: Sequence[str] = (),
                    order: Sequence[str] = ()) -> Callable[[Callable], Callable]:
    """Decorate a command `def cmd(<its own options>, **request)`: its options are its own and one per
    field of `models` (a field of a later model that an earlier one has is the earlier one's option; those
    in `order` first, in that order, then the models', then its own); the values of the models' arrive in
    `request` (None where the CLI's default is None: the model's default)."""
    def deco(func: Callable) -> Callable:
        own = {n: p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for n, p in inspect.signature(func, eval_str=True).parameters.items()
               if p.kind is not inspect.Parameter.VAR_KEYWORD}
        generated: dict[str, inspect.Parameter] = {}
        for model in models:
            generated |= {n: p for n, p in request_params(model, exclude=exclude).items() if n not in generated}
        params = {**generated, **own}
        names = [n for n in order if n in params] + [n for n in params if n not in order]
        func.__signature__ = inspect.Signature([params[n] for n in names])  # type: ignore[attr-defined]
        return func

    return deco


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The values the command line gave (None: left out, the model's default applies)."""
    return {k: v for k, v in values.items() if v is not None}
