"""The workflow configuration's schema: package data, read through this one module.

``config.schema.yaml`` beside this file is the one home of every configuration key, its
default, its range and its description (``workflow/schemas/config.schema.yaml`` is a link to
it, for Snakemake and the workflow catalog). Because it ships inside the package, a wheel
installed on a cluster validates configs and builds specs without a checkout.

:func:`check_schema` fills in every default and checks the schema (JSON Schema 2020-12) and
finiteness; what depends on the disk or the hub is checked later, by
:mod:`istar.pipeline.validate`. Every problem is a :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache
from pathlib import Path

import yaml

__all__ = ["ConfigError", "SCHEMA_PATH", "STUDIES", "RETIRED_KEYS", "load_schema", "load_yaml", "resolve_ref", "fill_defaults",
           "check_schema", "schema_entry", "default_of", "out_of_range", "EDIT_RERUNS", "declared_reads"]

SCHEMA_PATH = Path(__file__).resolve().parent / "config.schema.yaml"
RETIRED_KEYS = {"profile": "is now 'survey'", "shrinkage.layers": "is now 'penalty.layers'",
                "shrinkage.global_penalty": "is now 'penalty.global_penalty'",
                "analysis.token_sample": "is gone (no measurement reads a token sample): delete it"}
"""A config key (a section, or ``section.key``) that istar 0.3.0 renamed or removed → what became of it,
for the unknown-key error only."""

EDIT_RERUNS = {
    "spec": "the jobs whose step spec holds the key (a spec field claims it; Snakemake records the spec)",
    "plan": "what the plan derives from the key: which jobs exist, and the values it puts in their specs",
    "report": "the study-level jobs that read the key (aggregate, tables, summary, report): seconds",
    "neutral": "nothing: resources and bookkeeping that no result depends on",
}
"""What an edit of a config key reruns, by the key's class. A key a spec field claims
(:func:`istar.config.specs.config_field`) is ``spec`` unless it declares itself ``neutral``; every
other key declares its class in the schema (``x-reads``, on the key or a section above it)."""

STUDIES = ("lambda_sweep", "cosreg_means", "twonn", "layerwise", "zeta_sweep", "single_layer", "padding")


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key."""


@lru_cache(maxsize=1)
def load_schema() -> dict:
    """The schema as a dict, read once per process (treat it as read-only)."""
    # libyaml's parser where PyYAML has it: the workflow reads the schema each time it builds a DAG
    return yaml.load(SCHEMA_PATH.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_yaml(path) -> dict:
    """A YAML config file as a dict ({} if empty).

    Refused with one-line :class:`ConfigError`: a syntax error (``FILE:LINE:COLUMN: …``), a key
    written twice in one mapping (YAML would keep the last silently: a section written twice loses
    every value of the first), bytes that are not UTF-8 (file, line and column).
    """
    from istar.io.text import NotUtf8Error, read_utf8

    try:
        loader = yaml.SafeLoader(read_utf8(path))
    except NotUtf8Error as error:
        raise ConfigError(str(error)) from None
    try:
        if (node := loader.get_single_node()) is not None:
            _check_unique_keys(node, path, [], set())
        data = None if node is None else loader.construct_document(node)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = "; ".join(part for part in (error.context, error.problem) if part)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(error).split())}") from None
    finally:
        loader.dispose()
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the configuration must be a mapping of keys to values, not {type(data).__name__}")
    return data or {}


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_unique_keys(node, path, keys: list, checked: set) -> None:
    """Refuse a key written twice in one mapping of a composed YAML document (``<<`` merges may repeat);
    ``checked``: the ids of the nodes checked so far."""
    if id(node) in checked:  # an alias: its node was checked where the anchor is
        return
    checked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE_TAG:
                name = (key.tag, key.value)
                if name in seen:
                    first, second = seen[name].start_mark.line + 1, key.start_mark.line + 1
                    raise ConfigError(
                        f"{path}:{second}:{key.start_mark.column + 1}: config key '{_key([*keys, key.value])}' is "
                        f"written twice (lines {first} and {second}): YAML keeps only the last, so what line {first} "
                        "sets would be silently dropped; merge the two into one")
                seen[name] = key
            _check_unique_keys(value, path, [*keys, key.value if isinstance(key, yaml.ScalarNode) else "?"], checked)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check_unique_keys(item, path, [*keys, index], checked)


