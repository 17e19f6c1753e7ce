"""A MkDocs hook: the API reference page, written from app/openapi.json at every build.

The document the service serves at GET /v1/openapi.json is the one source: the page
lists every path and operation of it, grouped by tag, then every schema, so a door
added to the document appears in the reference without touching the docs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

DOCUMENT = Path(__file__).resolve().parents[2] / "app" / "openapi.json"
PAGE = "api/reference.md"
METHODS = ("get", "post", "put", "patch", "delete")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated reference page to the site's files."""
    document = json.loads(DOCUMENT.read_text())
    files.append(File.generated(config, PAGE, content=reference_page(document)))
    return files


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Rebuild when the document changes under ``mkdocs serve``."""
    config.watch.append(str(DOCUMENT))
    return config


def reference_page(document: dict[str, Any]) -> str:
    """Render the whole document as one Markdown page."""
    info = document["info"]
    lines = [
        "# API reference",
        "",
        f"Generated from `app/openapi.json` ({info['title']} {info['version']}, OpenAPI "
        f"{document['openapi']}), which the service serves at `GET /v1/openapi.json` without "
        "a key.",
        "",
        info.get("description", ""),
        "",
        *security_lines(document),
    ]
    for tag, operations in operations_by_tag(document).items():
        lines += ["", f"## {tag.capitalize()}", ""]
        for path, method, operation in operations:
            lines += operation_lines(document, path, method, operation)
    lines += ["", "## Schemas", ""]
    for name, schema in document["components"]["schemas"].items():
        lines += schema_lines(name, schema)
    return "\n".join(lines) + "\n"


def security_lines(document: dict[str, Any]) -> list[str]:
    """List the ways a caller presents its key."""
    schemes = document["components"].get("securitySchemes", {})
    lines = ["Authentication:", ""]
    for name, scheme in schemes.items():
        lines.append(f"- `{name}`: {scheme.get('description', scheme.get('type', ''))}")
    return lines


def operations_by_tag(document: dict[str, Any]) -> dict[str, list[tuple[str, str, dict]]]:
    """Group every operation under its first tag, in the document's order."""
    groups: dict[str, list[tuple[str, str, dict]]] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                tag = (item[method].get("tags") or ["other"])[0]
                groups.setdefault(tag, []).append((path, method, item[method]))
    return groups


def operation_lines(document: dict[str, Any], path: str, method: str, operation: dict) -> list[str]:
    """Render one operation: summary, parameters, body and answers."""
    lines = [f"### `{method.upper()} {path}`", "", operation.get("summary", "")]
    if operation.get("description"):
        lines += ["", operation["description"]]
    if operation.get("security") == []:
        lines += ["", "No key needed."]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["", "| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for parameter in parameters:
            lines.append(
                f"| `{parameter['name']}` | {parameter['in']}"
                f" | {type_of(parameter.get('schema', {}))}"
                f" | {'yes' if parameter.get('required') else 'no'}"
                f" | {cell(parameter.get('description', ''))} |"
            )
    body = operation.get("requestBody")
    if body:
        lines += ["", f"Body: {content_types(body)}"]
    lines += ["", "| status | answer |", "|---|---|"]
    for status, answer in operation.get("responses", {}).items():
        answer = resolve(document, answer)
        lines.append(
            f"| {status} | {cell(answer.get('description', ''))} {content_types(answer)} |"
        )
    return lines + [""]


def content_types(body: dict) -> str:
    """Say each media type of a body or answer with the schema it follows."""
    parts = []
    for media, content in body.get("content", {}).items():
        schema = content.get("schema")
        parts.append(f"`{media}` {type_of(schema)}" if schema else f"`{media}`")
    return "; ".join(parts)


def resolve(document: dict[str, Any], node: dict) -> dict:
    """Follow a local ``$ref`` (to a shared answer) to what it names."""
    while "$ref" in node:
        target: Any = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def schema_lines(name: str, schema: dict) -> list[str]:
    """Render one schema: its description, then its properties or its variants."""
    lines = [f"### {name} {{#schema-{name.lower()}}}", "", f"Type: {type_of(schema, link=False)}"]
    if schema.get("description"):
        lines += ["", schema["description"]]
    rows = property_rows(schema)
    if rows:
        lines += ["", "| field | type | required | description |", "|---|---|---|---|", *rows]
    return lines + [""]


def property_rows(schema: dict, prefix: str = "") -> list[str]:
    """One table row per property; an object's own properties follow it, named by a dot."""
    required = set(schema.get("required", []))
    rows = []
    for field, spec in schema.get("properties", {}).items():
        rows.append(
            f"| `{prefix}{field}` | {type_of(spec)} | {'yes' if field in required else 'no'}"
            f" | {cell(description_of(spec))} |"
        )
        rows += property_rows(spec, f"{prefix}{field}.")
        rows += property_rows(spec.get("items", {}), f"{prefix}{field}[].")
    return rows


def description_of(schema: dict) -> str:
    """Return a property's description, or that of the variant that carries one."""
    if schema.get("description"):
        return schema["description"]
    for variant in schema.get("anyOf", []) + schema.get("oneOf", []):
        if variant.get("description"):
            return variant["description"]
    return ""


def type_of(schema: dict, link: bool = True) -> str:
    """Say a schema's type in a few words: a link for a reference, variants joined by 'or'."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})" if link else name
    for combinator in ("anyOf", "oneOf"):
        if combinator in schema:
            return " or ".join(type_of(variant, link) for variant in schema[combinator])
    if "allOf" in schema:
        return " and ".join(type_of(part, link) for part in schema["allOf"])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}), link)}"
    return kind


def cell(text: str) -> str:
    """Make text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
