"""Forced tool calls in chat completions: ``tool_choice: "required"`` (the first of
``tools``) or ``{"type": "function", "function": {"name": ...}}`` makes the answer one call of
that function, its ``arguments`` the JSON object ``{"text": <the generated text>}``, with
``finish_reason: "tool_calls"`` whatever stopped the generation. This engine does not decide to
call a tool on its own (``"auto"`` and ``"none"`` answer in text) and does not constrain the
generation to the tool's parameters' schema: the call's structure is valid, its arguments are
what the model wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from backends.server.protocol import RequestError

TOOL_CALLS = "tool_calls"  # the finish reason of an answer that is a call


def forced_tool(body: Mapping[str, object]) -> str | None:
    """The function a chat request's answer must call, or None (a text answer)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise RequestError("tool_choice needs tools", "tool_choice")
        return None
    names = _tool_names(tools)
    if choice is None or choice in ("auto", "none"):
        return None
    if choice == "required":
        return names[0]
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise RequestError(
            'tool_choice must be "none", "auto", "required" or a named function', "tool_choice"
        )
    if name not in names:
        raise RequestError(f"tool_choice names {name!r}, which is not among tools", "tool_choice")
    return name


def _tool_names(tools: object) -> list[str]:
    names: list[str] = []
    for number, tool in enumerate(tools if isinstance(tools, list) else [None]):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise RequestError("each tool must be a function with a name", f"tools[{number}]")
        names.append(name)
    if not names:
        raise RequestError("tools must be a non-empty list", "tools")
    return names


def finish_reason(tool: str | None, reason: str | None) -> str | None:
    """An answer's finish reason: ``tool_calls`` for a forced call, whatever stopped it."""
    return TOOL_CALLS if tool and reason else reason


def call_id(request_id: str, index: int) -> str:
    return f"call_{request_id[:24]}_{index}"


def tool_message(name: str, text: str, ident: str) -> dict[str, object]:
    """The assistant message of a whole (not streamed) answer that calls ``name``."""
    call = {
        "id": ident,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"text": text})},
    }
    return {"role": "assistant", "content": None, TOOL_CALLS: [call]}


def arguments_delta(text: str, first: bool, last: bool) -> str:
    """A streamed piece of the arguments ``{"text": ...}``: its opening on the first piece,
    its close on the last, ``text`` escaped as inside a JSON string."""
    piece = json.dumps(text)[1:-1]
    return ('{"text": "' if first else "") + piece + ('"}' if last else "")
