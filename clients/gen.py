"""The client libraries' types, made from openapi.yaml: Python dataclasses
(clients/python/subagentd/_models.py) and TypeScript interfaces
(clients/typescript/src/models.ts), one per schema named in MODELS. And the Python client's
synchronous half (_sync.py), made from its asynchronous one (_async.py) as unasync does: the
two are one source, written once.

    python clients/gen.py           # write the three files
    python clients/gen.py --check   # exit 1 if any is not what its source makes

A field added to the API (in openapi.yaml) and missed by a client fails the check, which the
test suite runs (tests/api/clients.rs).
"""
import json
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEC = ROOT / "openapi.yaml"
PY = ROOT / "clients/python/subagentd/_models.py"
ASYNC = ROOT / "clients/python/subagentd/_async.py"
SYNC = ROOT / "clients/python/subagentd/_sync.py"
TS = ROOT / "clients/typescript/src/models.ts"

# openapi.yaml's component schema → the clients' type of the same name.
MODELS = [
    "Task", "PendingAction", "TaskPage", "Event", "EventsPage", "Message", "Call", "CancelledMany",
    "Agent", "Tool", "ToolSource", "UsageRow", "UsageReport", "Key", "NewKey", "Limits", "TenantView",
    "Schedule", "Problem", "FieldError", "Workspace", "Secret", "DiffStats", "Environment",
]

KEYWORDS = {"try", "from", "global", "class", "def", "return", "import", "pass", "in", "is", "not", "and", "or"}


def load():
    return yaml.safe_load(SPEC.read_text())


def resolve(spec, s):
    if isinstance(s, dict) and "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return name, spec["components"]["schemas"][name]
    return None, s


def types_of(s):
    t = s.get("type")
    if isinstance(t, list):
        return [x for x in t if x != "null"], "null" in t
    if t is None and "enum" in s:
        return ["string"], None in s["enum"]
    return ([t] if t else []), False


class Lang:
    """How one language names the JSON types."""

    def __init__(self, names, unknown, unknown_nullable, array):
        self.names, self.unknown, self.unknown_nullable, self.array = names, unknown, unknown_nullable, array


PY_NAMES = Lang({"string": "str", "integer": "int", "number": "float", "boolean": "bool", "object": "Dict[str, Any]"},
          "Any", True, "List[{}]")
TS_NAMES = Lang({"string": "string", "integer": "number", "number": "number", "boolean": "boolean",
           "object": "Record<string, unknown>"}, "unknown", False, "{}[]")


def type_in(lang, spec, s):
    """The type of schema `s` in `lang`, and whether it may be null."""
    name, s2 = resolve(spec, s)
    if name in MODELS:
        return name, False
    if name and not s2.get("properties"):
        s = s2
    ts, nullable = types_of(s)
    if len(ts) != 1:
        return lang.unknown, lang.unknown_nullable
    t = ts[0]
    if t == "array":
        item, _ = type_in(lang, spec, s.get("items", {}))
        return lang.array.format(item), nullable
    return lang.names.get(t, lang.unknown), nullable


def py_type(spec, s):
    return type_in(PY_NAMES, spec, s)


def ts_type(spec, s):
    return type_in(TS_NAMES, spec, s)


def nested(spec, s):
    """The model a field holds (or holds a list of), if any."""
    name, _ = resolve(spec, s)
    if name in MODELS:
        return name, False
    if s.get("type") == "array" or (isinstance(s.get("type"), list) and "array" in s["type"]):
        name, _ = resolve(spec, s.get("items", {}))
        if name in MODELS:
            return name, True
    return None, False


