"""Validation of a raw sweep mapping against the JSON Schema, with one readable message per failure."""

from __future__ import annotations

import copy
import difflib
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ddlbench.catalog import DATASETS, MODELS, STRATEGIES
from ddlbench.errors import ConfigError

SCHEMA_PATH = Path(__file__).with_name("sweep.schema.yaml")


@functools.cache
def sweep_schema() -> dict[str, Any]:
    """The sweep schema with the registries' names filled into its enums. Read with libyaml where PyYAML
    has it (a tenth of the pure-Python loader's time: every command reads it); the schema itself is checked
    against JSON Schema's metaschema by the tests (tests/test_config.py), not on every run."""
    schema = yaml.load(SCHEMA_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    props = schema["properties"]
    props["models"]["items"]["enum"] = MODELS.names()
    props["datasets"]["items"]["enum"] = DATASETS.names()
    props["strategies"]["items"]["enum"] = STRATEGIES.names()
    return schema


def validate_raw(raw: object) -> dict[str, Any]:
    """Validate `raw` and return a copy with the schema's defaults filled in; raise ConfigError."""
    return validate_with(raw, sweep_schema(), what="a sweep config")


def validate_with(raw: object, schema: dict[str, Any], *, what: str) -> dict[str, Any]:
    """Validate `raw` against `schema` (a JSON Schema with top-level properties and defaults) and return a
    copy with the defaults filled in; raise ConfigError naming the key, the value and what is accepted."""
    if not isinstance(raw, Mapping):
        raise ConfigError("", f"{what} must be a mapping of keys to values, not {_show(raw)}")
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(dict(raw)))
    if error is not None:
        raise ConfigError(_key_of(error.absolute_path), _describe(error, schema))
    filled = copy.deepcopy(dict(raw))
    for key, prop in schema["properties"].items():
        if key not in filled and "default" in prop:
            filled[key] = copy.deepcopy(prop["default"])
    return filled


def _key_of(path: Sequence[str | int]) -> str:
    key = ""
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _show(value: object) -> str:
    return json.dumps(value) if isinstance(value, (str, int, float, bool, list, dict)) or value is None else repr(value)


def _describe(error: jsonschema.ValidationError, schema: dict[str, Any]) -> str:
    kind, value, rule = error.validator, error.instance, error.validator_value
    if kind == "enum":
        hint = _close_match(value, rule)
        return f"{_show(value)} is not one of the accepted values: {', '.join(map(str, rule))}{hint}"
    if kind == "type":
        wanted = rule if isinstance(rule, str) else " or ".join(rule)
        article = "an" if wanted[0] in "aeiou" else "a"
        hint = " (write a list, e.g. [2])" if wanted == "array" and not isinstance(value, list) else ""
        return f"{_show(value)} is not {article} {wanted}{hint}"
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(value) - set(allowed)) if isinstance(value, Mapping) else []
        unknown = extra[0] if extra else "?"
        where = "is not a known key" if allowed else "is not allowed here"
        choices = f"; accepted keys: {', '.join(allowed)}" if allowed else ""
        return f"{_show(unknown)} {where}{choices}{_close_match(unknown, allowed)}"
    if kind == "required":
        missing = [key for key in rule if key not in value]
        description = schema["properties"].get(missing[0], {}).get("description", "")
        return f"the key {_show(missing[0])} is required ({description.rstrip('.')})"
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        relation = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}[kind]
        return f"{_show(value)} is out of range; it must be {relation} {rule}"
    if kind == "minItems":
        return f"{_show(value)} has too few entries; give at least {rule}"
    if kind == "uniqueItems":
        return f"{_show(value)} lists a value twice; each value may appear once"
    if kind == "minProperties":
        return f"{_show(value)} is empty; name at least one key"
    if kind == "pattern":
        return f"{_show(value)} is not accepted; it must match {rule} (lower-case letters, digits, '_', '-')"
    if kind == "minLength":
        return f"{_show(value)} is too short; give at least {rule} character(s)"
    return error.message


def _close_match(word: object, choices: Sequence[object]) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
