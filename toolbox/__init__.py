"""The visual toolbox: tools the agent can call, one module per tool, plus the base class and registry."""

from mmagent.toolbox.base import Frame, Observation, Tool, ToolContext, ToolError, VideoSource
from mmagent.toolbox.registry import available_tools, create_tool, register, resolve_tools

__all__ = [
    "Frame",
    "Observation",
    "Tool",
    "ToolContext",
    "ToolError",
    "VideoSource",
    "available_tools",
    "create_tool",
    "register",
    "resolve_tools",
]
