"""Name -> tool class registry, so configs and the CLI can ask for tools by name."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from mmagent.toolbox.base import Tool

_REGISTRY: dict[str, type[Tool]] = {}

T = TypeVar("T", bound=type[Tool])


def register(cls: T) -> T:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"a different tool is already registered as {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def available_tools() -> list[str]:
    """Names of all registered tools, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def create_tool(name: str, **kwargs: Any) -> Tool:
    """Instantiate the tool registered as ``name``; unknown names list what exists."""
    _load_builtin()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown tool {name!r}; available: {', '.join(sorted(_REGISTRY))}") from None
    return cls(**kwargs)


def resolve_tools(tools: "list[str | Tool] | None", default: Callable[[], list[str]]) -> list[Tool]:
    """Turn a mixed list of names and Tool objects into tools; ``None`` means ``default()``."""
    names_or_tools = default() if tools is None else tools
    out: list[Tool] = []
    for item in names_or_tools:
        out.append(create_tool(item) if isinstance(item, str) else item)
    seen = [t.name for t in out]
    if len(set(seen)) != len(seen):
        raise ValueError(f"duplicate tool names: {seen}")
    return out


def _load_builtin() -> None:
    # Importing the modules runs their @register decorators.
    import mmagent.toolbox.depth  # noqa: F401
    import mmagent.toolbox.frames  # noqa: F401
    import mmagent.toolbox.segment  # noqa: F401
    import mmagent.toolbox.web_search  # noqa: F401
    import mmagent.toolbox.zoom  # noqa: F401
