"""Which module wrote a workflow in Python, and its text as a registration keeps it
(processor/authoring.py records the first, ``ductor workflows register`` asks for the second;
core/workflow_source.py bounds it)."""

from __future__ import annotations

import inspect
import sys
from types import FrameType

from processor.core.workflow_source import WorkflowSource, bounded_source


def creating_module(inside: str) -> str | None:
    """The name of the module whose code called into module ``inside`` (the caller's): that
    of the first frame outside it, as ``warnings.warn`` finds its caller. None when there is
    no such frame or it has no name."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == inside:
        frame = frame.f_back
    if frame is None:
        return None
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else None


def module_source(name: str | None) -> WorkflowSource | None:
    """The text of imported module ``name``, bounded; None when it cannot be read (a module
    with no source file: made by ``exec``, typed in a REPL, shipped as bytecode only)."""
    module = sys.modules.get(name or "")
    if module is None:
        return None
    try:
        text = inspect.getsource(module)
    except (OSError, TypeError):  # no file, or a built-in module
        return None
    return WorkflowSource(module.__name__, bounded_source(text))
