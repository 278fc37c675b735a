"""A predictor's ``predict`` signature read once, into parameters and a request schema.

The same reading serves ``genhook.model.Model`` classes and Cog ``BasePredictor`` classes:
``Input(...)`` of either (Cog's is a dataclass with the same names) gives the default,
bounds, choices and description; ``cog.Path`` is a ``pathlib.Path``, ``cog.File`` an open
file. The wire schema is strict like the built-in ones: a bad value is a 400 naming the field
(``image``, ``frames[2]``), and a file input is an http(s) URL (fetched by the worker under
the address policy) or a base64 data URL (stored with the task).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import io
import mimetypes
import pathlib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from PIL import Image
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    model_validator,
)

from genhook.data_urls import HEADER_RE, decode_data_url, inline_data, is_data_url
from genhook.engines.audio import sniff_audio_format
from genhook.engines.edit_request import IMAGE_REFS, MAX_IMAGE_URL_CHARS, ImageRef, parse_image_ref
from genhook.media import sniff_image_format
from genhook.model import InputSpec, Output
from genhook.net._urls import TargetRefused, parse_target
from genhook.storage.blobs import CONTENT_TYPE_BY_EXTENSION

# Request fields every submit has; a predictor may not name a parameter after one.
RESERVED = frozenset({"model", "webhook_url", "webhook_events", "priority"})
# Where a field's parsed file inputs wait, in the validation context, for the model check.
_FILE_REFS = "predictor_file_refs"


class Kind(StrEnum):
    STR = "str"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    CHOICE = "choice"
    IMAGE = "image"  # PIL.Image.Image: decoded under the pixel limits
    PATH = "path"  # pathlib.Path (cog.Path): any file, written to a temporary file
    OPEN_FILE = "open_file"  # cog.File: the same file, opened for reading
    SECRET = "secret"  # noqa: S105 - cog.Secret: a string, wrapped

    @property
    def is_file(self) -> bool:
        return self in (Kind.IMAGE, Kind.PATH, Kind.OPEN_FILE)


@dataclass(frozen=True, slots=True)
class Param:
    """One ``predict`` parameter as the service sees it."""

    name: str
    kind: Kind
    many: bool  # list[...] of ``kind``
    optional: bool  # ``T | None``: null allowed
    required: bool
    default: Any
    spec: InputSpec
    # The annotation's own class (cog.Path, cog.Secret), to build the value predict expects.
    cls: type[Any] | None = None
    choices: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ``predict`` declares it returns: whether it may yield (an iterator, collected),
    and the content type of its ``bytes`` when declared."""

    iterates: bool
    content_type: str | None
    # Cog's ``ConcatenateIterator[str]``: the strings it yields are one text, joined.
    concatenates: bool = False


class SignatureError(ValueError):
    """A ``predict`` the service cannot serve; the message names the parameter."""


def read_params(function: Callable[..., Any]) -> list[Param]:
    """The parameters of ``function`` (a bound or unbound ``predict``), after ``self``."""
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as exc:  # a name the annotation refers to does not resolve
        raise SignatureError(f"predict's annotations cannot be read: {exc}") from None
    params: list[Param] = []
    for name, parameter in inspect.signature(function).parameters.items():
        if name == "self":
            continue
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise SignatureError(f"predict's *{name} cannot be a request field; name each input")
        if name in RESERVED:
            raise SignatureError(f"predict's parameter {name!r} clashes with the request's field")
        if name not in hints:
            raise SignatureError(f"predict's parameter {name!r} has no type annotation")
        params.append(_param(name, hints[name], parameter.default))
    return params


def _param(name: str, annotation: Any, default: Any) -> Param:
    spec = _spec(default)
    annotation, optional = _strip_optional(_strip_annotated(annotation))
    many = False
    if typing.get_origin(annotation) in (list, collections.abc.Sequence, typing.List):  # noqa: UP006
        (annotation,) = typing.get_args(annotation) or (Any,)
        annotation = _strip_annotated(annotation)
        many = True
    kind, cls, choices = _kind(name, annotation)
    if spec.choices is not None:
        if kind not in (Kind.STR, Kind.INT, Kind.FLOAT, Kind.CHOICE):
            raise SignatureError(f"predict's parameter {name!r}: choices need a str or int input")
        kind, choices = Kind.CHOICE, spec.choices
    default_value = spec.default
    required = default_value is ...
    if required and optional:
        required, default_value = False, None
    if kind.is_file and not required and default_value not in (None, []):
        raise SignatureError(
            f"predict's parameter {name!r}: a file input's default must be None (or [])"
        )
    return Param(name, kind, many, optional, required, default_value, spec, cls, choices)


