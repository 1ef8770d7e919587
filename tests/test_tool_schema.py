"""A tool schema the fast check covers is registered without jsonschema's meta-schema check, so
the fast subset must hold only valid JSON Schemas: every schema it accepts passes
``Draft202012Validator.check_schema``, and one it refuses is checked (an invalid one still fails
its registration). Values are judged the same either way."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast.errors import ArgumentError
from smith_fast.tools.schema import _fast_check, compile_validator, validate

# Values for each keyword of the subset: the valid ones and some the meta-schema refuses.
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2), st.text(max_size=3),
                 st.lists(st.text(max_size=2), max_size=2))
_ANNOTATION = st.sampled_from(["description", "title", "default", "examples", "deprecated", "readOnly",
                               "writeOnly"])


def _leaf() -> st.SearchStrategy[Any]:
    string = st.fixed_dictionaries({"type": st.just("string")},
                                   optional={"minLength": st.integers(-2, 4), "maxLength": _ANY})
    integer = st.fixed_dictionaries({"type": st.just("integer")}, optional={"minimum": _ANY, "maximum": _ANY})
    enum = st.fixed_dictionaries({"enum": st.one_of(st.lists(st.text(max_size=2), max_size=3), _ANY)})
    boolean = st.just({"type": "boolean"})
    return st.one_of(string, integer, enum, boolean, st.just({}), st.just(True))


def _with_annotations(schemas: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    def add(schema: Any, notes: dict[str, Any]) -> Any:
        return {**schema, **notes} if isinstance(schema, dict) else schema

    return st.builds(add, schemas, st.dictionaries(_ANNOTATION, _ANY, max_size=2))


def _object(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    names = st.text(alphabet="abc", min_size=1, max_size=2)
    return st.fixed_dictionaries({"type": st.just("object")}, optional={
        "properties": st.dictionaries(names, children, max_size=3),
        "required": st.one_of(st.lists(names, max_size=3), st.lists(_ANY, max_size=2), _ANY),
        "additionalProperties": st.one_of(st.booleans(), children),
    })


SCHEMAS = st.recursive(_with_annotations(_leaf()), lambda children: _with_annotations(_object(children)), max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(SCHEMAS)
def test_a_schema_the_fast_check_covers_is_a_valid_json_schema(schema: Any) -> None:
    valid = True
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        valid = False
    if _fast_check(schema) is not None:
        assert valid, schema
    if not valid:
        with pytest.raises(ValueError, match="invalid JSON Schema"):
            compile_validator(schema)


@settings(max_examples=200, deadline=None)
@given(SCHEMAS.filter(lambda s: _fast_check(s) is not None), _ANY)
def test_values_are_judged_as_jsonschema_judges_them(schema: Any, value: Any) -> None:
    compiled = compile_validator(schema)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if errors:
        with pytest.raises(ArgumentError):
            validate(compiled, value)
    else:
        validate(compiled, value)


@pytest.mark.parametrize("schema", [
    {"type": "object", "required": [1]},
    {"type": "object", "required": ["a", "a"]},
    {"type": "string", "minLength": -1},
    {"type": "string", "description": 5},
    {"type": "string", "maxLength": None},  # an explicit null is not an absent keyword
    {"type": "integer", "minimum": None},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": "9"}}},
])
def test_invalid_schemas_still_fail_their_registration(schema: dict[str, Any]) -> None:
    assert _fast_check(schema) is None
    with pytest.raises(ValueError, match="invalid JSON Schema"):
        compile_validator(schema)


def test_the_built_in_tools_register_without_importing_jsonschema() -> None:
    """What a start of ``serve`` pays: the built-ins' schemas are of the fast subset."""
    code = ("import sys; from smith_fast.tools import default_registry; default_registry(); "
            "print('jsonschema' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
