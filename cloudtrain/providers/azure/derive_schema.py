"""Build the snapshot of azure-ai-ml's command job schema (``command_job_schema.json``) from the installed SDK.

``load_job`` reads a job YAML with the marshmallow ``CommandJobSchema``; this walks that schema, every field a
YAML may load (dump-only fields are trimmed by the SDK before loading, so they are recorded as ignored), and writes
each field as a small kind (string, int, enum with its values, nested object, union of alternatives, ...) that
``schema.py`` checks without importing the SDK (1-2 s). A field class this walker does not know stops it, so an SDK
that changes its schema fails the test that compares the snapshot with this output instead of going unchecked.

    python -m cloudtrain.providers.azure.derive_schema > cloudtrain/providers/azure/command_job_schema.json
"""

from __future__ import annotations

import json
from typing import Any

# field classes whose load is a plain check cloudtrain's validator knows, by class name
_PLAIN = {"String": "string", "Str": "string", "Boolean": "bool", "Raw": "any", "LocalPathField": "local_path",
          "GitStr": "git", "RegistryStr": "registry", "InternalRegistryStr": "internal_registry", "ArmStr": "arm",
          "VersionField": "version", "DataBindingStr": "binding", "Url": "url", "SerializeValidatedUrl": "url"}
_URL_VALIDATOR = "URL(relative=False, absolute=True"  # what marshmallow's Url field adds itself
_LOAD_HOOKS = ("pre_load", "post_load", "validates_schema")


def _casing(transform: Any) -> str:
    """StringTransformedEnum compares transform(value) with its values: name the transform by what it does."""
    probe = transform("JobTier_Spot")
    for name, expected in (("lower", "jobtier_spot"), ("exact", "JobTier_Spot"), ("snake", "job_tier__spot")):
        if probe == expected:
            return name
    raise TypeError(f"an enum casing this snapshot cannot describe: {probe!r}")


def derive() -> dict[str, Any]:
    """The snapshot, from the installed SDK (imports azure.ai.ml: seconds)."""
    import marshmallow
    from azure.ai.ml._schema.job.command_job import CommandJobSchema
    from azure.ai.ml._utils._arm_id_utils import AMLVersionedArmId
    from azure.ai.ml.constants import _common as common

    schemas: dict[str, dict[str, Any]] = {}

    def kind(field: Any) -> dict[str, Any]:
        name = type(field).__name__
        found: dict[str, Any]
        if name == "ExperimentalField":
            found = kind(field.experimental_field)
        elif name == "UnionField":  # the SDK tries each alternative in turn; the first that loads wins
            found = {"kind": "union", "of": [kind(f) for f in field.union_fields]}
        elif isinstance(field, marshmallow.fields.Nested):
            if field.many:
                raise TypeError(f"a list of nested objects: {field.name}")
            found = {"kind": "object", "schema": visit(field.schema)}
        elif name in ("StringTransformedEnum", "DumpableEnumField"):
            found = {"kind": "enum", "values": list(field.allowed_values), "casing": _casing(field.casing_transform)}
        elif name == "ArmVersionedStr":
            found = {"kind": "arm_versioned", "asset": field.azureml_type,
                     "default_version": field.allow_default_version}
        elif name in ("Integer", "Int", "DumpableIntegerField"):
            found = {"kind": "int", "strict": field.strict}
        elif name in ("Float", "DumpableFloatField"):
            found = {"kind": "float", "allow_nan": field.allow_nan, "strict": getattr(field, "strict", False)}
        elif name == "Dict":
            unchecked = {"kind": "any", "nullable": True}  # a Dict without a key or value field loads anything
            found = {"kind": "map", "key": kind(field.key_field) if field.key_field else unchecked,
                     "value": kind(field.value_field) if field.value_field else unchecked}
        elif name == "List":
            found = {"kind": "list", "item": kind(field.inner)}
        elif name in _PLAIN:
            found = {"kind": _PLAIN[name]}
            if name == "Boolean" and (field.truthy, field.falsy) != (marshmallow.fields.Boolean.truthy,
                                                                     marshmallow.fields.Boolean.falsy):
                raise TypeError(f"a Boolean with its own true/false words: {field.name}")
        else:
            raise TypeError(f"a field class the snapshot cannot describe: {type(field).__module__}.{name}")
        extra = [repr(v) for v in field.validators if not (found["kind"] == "url" and _URL_VALIDATOR in repr(v))]
        if extra:
            raise TypeError(f"field validators the snapshot cannot describe on {field.name}: {extra}")
        if field.allow_none:
            found["nullable"] = True
        return found

    def visit(schema: Any) -> str:
        name = type(schema).__name__
        if name in schemas:
            return name
        entry: dict[str, Any] = {}
        schemas[name] = entry  # before the fields: a schema may nest itself
        hooks = sorted(h[0] for stage in _LOAD_HOOKS for h in schema._hooks.get(stage, []))
        ignored = sorted(f.data_key or n for n, f in schema.fields.items() if f.dump_only)
        fields, required = {}, []
        for attr, field in schema.fields.items():
            if field.dump_only:
                continue
            key = field.data_key or attr
            fields[key] = kind(field)
            if field.required:
                required.append(key)
        entry.update(unknown=schema.unknown, fields=dict(sorted(fields.items())), required=sorted(required),
                     ignored=ignored if "trim_dump_only" in hooks else [], hooks=hooks)
        return name

    root = visit(CommandJobSchema(context={common.BASE_PATH_CONTEXT_KEY: "."}))
    return {"root": root, "schemas": dict(sorted(schemas.items())),
            "constants": {"arm_prefix": common.ARM_ID_PREFIX, "registry_prefix": common.REGISTRY_URI_FORMAT,
                          "feeds_prefix": common.INTERNAL_REGISTRY_URI_FORMAT,
                          "versioned_arm_id": AMLVersionedArmId.REGEX_PATTERN,
                          "registry_version": common.REGISTRY_VERSION_PATTERN,
                          "resource_id": common.NAMED_RESOURCE_ID_FORMAT.format(
                              ".*", ".*", common.AZUREML_RESOURCE_PROVIDER, ".*", "{}", ".*"),
                          "truthy": sorted(marshmallow.fields.Boolean.truthy, key=repr),
                          "falsy": sorted(marshmallow.fields.Boolean.falsy, key=repr)}}


if __name__ == "__main__":
    print(json.dumps(derive(), indent=1))