def resolve_ref(schema: dict, root: dict) -> dict:
    """``schema`` with its ``$ref`` (``#/$defs/…``) replaced by the node it names, its own keys kept on top."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    target = root
    for part in ref.lstrip("#/").split("/"):
        target = target[part]
    return {**resolve_ref(target, root), **{k: v for k, v in schema.items() if k != "$ref"}}


def _entries(schema: dict, root: dict) -> dict:
    """The schema of a mapping's values where they are objects with properties (survey.models.NAME), else {}."""
    others = schema.get("additionalProperties")
    others = resolve_ref(others, root) if isinstance(others, dict) else {}
    return others if "properties" in others else {}


def fill_defaults(instance: dict, schema: dict, root: dict) -> None:
    named, entries = schema.get("properties", {}), _entries(schema, root)
    for name in [*named, *(key for key in instance if key not in named)]:
        # a named key's own schema; any other key is an entry of the mapping (survey.models.NAME), or unknown ({})
        subschema = resolve_ref(named[name], root) if name in named else entries
        if name not in instance and "default" in subschema:
            instance[name] = copy.deepcopy(subschema["default"])
        if isinstance(instance.get(name), dict) and ("properties" in subschema or _entries(subschema, root)):
            # A copy per key: YAML aliases (&a … *a) share one dict, which must not collect
            # the defaults of every section it stands in.
            instance[name] = dict(instance[name])
            fill_defaults(instance[name], subschema, root)


def _key(path) -> str:
    """A config key as a message names it: ``training.lambdas[2]``."""
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).removeprefix(".")
    return key or "(top level)"


def _number_hint(value) -> str:
    """For a string YAML did not read as a number although it looks like one (``3e-5``): how to write it."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    return (f"; YAML reads {value} as text (a number in exponent form needs a decimal point): "
            f"write {number:.1e}".replace("e-0", "e-").replace("e+0", "e+"))


def _describe(error) -> str:
    """One readable line for a jsonschema error: the key, the problem, what is allowed."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    hint = _number_hint(error.instance)
    if hint and error.validator in ("type", "anyOf"):
        return f"config key '{_key(error.absolute_path)}': {error.instance!r} is not a number{hint}"
    if error.validator == "additionalProperties":
        allowed = ", ".join(sorted(schema.get("properties", {})))
        section = "".join(f"{part}." for part in error.absolute_path)
        retired = "".join(f"; '{section}{key}' {RETIRED_KEYS[section + key]}" for key in error.instance
                          if section + key in RETIRED_KEYS)
        return f"config key '{_key(error.absolute_path)}': {error.message} (known keys: {allowed}){retired}"
    if error.validator == "enum":
        return f"config key '{_key(error.absolute_path)}': {error.instance!r} is not allowed; use one of {schema['enum']}"
    if error.validator == "anyOf":
        descriptions = schema.get("description", "see the schema")
        return f"config key '{_key(error.absolute_path)}': {error.instance!r} is not allowed ({descriptions})"
    hint = f" ({schema['description']})" if "description" in schema else ""
    return f"config key '{_key(error.absolute_path)}': {error.message}{hint}"


def _check_finite(value, path: list) -> None:
    """Reject NaN and ±infinity anywhere (YAML's ``.nan``, ``.inf``): range checks let NaN through."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{_key(path)}': {value} is not a finite number")
    for key, item in value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ():
        _check_finite(item, [*path, key])



def declared_reads(node: dict | None = None, inherited: str | None = None, prefix: str = "") -> dict[str, str | None]:
    """Every key of the schema (dotted, down to the leaves of its sections) → its declared ``x-reads``
    class (:data:`EDIT_RERUNS`), inherited from the nearest section that declares one; None: none declared."""
    node = load_schema() if node is None else node
    declared = {}
    for name, entry in node["properties"].items():
        key, reads = f"{prefix}{name}", entry.get("x-reads", inherited)
        if "properties" in entry:
            declared |= declared_reads(entry, reads, f"{key}.")
        else:
            declared[key] = reads
    return declared


def schema_entry(key: str) -> dict:
    """The schema node of a dotted config key (``training.learning_rate``) or a definition
    (``$defs.zeta``), its ``$ref`` resolved."""
    root = load_schema()
    first, *rest = key.split(".")
    node = root["$defs"][rest.pop(0)] if first == "$defs" else root["properties"][first]
    for part in rest:
        node = node["properties"][part]
    return resolve_ref(node, root)


def default_of(key: str):
    """The schema's default of a dotted config key or definition (see :func:`schema_entry`)."""
    return schema_entry(key)["default"]


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_ONE_BOUND = {"minimum": "be at least", "exclusiveMinimum": "be greater than", "maximum": "be at most",
              "exclusiveMaximum": "be less than"}
