"""The field types a job spec and every provider's options share: durations, storage URIs, one-token settings,
and the strict base model (unknown keys are errors). Provider ``options.py`` modules build on these, so the spec and
its providers' blocks read and fail the same way."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator

from cloudtrain.storage.uris import check_uri

_DURATION_RE = re.compile(r"(?:(\d{1,30})d)?(?:(\d{1,30})h)?(?:(\d{1,30})m)?(?:(\d{1,30})s)?")
# No platform runs a job for more than a few weeks (SageMaker 28 days, Azure ML 21); a year bounds every duration so
# a typo such as 1d99999999999999999999h is refused instead of reaching a cost estimate or a platform's SDK.
MAX_DURATION = 365 * 24 * 3600


def parse_duration(value: Any) -> Any:
    """Accept seconds (int) or strings such as ``90s``, ``30m``, ``2h``, ``1d12h``; return seconds."""
    seconds: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str):
        text = value.strip().lower()
        if text.isdecimal() and len(text) <= 30:
            seconds = int(text)
        elif text and (match := _DURATION_RE.fullmatch(text)):
            days, hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
            seconds = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    if seconds is None:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise ValueError(f"{shown} is not a duration; use seconds or a string such as '30m', '2h', '1d12h'")
    if seconds > MAX_DURATION:
        raise ValueError(f"{value!r} is more than a year ({seconds:.3g} s); write the time the job may take, "
                         "e.g. '24h' or '7d'")
    return seconds


Duration = Annotated[int, BeforeValidator(parse_duration, json_schema_input_type=int | str), Field(ge=1)]


def _off(value: Any) -> Any:
    # YAML reads a bare `off` as false; `--max-idle off` and `--set max_idle=off` arrive as text
    if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    if str(value).strip() in ("0", "0s"):
        raise ValueError("0 would stop the job at once; write off to turn it off")
    return value


def _auto_or_duration(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    seconds = parse_duration(value)
    if isinstance(seconds, int) and seconds < 1:
        raise ValueError("an interval is at least 1 second (or auto)")
    return seconds


# checkpoint.interval: a duration, or 'auto' (cloudtrain.plan.checkpoint_interval chooses it when the job is planned)
IntervalOrAuto = Annotated[int | Literal["auto"], BeforeValidator(_auto_or_duration, json_schema_input_type=int | str)]

# A limit that can be switched off (max_idle): 'off' (or YAML's false, or null) is None, and is written as "off"
DurationOrOff = Annotated[Duration | None, BeforeValidator(_off, json_schema_input_type=int | str | bool | None),
                          PlainSerializer(lambda v: "off" if v is None else v)]
Uri = Annotated[str, Field(min_length=1, description="Object storage URI: file://, s3://, gs://, az:// or abfs://"),
                AfterValidator(check_uri)]


def _usd(value: Any) -> Any:
    """An amount of US dollars: a number, or text such as "250", "$99.50", "1,000"."""
    if isinstance(value, bool):
        raise ValueError("must be an amount in USD, e.g. 250 or 99.50")
    if isinstance(value, str):
        text = value.strip().removeprefix("$").replace(",", "").strip()
        try:
            value = float(text) if len(text) <= 30 else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError("must be an amount in USD, e.g. 250 or 99.50")
    if isinstance(value, (int, float)) and not 0 < value < MAX_USD:  # also false for nan
        raise ValueError(f"must be more than 0 and less than {MAX_USD:,} USD")
    if isinstance(value, (int, float)) and value < MIN_USD:
        raise ValueError(f"must be at least {MIN_USD:.6f} USD (a millionth of a dollar): a smaller amount prices "
                         "nothing, and what a budget buys at it is beyond any number")
    return value


MAX_USD = 10 ** 8  # far beyond any one job's budget: a typo, refused before it reaches a plan
MIN_USD = 1e-6  # below it a price is no price: a budget divided by it overflows (5e-324 -> inf)
Usd = Annotated[float, BeforeValidator(_usd, json_schema_input_type=float | str), Field(gt=0, allow_inf_nan=False)]


def shaped(pattern: str, what: str, example: str) -> Any:
    """A field validator for a name the platform spells one way (a region): None passes, else it must match."""
    compiled = re.compile(pattern)

    def check(value: Any) -> Any:
        if isinstance(value, str) and not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}: write it as the platform names it, e.g. {example}")
        return value

    return check


# The longest name (one file or folder) and path in bytes that Linux file systems hold (ext4, xfs, overlayfs: the
# nodes' disks); a longer one plans fine and fails the job with "File name too long" when it is first written.
NAME_MAX, PATH_MAX = 255, 4095


def path_problem(text: str) -> str | None:
    """Why no file system holds a path spelled ``text``, or None: a NUL byte, a name longer than NAME_MAX bytes, a
    path longer than PATH_MAX bytes (UTF-8, as a node writes it)."""
    if "\0" in text:
        return "holds a NUL byte (\\0), which no file name may"
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > PATH_MAX:
        return f"is {size} bytes long: no file system holds a path longer than {PATH_MAX} bytes"
    name = max(text.split("/"), key=lambda part: len(part.encode("utf-8", "surrogateescape")))
    if (size := len(name.encode("utf-8", "surrogateescape"))) > NAME_MAX:
        return (f"holds a name of {size} bytes ({name[:24]}...): no file system holds a file or folder name longer "
                f"than {NAME_MAX} bytes")
    return None


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


def one_token(value: Any, unicode_ok: bool = False) -> Any:
    """A setting such as a region, project, bucket, ARN, machine type or workspace: one token of printable text
    (ASCII unless ``unicode_ok``), never empty, without spaces, controls or invisible format characters."""
    for text in value if isinstance(value, list) else [value]:
        if not isinstance(text, str):
            continue
        if not text:
            raise ValueError("must not be empty (leave the setting out, or write null)")
        if len(text) > 1024:
            raise ValueError(f"is {len(text)} characters long; a setting is one name or identifier")
        if any(ch.isspace() or not ch.isprintable() or (not unicode_ok and not ch.isascii()) for ch in text):
            raise ValueError(f"{text!r} must be one name or identifier: "
                             + ("no spaces or control characters" if unicode_ok else
                                "ASCII letters, digits and punctuation, no spaces"))
    return value


class Settings(Model):
    """Provider settings: each string is one token (see one_token)."""

    unicode_fields: ClassVar[frozenset[str]] = frozenset()  # settings whose names may be any printable text

    @field_validator("*")
    @classmethod
    def _tokens(cls, value: Any, info: Any) -> Any:
        return one_token(value, unicode_ok=info.field_name in cls.unicode_fields)
