"""What reads of one definition's records are checked and compiled against, built once per request."""

from __future__ import annotations

from dataclasses import dataclass, field

from flask import current_app

from app.entities.fieldtypes import CompiledSchema, compile_definition_schema
from app.entities.filters import FilterContext, FilterLimits
from app.entities.models import EntityDefinition


def compiled_schema(definition: EntityDefinition) -> CompiledSchema:
    return compile_definition_schema(definition.schema or {})


def filter_limits() -> FilterLimits:
    config = current_app.config
    return FilterLimits(max_depth=config["ENTITY_FILTER_MAX_DEPTH"],
                        max_conditions=config["ENTITY_FILTER_MAX_CONDITIONS"],
                        max_list=config["ENTITY_FILTER_MAX_LIST"])


def filter_context(definition: EntityDefinition, compiled: CompiledSchema | None = None) -> FilterContext:
    """What filters of this definition are checked and compiled against."""
    compiled = compiled or compiled_schema(definition)
    embeddings = definition.embeddings_config or {}
    return FilterContext(compiled.catalog, embeddings_enabled=bool(embeddings.get("enabled")),
                         limits=filter_limits(), definition_id=definition.id, embeddings_config=embeddings,
                         org_id=definition.org_id)


@dataclass(frozen=True)
class DefinitionContext:
    """Everything a read of one definition's records needs, built once per request."""

    definition: EntityDefinition
    schema: CompiledSchema
    filters: FilterContext
    # the filter shapes compiled against this context (app.entities.filters.compile_request `shapes`):
    # a cached context (services.definitions.DefinitionCache) keeps them as long as it lives
    shapes: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


def definition_context(definition: EntityDefinition) -> DefinitionContext:
    schema = compiled_schema(definition)
    return DefinitionContext(definition, schema, filter_context(definition, schema))
