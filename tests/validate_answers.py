#!/usr/bin/python3
"""Validates answers made under a JSON Schema with Python's jsonschema, an implementation that
shares nothing with the grammar engine that constrained them.

    validate_answers.py SCHEMAS ANSWERS

SCHEMAS: a JSON list of {"name", "schema"}. ANSWERS: JSON lines of {"name", "model", "seed",
"valid", "text"}. Every answer marked valid must parse as JSON and validate against its schema
(formats checked where jsonschema can); the exit status is 1 if one does not. Prints one
summary line, and each failure.
"""
import importlib.metadata
import json
import sys

import jsonschema

schemas = {s["name"]: s["schema"] for s in json.load(open(sys.argv[1]))}
checked = failed = invalid = 0
for line in open(sys.argv[2]):
    a = json.loads(line)
    if not a["valid"]:
        invalid += 1
        continue
    checked += 1
    schema = schemas[a["name"]]
    try:
        value = json.loads(a["text"])
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)
    except (ValueError, jsonschema.ValidationError) as e:
        failed += 1
        print(f"FAIL {a['model']} {a['name']} seed {a['seed']}: {str(e).splitlines()[0]}\n"
              f"     {a['text']!r}")
print(f"jsonschema {importlib.metadata.version('jsonschema')}: "
      f"{checked} answers marked valid, {checked - failed} validate, {failed} do not; "
      f"{invalid} marked invalid")
sys.exit(1 if failed else 0)
