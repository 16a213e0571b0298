"""Parse YAML into plain Python values, remembering each value's line, with ${ENV} interpolation.

``${NAME}`` in a string is replaced by the environment variable (``${NAME:-default}`` gives a
default); a missing variable is an error naming the field path, never a silent empty string.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import yaml

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass
class Source:
    """Parsed YAML plus the line of every field path (``routes[2].pool``)."""

    data: object
    lines: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def where(self, path: str) -> str:
        """``path (line N)`` with the line of the path or of its nearest parent."""
        probe = path
        while probe:
            line = self.lines.get(probe)
            if line:
                return f"{path} (line {line})"
            parent = re.sub(r"(\.[^.\[]+|\[\d+\])$", "", probe)
            if parent == probe:
                break
            probe = parent
        return path


def _child(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _interpolate(text: str, path: str, source: Source) -> str:
    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = os.environ.get(name)
        if value is None:
            if default is not None:
                return default
            source.errors.append(f"{source.where(path)}: environment variable {name} is not set")
            return ""
        return value

    return _ENV.sub(replace, text)


def parse_yaml(text: str) -> Source:
    """Parse ``text``; syntax errors are reported with their line, not raised."""
    source = Source(None)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        source.errors.append(f"invalid YAML{line}: {problem}")
        return source
    finally:
        loader.dispose()
    if node is None:
        source.data = {}
        return source
    source.data = _build(node, "", source, yaml.SafeLoader(""))
    return source


def _build(node: yaml.Node, path: str, source: Source, loader: yaml.SafeLoader) -> object:
    source.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[str, object] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str | int):
                source.errors.append(f"{path or '<root>'} (line {line}): keys must be strings")
                continue
            key = str(key)
            if key in result:
                source.errors.append(f"{_child(path, key)} (line {line}): duplicate key")
            result[key] = _build(value_node, _child(path, key), source, loader)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, _child(path, i), source, loader) for i, item in enumerate(node.value)]
    value = loader.construct_object(node)
    if isinstance(value, str):
        return _interpolate(value, path, source)
    return value
