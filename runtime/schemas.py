"""JSON Schema checks of a package's JSON files against this runtime's own schemas (docs/package-format.md R1, R3).

jsonschema is imported only when a check runs. Two of its validators are replaced for speed on files a client does
not control (up to 1 MiB of manifest, 4 MiB of labels): `uniqueItems` and `items` over lists of names.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

from edgekit.runtime.jsonfile import MANIFEST_BYTES, read_json


def short(value, n: int = 80) -> str:
    """repr(value), cut to n characters: a message stays one short line whatever the file holds."""
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


@functools.cache
def schema(path: Path) -> dict:
    """A JSON Schema this runtime holds a package's JSON to: its own copy (a package's copy is data, not authority),
    read as the package's files are (edgekit.runtime.jsonfile)."""
    return read_json(path, MANIFEST_BYTES, "schema")


def _unique(validator, unique, instance, _schema):
    """uniqueItems, linear: every array these schemas keep unique holds strings (`items` refuses the rest), and
    jsonschema's own check is quadratic on an array of mixed types."""
    if unique and isinstance(instance, list) and all(isinstance(x, str) for x in instance):
        seen: set[str] = set()
        twice = next((x for x in instance if x in seen or seen.add(x)), None)
        if twice is not None:
            import jsonschema

            yield jsonschema.ValidationError(f"{short(twice)} is given twice (each name once)")


def _items(validator, items, instance, schema):
    """`items`; for a list of names (labels.json's: up to 4 MiB of them) under a {"type": "string", "minLength"}
    item schema, only the items that fail it are descended into (jsonschema's own descends into each: 6 s for 400k)."""
    import jsonschema

    simple = isinstance(items, dict) and items.get("type") == "string" and set(items) <= {"type", "minLength",
                                                                                          "description"}
    if not (simple and isinstance(instance, list) and "prefixItems" not in schema):
        yield from jsonschema.Draft202012Validator.VALIDATORS["items"](validator, items, instance, schema)
        return
    least = items.get("minLength", 0)
    bad = (k for k, x in enumerate(instance) if not isinstance(x, str) or len(x) < least)
    for k in itertools.islice(bad, 100):
        yield from validator.descend(instance[k], items, path=k)


@functools.cache
def _validator(path: Path):
    import jsonschema

    # JSON Schema's own "integer": 16.0 is the integer 16 (R3); the runtime makes it an int after validation
    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"uniqueItems": _unique, "items": _items})
    return cls(schema(path))


def first_error(instance, path: Path, what: str = "(the manifest)") -> str | None:
    """"FIELD: why" for the best of the first errors the schema at `path` finds in `instance` (`what` names the
    whole file), or None when it is valid."""
    import jsonschema

    # the first 100 errors: best_match weighs each, and a 1 MiB file can hold hundreds of thousands
    err = jsonschema.exceptions.best_match(itertools.islice(_validator(path).iter_errors(instance), 100))
    if err is None:
        return None
    field = ".".join(map(str, err.absolute_path)) or what
    if err.validator == "pattern" and "description" in err.schema:  # the description, not the regex itself
        why = f"{short(err.instance)} is not {err.schema['description']}"
    else:  # jsonschema's message quotes the instance: cut it to one short line
        why = err.message if len(err.message) <= 200 else err.message[:120] + " ... " + err.message[-70:]
    return f"{field}: {why}"