"""A schema node's one bound (the first it has, in this order) → the words before its value."""


def _allowed(entry: dict) -> str:
    """What a schema node allows, as the end of a sentence "NAME must …"."""
    if "enum" in entry:
        return "be one of " + ", ".join(map(str, entry["enum"]))
    if "const" in entry:
        note = f" ({entry['description']})" if "description" in entry else ""
        return f"be {_number(entry['const'])}{note}"
    if "anyOf" in entry:
        branches = [_allowed(branch) for branch in entry["anyOf"]]
        if any(text.startswith("match") for text in branches):  # a branch only its description can say
            return f"be one of these: {entry.get('description', 'see the schema')}"
        return " or ".join(branches).replace(" or be ", " or ")
    # both bounds: an interval, [0, 1)-style
    low = ("(", entry["exclusiveMinimum"]) if "exclusiveMinimum" in entry else ("[", entry.get("minimum"))
    high = (")", entry["exclusiveMaximum"]) if "exclusiveMaximum" in entry else ("]", entry.get("maximum"))
    if low[1] is not None and high[1] is not None:
        return f"lie in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
    if entry.get("minimum") == 1 and entry.get("type") == "integer":
        return "be a positive integer"
    bound = next((key for key in _ONE_BOUND if key in entry), None)
    return "match the schema" if bound is None else f"{_ONE_BOUND[bound]} {_number(entry[bound])}"


_JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, (list, tuple)),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _typed(value, entry: dict) -> bool:
    """Whether ``value`` has one of the JSON types ``entry`` declares (any, where it declares none)."""
    types = entry.get("type")
    return types is None or any(_JSON_TYPES[kind](value) for kind in ([types] if isinstance(types, str) else types))


def _fits(value, entry: dict) -> bool:
    if not _typed(value, entry):
        return False
    if "anyOf" in entry:
        return any(_fits(value, branch) for branch in entry["anyOf"])
    if "const" in entry:
        return value == entry["const"] and not isinstance(value, bool)
    if "enum" in entry:
        return value in entry["enum"]
    if isinstance(value, (list, tuple)):
        return len(value) >= entry.get("minItems", 0) and all(_fits(item, entry.get("items", {})) for item in value)
    if not _JSON_TYPES["number"](value):
        return True  # a range says nothing about a string, a path or a layer selection
    return (value >= entry.get("minimum", value) and value <= entry.get("maximum", value)
            and ("exclusiveMinimum" not in entry or value > entry["exclusiveMinimum"])
            and ("exclusiveMaximum" not in entry or value < entry["exclusiveMaximum"]))


def out_of_range(value, entry: dict) -> str | None:
    """Where ``value`` breaks the range or the allowed values of the schema node ``entry``
    (``minimum``/``maximum`` and their exclusive forms, ``enum``, ``const``, ``anyOf`` of these, a
    list's ``items``, and ``type: integer``): the end of a sentence "NAME must …", else None.

    A None value (a setting left unset) is in range. This is the one range check of the step
    specifications (:mod:`istar.config.specs`), so a step refuses exactly what the config refuses.
    It does not call jsonschema: a GPU bundle's steps run where jsonschema is not installed
    (docs/gpu-bundle.md), and the messages name the bound in the words the steps always used.
    """
    if value is None or _fits(value, entry):
        return None
    items = entry.get("items")
    if isinstance(value, list) and items and "enum" in items:
        unknown = [item for item in value if item not in items["enum"]]
        return f"hold only {', '.join(map(str, items['enum']))} (unknown: {', '.join(map(str, unknown))})"
    if not _typed(value, entry) and "anyOf" not in entry:
        kinds = entry["type"] if isinstance(entry["type"], str) else " or ".join(entry["type"])
        allowed = _allowed(entry)
        return f"be of type {kinds}" + ("" if allowed.startswith("match") else f" and {allowed}".replace("and be ", "and "))
    return _allowed(entry)


def check_schema(config: dict) -> dict:
    """A copy of ``config`` with every default filled in, checked against the schema.

    Raises
    ------
    ConfigError naming the first invalid key and the allowed values.
    """
    import jsonschema

    schema = load_schema()
    config = copy.deepcopy(config or {})
    if not isinstance(config, dict):
        raise ConfigError("the configuration must be a mapping of keys to values")
    _check_finite(config, [])
    fill_defaults(config, schema, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        deepest = max(errors, key=lambda e: len(e.absolute_path))
        raise ConfigError(_describe(deepest if deepest.absolute_path else errors[0]))
    return config
