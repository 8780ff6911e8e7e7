#!/usr/bin/python3
"""Renders chat templates with Python's Jinja2 the way Hugging Face transformers'
`apply_chat_template` does, for tests/chat_templates_jinja2.rs to hold edgellm's renderings to.

The environment is transformers' (utils/chat_template_utils.py): an ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loopcontrols extension, a `{% generation %}` block (its
assistant-mask tracker; with no mask asked for it renders its body), `tojson` as a plain
`json.dumps` (no HTML escaping, `ensure_ascii=False`), and the globals `raise_exception` and
`strftime_now`. A rendering gets `messages`, `tools` (None), `documents` (None),
`add_generation_prompt`, and the tokenizer's special tokens (here `bos_token`, `eos_token`).

One difference, on purpose: `strftime_now` prints UTC, as edgellm's does (an appliance has no
time-zone database to trust), where transformers prints local time.

stdin: {"bos_token": str, "eos_token": str, "templates": [str], "conversations":
        [{"messages": [{"role", "content"}], "add_generation_prompt": bool}]}
stdout: one list per template, one entry per conversation: {"text": str} or {"error": str}.
"""

import json
import sys
from datetime import datetime, timezone

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`: marks the assistant's text for transformers'
    assistant-token mask. Without a mask it is its body, rendered as a call block."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def strftime_now(fmt):
    return datetime.now(timezone.utc).strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Generation, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def describe(e):
    return f"{type(e).__name__}: {e}"


def main():
    job = json.load(sys.stdin)
    env = environment()
    specials = {"bos_token": job["bos_token"], "eos_token": job["eos_token"]}
    results = []
    for source in job["templates"]:
        try:
            template = env.from_string(source)
        except Exception as e:  # noqa: BLE001 - any failure is the answer for this template
            results.append([{"error": describe(e)} for _ in job["conversations"]])
            continue
        row = []
        for conv in job["conversations"]:
            try:
                text = template.render(
                    messages=conv["messages"],
                    tools=None,
                    documents=None,
                    add_generation_prompt=conv["add_generation_prompt"],
                    **specials,
                )
                row.append({"text": text})
            except Exception as e:  # noqa: BLE001
                row.append({"error": describe(e)})
        results.append(row)
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
