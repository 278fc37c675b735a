"""The model catalogue (``GET /api/v1/models``) and each model's schema in the OpenAPI document.

Both read the registry the app was built with, so models added through
``GENHOOK_EXTRA_ENGINES`` are listed and documented like the built-in ones.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from fastapi import APIRouter, FastAPI
from pydantic import BaseModel, Field

from genhook.api.deps import AccountDep, StateDep
from genhook.api.errors import ERROR_RESPONSES
from genhook.config import Settings
from genhook.engines.base import ModelSpec
from genhook.engines.registry import PATH_KINDS, Registry, submit_paths
from genhook.errors import NotFound
from genhook.tasks.submission import with_submit_fields

router = APIRouter()


class ModelPricing(BaseModel):
    summary: str = Field(description="The price in words.")
    unit: str | None = Field(
        default=None, description="What one price is for: task, second, 1000 characters."
    )
    currency: str = "USD"
    prices_usd: dict[str, str] = Field(
        default_factory=dict, description="The numbers, as decimal strings by tier or item."
    )


class ModelInfo(BaseModel):
    id: str
    kind: str = Field(description="image, video or audio")
    description: str
    submit_paths: list[str] = Field(description="The submit endpoints that accept this model.")
    request_schema: dict[str, Any] = Field(description="JSON Schema of the request body.")
    pricing: ModelPricing
    deadline_seconds: float = Field(description="A task not finished by then ends `timeout`.")
    choices: dict[str, Any] | None = Field(
        default=None,
        description="Named choices of request fields, with what each is: the voices of "
        "text-to-speech (engine, language), the styles of image-edit.",
    )


class ModelList(BaseModel):
    models: list[ModelInfo]


def model_info(spec: ModelSpec, settings: Settings) -> dict[str, Any]:
    if spec.price_list is not None:
        pricing = {"currency": "USD", **spec.price_list(settings)}
    else:
        pricing = {
            "summary": "priced per task by the model's own rule; see its documentation",
            "unit": "task",
            "currency": "USD",
            "prices_usd": {},
        }
    return {
        "id": spec.id,
        "kind": spec.kind.value,
        "description": spec.description,
        "submit_paths": submit_paths(spec),
        "request_schema": with_submit_fields(spec.request_schema.model_json_schema()),
        "pricing": pricing,
        "deadline_seconds": settings.task_deadline_seconds or spec.deadline_seconds,
        "choices": spec.choices() if spec.choices is not None else None,
    }


@router.get(
    "/api/v1/models",
    response_model=ModelList,
    responses={401: ERROR_RESPONSES[401]},
    tags=["models"],
    summary="Every model this service runs, with its request schema, price and deadline",
)
async def list_models(state: StateDep, account: AccountDep) -> Any:
    return {"models": [model_info(spec, state.settings) for spec in state.registry]}


@router.get(
    "/api/v1/models/{model_id:path}",
    response_model=ModelInfo,
    responses={401: ERROR_RESPONSES[401], 404: ERROR_RESPONSES[404]},
    tags=["models"],
    summary="One model of the catalogue (ids contain a slash: /api/v1/models/genhook/image-edit)",
)
async def get_model(model_id: str, state: StateDep, account: AccountDep) -> Any:
    spec = state.registry.get(model_id)
    if spec is None:
        raise NotFound(f"no model {model_id!r}")
    return model_info(spec, state.settings)


def _component_name(model_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", model_id) + "_request"


def request_schemas(registry: Registry, document: dict[str, Any]) -> None:
    """Give each submit path a union of the request schemas of the models it accepts.

    Each member pins ``model`` to its id, so the union is told apart by that field and a
    generated client knows every model's fields.
    """
    components = document.setdefault("components", {}).setdefault("schemas", {})
    names: dict[str, str] = {}
    for spec in registry:
        schema = spec.request_schema.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in schema.pop("$defs", {}).items():
            components.setdefault(name, definition)
        schema = with_submit_fields(copy.deepcopy(schema))
        properties = schema["properties"]
        properties["model"] = {"const": spec.id, "type": "string", "title": "Model"}
        schema["title"] = f"{spec.id} request"
        names[spec.id] = _component_name(spec.id)
        components[names[spec.id]] = schema
    for path_name, kind in PATH_KINDS.items():
        operation = document.get("paths", {}).get(f"/api/v1/model/{path_name}", {}).get("post")
        if operation is None:
            continue
        mapping = {
            spec.id: f"#/components/schemas/{names[spec.id]}"
            for spec in registry
            if spec.accepts(kind)
        }
        members = [{"$ref": ref} for ref in mapping.values()]
        if len(members) > 1:
            body: dict[str, Any] = {
                "oneOf": members,
                "discriminator": {"propertyName": "model", "mapping": mapping},
            }
        elif members:
            body = members[0]
        else:
            body = {
                "type": "object",
                "required": ["model"],
                "properties": {"model": {"type": "string"}},
                "description": "No model of this kind is registered on this service.",
            }
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }


def install_models(app: FastAPI, registry: Registry) -> None:
    """Add the catalogue routes and the per-model request schemas to ``app``."""
    app.include_router(router)
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            request_schemas(registry, document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