def python(spec):
    out = ['"""The API\'s types, made from openapi.yaml by clients/gen.py: do not edit by hand."""',
           "# fmt: off", "from __future__ import annotations", "",
           "import dataclasses as _dc", "from dataclasses import dataclass", "from typing import Any, Dict, List, Optional", "",
           "from ._model import Model", ""]
    for name in MODELS:
        s = spec["components"]["schemas"][name]
        props = s.get("properties", {})
        required = set(s.get("required", []))
        desc = (s.get("description") or f"A {name} as the API shows it.").split("\n")[0].replace('"""', "'")
        out += ["", "@dataclass(repr=False)", f"class {name}(Model):", f'    """{desc}"""', ""]
        nests = {}
        for p, ps in props.items():
            attr = p + "_" if p in KEYWORDS else p
            t, nullable = py_type(spec, ps)
            n, many = nested(spec, ps)
            if n:
                nests[p] = (n, many)
            out.append(f"    {attr}: Optional[{t}] = None")
        out.append("    extra: Dict[str, Any] = _dc.field(default_factory=dict)")
        out.append(f"    _fields = {json.dumps(list(props))}")
        out.append(f"    _nested = {{{', '.join(f'{json.dumps(k)}: ({json.dumps(v[0])}, {v[1]})' for k, v in nests.items())}}}")
        out.append(f"    _required = {json.dumps(sorted(required & set(props)))}")
    return "\n".join(out) + "\n"


def typescript(spec):
    out = ["// The API's types, made from openapi.yaml by clients/gen.py: do not edit by hand.", ""]
    for name in MODELS:
        s = spec["components"]["schemas"][name]
        props = s.get("properties", {})
        required = set(s.get("required", []))
        desc = (s.get("description") or f"A {name} as the API shows it.").split("\n")[0]
        out += [f"/** {desc} */", f"export interface {name} {{"]
        for p, ps in props.items():
            t, nullable = ts_type(spec, ps)
            opt = "" if p in required else "?"
            key = p if p.isidentifier() else json.dumps(p)
            out.append(f"  {key}{opt}: {t}{' | null' if nullable else ''};")
        out += ["  /** Fields this version does not know yet. */", "  [field: string]: unknown;", "}", ""]
    out.append(f"export const MODEL_FIELDS: Record<string, string[]> = {json.dumps({n: list(spec['components']['schemas'][n].get('properties', {})) for n in MODELS})};")
    return "\n".join(out) + "\n"


# _async.py's words → _sync.py's, in order (a longer word before the word it contains).
UNASYNC = [
    ('"""The asynchronous client: `AsyncClient(base_url=…, api_key=…)`, the same shape as `Client`,\n'
     'its methods coroutines and its lists and events async iterators."""',
     '"""The synchronous client: `Client(base_url=…, api_key=…)`, its resources as attributes.\n\n'
     'Made from _async.py by clients/gen.py: edit that file, then run `python clients/gen.py`."""'),
    ('"""An asynchronous client of one subagentd service (see `Client`).', '"""A client of one subagentd service.'),
    ('__all__ = ["AsyncClient"]', '__all__ = ["Client", "APIStatusError", "NotFoundError", "ServerError", "TERMINAL"]'),
    ("import asyncio", "import time"),
    ("asyncio.sleep", "time.sleep"),
    ("AsyncIterator", "Iterator"),
    ("httpx.AsyncClient", "httpx.Client"),
    ("AsyncClient", "Client"),
    ("async def ", "def "),
    ("async with ", "with "),
    ("async for ", "for "),
    ("await ", ""),
    (".aclose()", ".close()"),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
    (".aread()", ".read()"),
    (".aiter_text()", ".iter_text()"),
]


def unasync(text):
    """The synchronous client, from the asynchronous one's text."""
    for a, b in UNASYNC:
        text = text.replace(a, b)
    return text


def main():
    spec = load()
    made = {PY: python(spec), TS: typescript(spec), SYNC: unasync(ASYNC.read_text())}
    if "--check" in sys.argv:
        stale = [str(p.relative_to(ROOT)) for p, text in made.items() if not p.exists() or p.read_text() != text]
        if stale:
            print("not made from their sources (run python clients/gen.py): " + ", ".join(stale))
            sys.exit(1)
        print("clients' types match openapi.yaml, and _sync.py matches _async.py")
        return
    for p, text in made.items():
        p.write_text(text)
        print("wrote", p.relative_to(ROOT))


if __name__ == "__main__":
    main()
