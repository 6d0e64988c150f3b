"""Deterministic answers shared by modern_client.py and legacy_client.py.

Standard library only: the two clients live in different virtualenvs (mcp 2.3.0
and mcp 1.30.0), so the SDK-specific wrapping stays in each client and the
answers themselves live here, where both can import them.
"""

from __future__ import annotations

from typing import Any

ROOTS = [
    {"uri": "file:///tmp/project-a", "name": "a"},
    {"uri": "file:///tmp/project-b", "name": "b"},
]

SAMPLING_MODEL = "test-model"
SAMPLING_STOP_REASON = "endTurn"

# Fixed answers per requested form property.  `first`/`second` depend on --tag.
_FIXED: dict[str, Any] = {
    "name": "Ada",
    "color": "blue",
    "topic": "rust",
    "style": "terse",
    "greeting": "Hi",
    "confirm": True,
    "answer": "42",
}


def elicitation_content(requested_schema: dict[str, Any] | None, tag: str) -> dict[str, Any]:
    """Fill every property of a flat form schema with the agreed answer."""
    props = (requested_schema or {}).get("properties") or {}
    content: dict[str, Any] = {}
    for key, prop in props.items():
        if key in _FIXED:
            content[key] = _FIXED[key]
        elif key == "first":
            content[key] = f"{tag}-1"
        elif key == "second":
            content[key] = f"{tag}-2"
        else:
            # Unknown field: answer something valid for its declared type.
            kind = (prop or {}).get("type")
            content[key] = {"boolean": True, "integer": 0, "number": 0}.get(kind, f"unknown-{key}")
    return content


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """Join the text blocks of sampling messages (content may be a block or a list)."""
    parts: list[str] = []
    for msg in messages:
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [content]
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def sampling_text(prompt: str) -> str:
    """The assistant text a sampling request gets back."""
    if "France" in prompt:
        return "Paris"
    if "Pick a number" in prompt:
        return "7"
    return f"sampled: {prompt[:20]}"
