"""What a recorded value may be, written on the record types themselves: the records are the journey
file's schema, and pydantic checks a file against these annotations when it reads one.

Reading checks every leaf strictly (no "0.5" for a number, no 1 for a flag); every list has a length
bound and stops at its first bad element (FailFast), so a file of many bad numbers makes one error,
not one per number; every string is made safe to print (control characters become their <0x..>
form, so an escape sequence in a file can never reach the terminal). Building a record in the
process checks nothing: these are annotations, not code on the hot path.

A small record is kept in a file as a JSON array of its fields (`row`), as tokenviz always has.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Annotated, TypeVar, cast

from pydantic import AfterValidator, FailFast, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from tokenviz.contract.text import safe_text

MAX_TOKENS = 131_072  # chips or records in one journey
MAX_LAYERS = 4096
MAX_CANDIDATES = 1024  # a top-n list (tokenviz keeps 20)
MAX_STAGES = 32  # sampling stages of one decision (tokenviz has at most 8)
MAX_FOLLOWED = 64  # tokens followed through the stages (tokenviz follows at most 25)
MAX_PLACES = 64  # GPUs, the CPU and the disk
MAX_EXPERTS_PER_TOKEN = 64
FAIL_FAST = FailFast()  # a list stops at its first bad element

# What reading a file hands the validators (pydantic's validation context).
GRAMMARS = "grammars"  # {digest: Grammar}: the grammars the file holds, which its settings name
INTERVENTION_SETS = "intervention_sets"  # [(Intervention, ...)]: each set the file's records name, once


def unicode(text: str) -> str:
    """Refuse a string JSON can carry but Unicode cannot (a lone surrogate, \\ud800): it could not
    be printed, exported or saved again."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text is not valid Unicode (it holds a lone surrogate)") from None
    return text


def first_error(exc: ValidationError) -> str:
    """pydantic's first complaint as one line: the field where it is, and what is wrong there."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "the top level"
    return f"at {safe_text(where)}: {safe_text(str(error['msg']).removeprefix('Value error, '))}"


Text = Annotated[str, Field(strict=True), AfterValidator(unicode), AfterValidator(safe_text)]
Flag = Annotated[bool, Field(strict=True)]
Count = Annotated[int, Field(strict=True, ge=0)]
Id = Count
Positive = Annotated[int, Field(strict=True, ge=1)]
Probability = Annotated[float, Field(strict=True, ge=0.0, le=1.0 + 1e-6, allow_inf_nan=False)]
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(strict=True, ge=0.0, allow_inf_nan=False)]
Place = Annotated[str, Field(strict=True, pattern=r"^[a-z]{2,8}(:\d{1,3})?$")]  # cuda:0, cpu, disk, …

T = TypeVar("T")
_REPLACE: Callable[..., object] = dataclasses.replace  # called with values mypy cannot know: see `replaced`


def replaced(record: T, changes: Mapping[str, object]) -> T:
    """`record` (a dataclass) with `changes`, as dataclasses.replace makes it: values read from a file or
    typed by the user, which the record's own checks (its __post_init__, a file's schema) judge."""
    return cast(T, _REPLACE(record, **changes))


def row(*names: str) -> Callable[[type[T]], type[T]]:
    """Keep a dataclass in a file as a JSON array of the fields `names`, in order (the rest take
    their defaults when read): a record of thousands of candidates, without a key in each."""

    def decorate(cls: type[T]) -> type[T]:
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        called = re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()  # "a token chip"
        needed = sum(1 for name in names if fields[name].default is fields[name].default_factory is dataclasses.MISSING)

        def fields_of(value: object) -> object:
            if not isinstance(value, list | tuple):
                return value  # the dataclass's own schema says what is wrong with it
            if not needed <= len(value) <= len(names):
                span = f"{needed} to {len(names)}" if needed < len(names) else str(len(names))
                raise ValueError(f"a {called} is a list of {span} values, not {len(value)}")
            return dict(zip(names, value))

        def as_row(value: object, serialize: core_schema.SerializerFunctionWrapHandler) -> list[object]:
            saved = serialize(value)
            return [saved[name] for name in names]

        def core(source: type[T], handler: GetCoreSchemaHandler) -> CoreSchema:
            fields = dict(handler(source))
            ref = fields.pop("ref", None)  # where the class is used again, the reference is to the row
            return core_schema.no_info_before_validator_function(
                fields_of,
                cast(CoreSchema, fields),
                ref=ref,
                serialization=core_schema.wrap_serializer_function_ser_schema(as_row),
            )

        def json_schema(schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
            whole = handler.resolve_ref_schema(handler(schema))
            if "properties" not in whole:  # made already: a type used twice
                return whole
            items = [whole["properties"][name] for name in names]
            return {"type": "array", "prefixItems": items, "minItems": needed, "maxItems": len(names)}

        cls.__get_pydantic_core_schema__ = classmethod(lambda _, s, h: core(s, h))  # type: ignore[attr-defined]
        cls.__get_pydantic_json_schema__ = classmethod(lambda _, s, h: json_schema(s, h))  # type: ignore[attr-defined]
        return cls

    return decorate
