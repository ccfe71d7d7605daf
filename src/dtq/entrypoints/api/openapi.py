"""OpenAPI schema generation tweaks so ``/schema`` states what the decoder enforces.

Litestar's built-in msgspec plugin leaves out two things our request Structs rely on:

* ``forbid_unknown_fields=True`` -> ``additionalProperties: false`` (unknown fields are a 400);
* constraints on the items of a list (``depends_on: list[TaskName]``): the item pattern and
  lengths.

:class:`StrictStructSchemaPlugin` adds both. It extends Litestar's own ``StructSchemaPlugin``
(an internal module of Litestar 2.x, pinned ``<3`` in pyproject) and is registered ahead of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.spec import Schema

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator
    from litestar.typing import FieldDefinition


def _string_item_constraints(field_type: object) -> msgspec.inspect.StrType | None:
    """The ``StrType`` of a ``list[Annotated[str, Meta(...)]]`` field, else None."""
    if not isinstance(field_type, msgspec.inspect.ListType):
        return None
    item = field_type.item_type
    if isinstance(item, msgspec.inspect.Metadata):
        item = item.type
    return item if isinstance(item, msgspec.inspect.StrType) else None


class StrictStructSchemaPlugin(StructSchemaPlugin):
    """Schema of a msgspec Struct, plus ``additionalProperties: false`` and string-item
    constraints. Handles only Structs that forbid unknown fields (our request bodies)."""

    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        """True for non-union Struct types declared with ``forbid_unknown_fields=True``."""
        if not super().is_plugin_supported_field(field_definition):
            return False
        info = msgspec.inspect.type_info(field_definition.type_)
        return isinstance(info, msgspec.inspect.StructType) and info.forbid_unknown_fields

    def to_openapi_schema(
        self, field_definition: FieldDefinition, schema_creator: SchemaCreator
    ) -> Schema:
        """Build the component schema, then close it and constrain list-of-string items."""
        schema = super().to_openapi_schema(field_definition, schema_creator)
        schema.additional_properties = False
        info = msgspec.inspect.type_info(field_definition.type_)
        assert isinstance(info, msgspec.inspect.StructType)
        for field in info.fields:
            constraints = _string_item_constraints(field.type)
            prop = (schema.properties or {}).get(field.encode_name)
            if constraints is None or not isinstance(prop, Schema):
                continue
            if isinstance(prop.items, Schema):
                prop.items.min_length = constraints.min_length
                prop.items.max_length = constraints.max_length
                prop.items.pattern = constraints.pattern
        return schema