def _spec(default: Any) -> InputSpec:
    """``Input(...)`` of genhook or of Cog, or a plain default, as an ``InputSpec``."""
    if isinstance(default, InputSpec):
        return default
    if default is inspect.Parameter.empty:
        return InputSpec()
    if type(default).__module__.startswith("cog") and type(default).__name__ == "FieldInfo":
        fields = {f.name: getattr(default, f.name) for f in dataclasses.fields(default)}
        # Cog's Input() without a default is required (None unless the type is optional).
        value = fields["default"]
        return InputSpec(
            default=... if value is None else value,
            description=fields.get("description"),
            ge=fields.get("ge"),
            le=fields.get("le"),
            min_length=fields.get("min_length"),
            max_length=fields.get("max_length"),
            regex=fields.get("regex"),
            choices=None if fields.get("choices") is None else tuple(fields["choices"]),
        )
    return InputSpec(default=default)


def _strip_annotated(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return _strip_annotated(args[0]), True
    return annotation, False


def _kind(name: str, annotation: Any) -> tuple[Kind, type[Any] | None, tuple[Any, ...]]:
    if typing.get_origin(annotation) is Literal:
        values = typing.get_args(annotation)
        if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
            raise SignatureError(f"predict's parameter {name!r}: Literal values must be str or int")
        return Kind.CHOICE, None, values
    simple = {str: Kind.STR, int: Kind.INT, float: Kind.FLOAT, bool: Kind.BOOL}
    if annotation in simple:
        return simple[annotation], None, ()
    if isinstance(annotation, type):
        if issubclass(annotation, Image.Image):
            return Kind.IMAGE, None, ()
        if issubclass(annotation, pathlib.PurePath):
            return Kind.PATH, annotation, ()
        if issubclass(annotation, io.IOBase):
            return Kind.OPEN_FILE, None, ()
        if annotation.__name__ == "Secret" and annotation.__module__.startswith("cog"):
            return Kind.SECRET, annotation, ()
    raise SignatureError(
        f"predict's parameter {name!r} has the type {annotation!r}; inputs may be str, int, "
        "float, bool, Literal[...], PIL.Image.Image, pathlib.Path or a list of one of them"
    )


def read_outcome(function: Callable[..., Any], fallback_type: str | None) -> Outcome:
    """Check ``predict``'s return annotation (when it has one) against what the service
    can store; ``fallback_type`` is the class's ``output_content_type``."""
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as exc:
        raise SignatureError(f"predict's annotations cannot be read: {exc}") from None
    annotation = hints.get("return", Any)
    content_type = _declared_type(annotation) or fallback_type
    annotation = _strip_annotated(annotation)
    iterates = inspect.isgeneratorfunction(function)
    origin = typing.get_origin(annotation)
    if (
        origin is not None
        and isinstance(origin, type)
        and issubclass(origin, collections.abc.Iterator)
    ):
        iterates = True
    item = annotation
    if origin is not None and origin not in (Literal, Annotated):
        args = [a for a in typing.get_args(item) if a is not type(None)]
        if (origin in (typing.Union, types.UnionType) and len(args) == 1) or (
            origin is not dict and args
        ):
            item = args[0]
        content_type = content_type or _declared_type(item)
        item = _strip_annotated(item)
    if item is bytes and content_type is None:
        raise SignatureError(
            "predict returns bytes without a content type: annotate it "
            '-> Annotated[bytes, Output("audio/wav")] or set output_content_type'
        )
    concatenates = getattr(typing.get_origin(annotation), "__name__", "").endswith(
        "ConcatenateIterator"
    )
    return Outcome(iterates, content_type, concatenates)


def _declared_type(annotation: Any) -> str | None:
    if typing.get_origin(annotation) is Annotated:
        for extra in typing.get_args(annotation)[1:]:
            if isinstance(extra, Output):
                return extra.content_type
    return None


# --- the request schema ---------------------------------------------------------------


def request_schema(model_id: str, params: list[Param], description: str) -> type[BaseModel]:
    """The strict wire schema of a predictor model: ``model``, one field per parameter,
    ``webhook_url``. File inputs stay strings here (their URL, or a data URL's type once
    stored: ``data:image/png``); their bytes go with the task's inputs, in parameter order."""
    fields: dict[str, Any] = {"model": (StrictStr, ...)}
    for param in params:
        fields[param.name] = _field(param)
    fields["webhook_url"] = (StrictStr | None, None)
    schema: type[BaseModel] = create_model(
        f"Predictor_{''.join(c if c.isalnum() else '_' for c in model_id)}",
        __base__=_PredictorRequest,
        __doc__=description or None,
        **fields,
    )
    schema._params = params  # type: ignore[attr-defined]
    return schema


class _PredictorRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    # File fields dump as a short note of themselves, so the task row keeps them in place
    # (``tasks/submission.stored_params``): the engine counts a list's files from them.
    keeps_file_fields: ClassVar[bool] = True

    @model_validator(mode="after")
    def _collect_files(self, info: ValidationInfo) -> _PredictorRequest:
        """Hand the file inputs, in parameter order and labelled by field, to submission,
        which stores data URLs with the task and URLs for the worker to fetch."""
        context = info.context
        if not isinstance(context, dict):
            return self
        parsed: dict[str, list[ImageRef]] = context.pop(_FILE_REFS, {})
        refs: list[ImageRef] = []
        for param in type(self)._params:  # type: ignore[attr-defined]
            found = parsed.get(param.name, [])
            for index, ref in enumerate(found):
                label = f"{param.name}[{index}]" if param.many else param.name
                refs.append(dataclasses.replace(ref, field=label))
        context[IMAGE_REFS] = refs
        return self


def _field(param: Param) -> tuple[Any, Any]:
    spec = param.spec
    extra: dict[str, Any] = {}
    if spec.description:
        extra["description"] = spec.description
    item: Any
    item_bounds: dict[str, Any] = {}
    if param.kind is Kind.STR or param.kind is Kind.SECRET:
        item = StrictStr
        item_bounds = _compact(
            min_length=None if param.many else spec.min_length,
            max_length=None if param.many else spec.max_length,
            pattern=spec.regex,
        )
    elif param.kind is Kind.INT:
        item = StrictInt
        item_bounds = _compact(ge=spec.ge, le=spec.le, gt=spec.gt, lt=spec.lt)
    elif param.kind is Kind.FLOAT:
        item = float
        item_bounds = _compact(ge=spec.ge, le=spec.le, gt=spec.gt, lt=spec.lt)
    elif param.kind is Kind.BOOL:
        item = StrictBool
    elif param.kind is Kind.CHOICE:
        item = Literal[param.choices]
    else:
        item = _file_type(param.kind)
    if item_bounds:
        item = Annotated[item, Field(**item_bounds)]
    annotation: Any = item
    if param.many:
        annotation = list[item]
        extra.update(_compact(min_length=spec.min_length, max_length=spec.max_length))
    elif param.kind in (Kind.STR, Kind.SECRET):
        pass  # the string's own bounds are on the item
    if param.optional:
        annotation = annotation | None
    default = ... if param.required else param.default
    if isinstance(default, list):
        return annotation, Field(default_factory=lambda d=default: list(d), **extra)
    return annotation, Field(default, **extra)


def _compact(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _file_type(kind: Kind) -> Any:
    media = "image/*" if kind is Kind.IMAGE else "application/octet-stream"
    parse = _parse_image if kind is Kind.IMAGE else _parse_file
    return Annotated[
        StrictStr,
        AfterValidator(parse),
        PlainSerializer(brief, return_type=str),
        WithJsonSchema({"type": "string", "format": "uri", "contentMediaType": media}),
    ]


def _parse_image(value: str, info: ValidationInfo) -> str:
    return _keep(parse_image_ref(value, inline_data(info.context)), value, info)


def _parse_file(value: str, info: ValidationInfo) -> str:
    return _keep(parse_file_ref(value, inline_data(info.context)), value, info)


def _keep(ref: ImageRef, value: str, info: ValidationInfo) -> str:
    if isinstance(info.context, dict) and info.field_name is not None:
        info.context.setdefault(_FILE_REFS, {}).setdefault(info.field_name, []).append(ref)
    return value


def brief(value: str) -> str:
    """What the task's stored parameters keep of a file input: its URL, or a data URL's
    header alone (``data:audio/wav``); the bytes are stored once, as the task's input."""
    if value.startswith("data:"):
        match = HEADER_RE.match(value[:512])
        return f"data:{match.group(1)}" if match else "data:"
    if value.startswith(("http:", "https:")):
        return value
    return "data:"  # a placeholder the body parser left for a data URL


def parse_file_ref(value: str, inline: Any = None) -> ImageRef:
    """A ``pathlib.Path`` input: an http(s) URL to fetch, or a data URL of any bytes. The
    bytes name their type when they are a picture or audio; otherwise the data URL does."""
    if is_data_url(value, inline):
        data = decode_data_url(value, inline)
        if not data:
            raise ValueError("the data URL holds no bytes")
        declared = HEADER_RE.match(value[:512])
        fmt, content_type = file_format(data, declared.group(1) if declared else "")
        return ImageRef(data=data, format=fmt, content_type=content_type)
    if len(value) > MAX_IMAGE_URL_CHARS:
        raise ValueError(f"a file URL may be at most {MAX_IMAGE_URL_CHARS} characters")
    if not value.lower().startswith(("http:", "https:")):
        raise ValueError("a file input must be an http(s) URL or a base64 data URL")
    try:
        parse_target(value, max_length=MAX_IMAGE_URL_CHARS)
    except TargetRefused as exc:
        raise ValueError(f"not a valid URL: it {exc.detail}") from None
    return ImageRef(url=value)


def file_format(data: bytes | memoryview, declared: str = "") -> tuple[str, str]:
    """A file's extension (without the dot) and content type, a pair the blob stores know:
    sniffed for pictures and audio, else the declared type's, else ``bin``."""
    candidates = [sniff_image_format(data) or sniff_audio_format(data) or ""]
    if declared:
        candidates.append((mimetypes.guess_extension(declared) or "").lstrip("."))
    for extension in candidates:
        content_type = CONTENT_TYPE_BY_EXTENSION.get(f".{extension}") if extension else None
        if content_type is not None:
            return extension, content_type
    return "bin", "application/octet-stream"
