"""The two helpers every config dataclass uses: `option` (a field with its help text) and `check` (validation).

A config documents each field once (the help text becomes the `--flag`'s help through HfArgumentParser) and
validates itself once, in `__post_init__`, with `check`: a bad value fails at construction, before any work,
as one `UserError` that names the field, the value and what would be valid.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import field, fields
from typing import Any

from .errors import UserError


def option(text: str, default: Any = None, **kwargs: Any) -> Any:
    """A dataclass field with a help text (shown by `--help` of the CLIs built with HfArgumentParser).

    Pass `default=dataclasses.MISSING` for a required flag; extra keyword arguments go to `dataclasses.field`.
    """
    return field(default=default, metadata={"help": text}, **kwargs)


def derived() -> Any:
    """A field computed in `__post_init__` from the others (not a flag, not a constructor argument)."""
    return field(init=False, repr=False, compare=False)


def check(ok: bool, name: str, value: Any, wanted: str) -> None:
    """Raise `UserError("{name} must be {wanted} (got {value}); pass --{name} ...")` unless `ok`."""
    if not ok:
        raise UserError(f"{name} must be {wanted} (got {value!r}); pass --{name} with a valid value")


class TracksGiven:
    """A config dataclass that remembers which fields its constructor was given, as pydantic's `model_fields_set`.

    An algorithm's record fills in only the settings a caller left out (`given(cfg)` tells which): a Python caller
    who writes `RLHFConfig(batch_size=16)` for DAPO gets DAPO's rollout, and one who writes `kl_coef=0.1` gets 0.1
    even where that is the dataclass's default. `dataclasses.replace` and the command line give every field.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        self = super().__new__(cls)
        names = [f.name for f in fields(cls) if f.init]  # type: ignore[arg-type]
        object.__setattr__(self, "_given", frozenset(names[: len(args)]) | frozenset(kwargs))
        return self


def given(config: Any) -> frozenset[str]:
    """The fields `config`'s constructor was given (every field, for a config that does not track them)."""
    if isinstance(config, TracksGiven):
        return config.__dict__.get("_given", frozenset())
    return frozenset(f.name for f in fields(config) if f.init)


def non_default(config: Any, names: Iterable[str]) -> list[str]:
    """Those of `names` whose value in `config` differs from its dataclass field's default: what a consumer that
    does not read them must refuse (`cartpole.train.check_reads`, `checkable.check_reads`)."""
    defaults = {f.name: f.default for f in fields(config)}
    return [name for name in names if getattr(config, name) != defaults[name]]


SEED_LIMIT = 2**32  # numpy's and torch's generators both take seeds in [0, 2**32)


def check_seed(value: int, name: str = "seed") -> None:
    """A seed every generator here accepts: an integer in [0, 2**32)."""
    check(isinstance(value, int) and 0 <= value < SEED_LIMIT, name, value, "an integer from 0 to 4294967295")


def parse_list(name: str, text: str, kind: type, wanted: str) -> list[Any]:
    """Parse a comma-separated flag (`"4,16,64"`) into values of `kind`; a bad item is a `UserError`."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = None
    check(bool(values), name, text, f"comma-separated {wanted}")
    return values  # type: ignore[return-value]


def parse_names(name: str, text: str, allowed: Iterable[str]) -> list[str]:
    """Parse a comma-separated flag of names (`"ppo, grpo"`), each one of `allowed`; otherwise a `UserError`."""
    allowed = list(allowed)
    names = [x.strip() for x in text.split(",") if x.strip()]
    check(
        bool(names) and all(n in allowed for n in names), name, text, f"comma-separated names from {', '.join(allowed)}"
    )
    return names
