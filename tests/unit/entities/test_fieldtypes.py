"""Definition schemas: platform field types compile to plain JSON Schema, with checked formats."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.entities.fieldtypes import PLATFORM_TYPES, compile_definition_schema, search_document
from app.errors import ValidationFailed


def compiled(props, required=()):
    return compile_definition_schema({"type": "object", "properties": props, "required": list(required)})


@pytest.mark.parametrize("ftype", PLATFORM_TYPES)
def test_every_platform_type_compiles_both_ways(ftype):
    extra = {"options": ["x", "y"]} if ftype in ("dropdown", "multiselect") else {}
    as_type = compiled({"f": {"type": ftype, **extra}})
    as_keyword = compiled({"f": {"fieldType": ftype, **extra}})
    assert as_type.json_schema == as_keyword.json_schema
    assert as_type.catalog.get("f").field_type == ftype
    assert "fieldType" not in str(as_type.json_schema) and "options" not in str(as_type.json_schema)


def test_json_schema_types_map_to_platform_types():
    schema = compiled({"a": {"type": "integer"}, "b": {"type": "number"}, "c": {"type": "boolean"},
                       "d": {"type": "string", "format": "date-time"},
                       "e": {"type": "array", "items": {"type": "string"}},
                       "f": {"type": "object"}, "g": {"enum": ["p", "q"]}})
    kinds = {n: f.field_type for n, f in schema.catalog.fields.items()}
    assert kinds == {"a": "int", "b": "float", "c": "bool", "d": "datetime", "e": "json", "f": "json",
                     "g": "dropdown"}
    assert schema.catalog.get("e").kind == "array"  # a list of strings filters like a multiselect
    assert schema.errors_for({"e": ["x"], "f": {}}) == {} and set(schema.errors_for({"e": "x", "f": 1})) == {
        "fields.e", "fields.f"}


def test_required_fields_reject_null_optional_accept_it():
    schema = compiled({"a": {"type": "string"}, "b": {"type": "int"}}, required=["a"])
    assert schema.errors_for({"a": "x", "b": None}) == {}
    assert "fields.a" in schema.errors_for({"a": None})
    assert "fields" in schema.errors_for({"a": "x", "zzz": 1})


def test_standard_keywords_are_kept():
    schema = compiled({"n": {"type": "int", "minimum": 0, "maximum": 5}, "s": {"type": "string", "maxLength": 2}})
    assert schema.errors_for({"n": 3, "s": "ab"}) == {}
    assert set(schema.errors_for({"n": 6, "s": "abc"})) == {"fields.n", "fields.s"}


@pytest.mark.parametrize("bad", [{"type": "lookup", "entity": 5}, {"type": "string", "entity": "x"},
                                 {"type": "dropdown", "options": ["a", "a"]},
                                 {"type": "dropdown", "options": [{"label": "no value"}]},
                                 {"type": ["string", "integer"]}, "string"])
def test_bad_properties(bad):
    with pytest.raises(ValidationFailed) as info:
        compiled({"f": bad})
    assert "schema.properties.f" in info.value.details["fields"]


def test_options_accept_value_label_objects():
    schema = compiled({"s": {"type": "dropdown", "options": [{"value": "a", "label": "A"}, "b"]}})
    assert schema.errors_for({"s": "a"}) == {} and schema.errors_for({"s": "A"})


def test_search_document_uses_text_like_fields_only():
    schema = compiled({"t": {"type": "text"}, "n": {"type": "int"}, "m": {"type": "multiselect", "options": ["x"]},
                       "l": {"type": "lookup"}})
    document = search_document("Name", {"t": "hello", "n": 5, "m": ["x"], "l": "id-1"}, schema.catalog)
    assert document.split() == ["Name", "x", "hello"]  # name, then fields in (sorted) schema order


QUICK_SCHEMA = {"type": "object", "required": ["t"], "properties": {
    "t": {"type": "string", "maxLength": 3}, "n": {"type": "int", "minimum": 0}, "f": {"type": "float"},
    "b": {"type": "bool"}, "d": {"type": "date"}, "dt": {"type": "datetime"}, "e": {"type": "email"},
    "s": {"type": "dropdown", "options": ["a", "b"]}, "m": {"type": "multiselect", "options": ["a", "b"]},
    "c": {"type": "currency"}, "p": {"type": "phone"}, "j": {"type": "json"}, "u": {"type": "url"}}}
json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-3, 3, allow_nan=False)
                           | st.sampled_from(["a", "b", "abc", "abcd", "2026-01-01", "2026-01-01T00:00:00Z", "a@b.co",
                                              "+47 22 33", "https://x.io", ""]),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                               st.sampled_from(["amount", "currency", "k"]), inner, max_size=2), max_leaves=4)


@settings(max_examples=400, deadline=None)
@given(title=st.one_of(st.sampled_from(["", "abc", "abcd"]), json_values), fields=st.dictionaries(
    st.sampled_from([*QUICK_SCHEMA["properties"], "zz"]), json_values, max_size=3), with_title=st.booleans())
def test_quick_check_agrees_with_jsonschema(title, fields, with_title):
    if with_title:
        fields = {**fields, "t": title}
    schema = compile_definition_schema(QUICK_SCHEMA)
    assert schema.quick is not None
    assert schema.is_valid(fields) == schema.validator.is_valid(fields) == (schema.errors_for(fields) == {})


keyword_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.0, -0.0, 2.5, 10**30, 1e300])
    | st.sampled_from(["a", "b", "", "abcd", "2026-01-01", "2026-13-01", "2026-01-01T00:00:00Z", "a@b.co",
                       "https://x.io", "x y"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["k", "url", "amount"]), inner,
                                                                max_size=2), max_leaves=5)
keywords = st.fixed_dictionaries({}, optional={
    "minimum": st.sampled_from([0, 1, 0.5, -1]), "maximum": st.sampled_from([0, 2, 2.5]),
    "minLength": st.integers(0, 3), "maxLength": st.integers(0, 3), "uniqueItems": st.booleans(),
    "items": st.sampled_from([{"type": "integer"}, {"type": "string"}, {"type": "number", "minimum": 1}, {},
                              {"type": ["string", "null"]}]),
    "format": st.sampled_from(["email", "date", "date-time", "uri", "unknown"]),
    "enum": st.sampled_from([["a", "b"], ["a", None], [1, 2]])})


@settings(max_examples=1500, deadline=None)
@given(kind=st.sampled_from(["string", "int", "float", "bool", "date", "email", "url", "json", "array", "object",
                             "integer", "number", "multilookup", "lookup"]),
       extra=keywords, required=st.booleans(), value=keyword_values)
def test_quick_check_agrees_with_jsonschema_for_the_standard_keywords(kind, extra, required, value):
    """Keywords a property may carry besides its type (kept as written): where the quick check answers,
    it answers as jsonschema (`uniqueItems` over numbers, lists, objects: jsonschema's own equality)."""
    try:
        schema = compile_definition_schema({"type": "object", "required": ["x"] if required else [],
                                            "properties": {"x": {"type": kind, **extra}}})
    except ValidationFailed:
        return
    verdict = schema.quick({"x": value}) if schema.quick is not None else None
    assert verdict is None or verdict == schema.validator.is_valid({"x": value})


def test_unique_items_over_numbers_is_jsonschemas():
    schema = compile_definition_schema({"type": "object", "properties": {
        "x": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}})
    for value, valid in (([1, 2], True), ([1, 1], False), ([], True)):
        assert schema.quick({"x": value}) in (None, valid) and schema.is_valid({"x": value}) is valid
