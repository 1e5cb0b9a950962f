"""Configuration: load YAML, validate against the JSON schema, fill in defaults."""

from __future__ import annotations

import copy
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(str(resources.files("idunlearn") / "schema" / "config.schema.yaml"))


class ConfigError(ValueError):
    """The configuration does not match the schema; the message names the key."""


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _validator_with_defaults(schema: dict) -> jsonschema.protocols.Validator:
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def fill_defaults(validator, properties, instance, schema_node):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema_node)

    extended = jsonschema.validators.extend(base, {"properties": fill_defaults})
    return extended(schema)


def validate_config(config: dict) -> dict:
    """Validate ``config`` in place (defaults are added) and return it; raise ConfigError naming the bad key."""
    validator = _validator_with_defaults(load_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
            lines.append(f"config key '{key}': {err.message}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines) + f"\n(schema: {SCHEMA_PATH})")
    return config


def load_config(path: str | Path, overrides: dict | None = None) -> dict:
    """Read a YAML config, apply nested ``overrides``, validate and fill defaults."""
    config = yaml.safe_load(Path(path).read_text()) or {}
    if overrides:
        config = deep_update(config, overrides)
    return validate_config(config)


def deep_update(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def config_hash(obj: Any, length: int = 10) -> str:
    """Short stable hash of a JSON-serialisable config fragment (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def run_config(config: dict, name: str) -> dict:
    """The full settings of unlearning run ``name``: ``unlearning.defaults`` overridden by the run's own keys."""
    unlearning = config["unlearning"]
    if name not in unlearning["runs"]:
        raise ConfigError(f"unlearning run {name!r} is not in unlearning.runs ({', '.join(unlearning['runs'])})")
    unknown = set(unlearning["runs"][name]) - set(unlearning["defaults"])
    if unknown:
        raise ConfigError(f"config key 'unlearning.runs.{name}': unknown setting(s) {sorted(unknown)}; "
                          f"known: {sorted(unlearning['defaults'])}")
    return {**unlearning["defaults"], **unlearning["runs"][name]}
