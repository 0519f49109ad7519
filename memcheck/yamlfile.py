"""Read a YAML file keeping the line of every field, so errors can name file, line and field path."""
from __future__ import annotations

import yaml

from .errors import UsageError


class Located:
    """Parsed YAML plus the line of each field path ('requests[0].count' -> 12)."""

    def __init__(self, path: str, data, lines: dict[str, int]):
        self.path, self.data, self.lines = path, data, lines

    def line(self, field: str) -> int | None:
        # Fall back to the nearest enclosing field that has a line.
        while field:
            if field in self.lines:
                return self.lines[field]
            field = field.rsplit(".", 1)[0] if "." in field else (field.split("[")[0] if "[" in field else "")
        return None

    def error(self, field: str, message: str) -> UsageError:
        return UsageError(message, self.path, self.line(field), field)


def load(path: str) -> Located:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"cannot read: {e.strerror}", path) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[str, int] = {}
        data = _convert(loader, node, "", lines, path) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise UsageError(f"YAML syntax: {e.problem or e.context}", path, mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise UsageError(f"YAML syntax: {e}", path) from None
    finally:
        loader.dispose()
    return Located(path, data, lines)


def _convert(loader, node, at: str, lines: dict, path: str):
    lines.setdefault(at, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise UsageError(f"keys must be strings, got {key!r}", path, key_node.start_mark.line + 1, at or None)
            child = f"{at}.{key}" if at else key
            if key in out:
                raise UsageError("duplicate key", path, key_node.start_mark.line + 1, child)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _convert(loader, value_node, child, lines, path)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(loader, item, f"{at}[{i}]", lines, path) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)
