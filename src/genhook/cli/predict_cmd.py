"""``genhook predict MODEL -i name=value -i image=@file.png -o DIR``: one call, no service.

Any configured model runs (built-in, local-weight, upstream, predictor and Cog entries): the
body is checked as a submit checks it, the engine runs in this process as in a worker, and
the outputs are written to ``DIR`` as ``output-0.png`` and so on, with ``info`` printed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import mimetypes
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

err = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("predict")(predict)


def predict(
    model: str = typer.Argument(..., help="The model id, as in the catalogue."),
    inputs: list[str] | None = typer.Option(
        None,
        "--input",
        "-i",
        help="name=value (repeat for each field and each item of a list); name=@path sends "
        "the file at path, as a data URL.",
    ),
    output_dir: Path = typer.Option(
        Path("."), "--output", "-o", help="Where the outputs are written."
    ),
) -> None:
    """Run a model once in this process, without the service (as a worker runs it)."""
    from genhook.cli._environment import load_settings
    from genhook.engines.registry import build_registry
    from genhook.errors import InvalidRequest, TaskFailure
    from genhook.tasks.once import predict_once

    settings = load_settings()
    try:
        registry = build_registry(settings)
    except ValueError as exc:
        _fail(str(exc))
    spec = registry.get(model)
    schema = spec.request_schema.model_json_schema() if spec is not None else {}
    try:
        body = {"model": model, **request_fields(inputs or [], schema)}
    except ValueError as exc:
        _fail(str(exc))

    def report(progress: float | None = None, log: str | None = None) -> None:
        if log:
            err.print(f"[dim]{log}[/dim]")

    try:
        prediction = asyncio.run(predict_once(settings, registry, body, report))
    except InvalidRequest as exc:
        fields = "; ".join(f"{e.field}: {e.message}" for e in exc.errors) or exc.message
        _fail(f"the request is invalid: {fields}")
    except TaskFailure as failure:
        _fail(f"the model failed ({int(failure.code)}): {failure.message}")
    written = write_outputs(prediction.result.outputs, output_dir)
    summary = {
        "outputs": [str(path) for path in written],
        "info": prediction.result.info,
        "seconds": round(prediction.seconds, 3),
    }
    if prediction.result.stt_result is not None:
        summary["stt_result"] = prediction.result.stt_result
    print(json.dumps(summary, indent=2))


def _fail(message: str) -> Any:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code=1)


def write_outputs(outputs: list[Any], folder: Path) -> list[Path]:
    """Each output as ``output-<n>.<ext>`` in ``folder``, the extension its blob would have."""
    from genhook.storage.blobs import extension_of

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for number, output in enumerate(outputs):
        path = folder / f"output-{number}{extension_of(output.content_type)}"
        path.write_bytes(output.data)
        written.append(path)
    return written


def request_fields(pairs: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """The body's fields from ``name=value`` pairs, typed by the model's JSON schema (a
    number field gets a number, a list field a list of every value given for it); a value
    ``@path`` is the file's bytes as a data URL. The service's validation judges the rest."""
    properties = schema.get("properties", {})
    fields: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"-i {pair!r}: expected name=value")
        node = _resolve(schema, properties.get(name, {}))
        many = node.get("type") == "array"
        value = _typed(raw, _resolve(schema, node.get("items", {})) if many else node)
        if many:
            fields.setdefault(name, []).append(value)
        elif name in fields:
            raise ValueError(f"-i {name}= is given twice, and {name} takes one value")
        else:
            fields[name] = value
    return fields


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return dict(schema.get("$defs", {}).get(node["$ref"].rsplit("/", 1)[-1], {}))
    if "anyOf" in node:
        kinds = [n for n in node["anyOf"] if n.get("type") != "null"]
        if len(kinds) == 1:
            return _resolve(schema, kinds[0])
    return node


def _typed(raw: str, node: dict[str, Any]) -> Any:
    if raw.startswith("@"):
        return _data_url(Path(raw[1:]).expanduser())
    kind = node.get("type")
    try:
        if kind == "integer":
            return int(raw)
        if kind == "number":
            return float(raw)
        if kind == "boolean":
            lowered = raw.lower()
            if lowered in ("true", "1", "yes"):
                return True
            if lowered in ("false", "0", "no"):
                return False
            return raw
        if kind == "string":
            return raw
        if kind in ("object", "array") or kind is None:
            return json.loads(raw)
    except ValueError:
        return raw  # left as given: the validation names the field
    return raw


def _data_url(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"@{path}: {exc.strerror or exc}") from None
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
