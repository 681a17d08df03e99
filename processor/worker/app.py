"""`ductor worker --app MODULE:ATTRIBUTE`: the step registry a worker runs, imported the way
`uvicorn module:app` and `celery -A` import an application. The current directory is put
first on the import path, as uvicorn does, so a module beside you imports without installing
it."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from dataclasses import replace

from processor.io.telemetry.logs import first_line
from processor.worker.options import WorkerOptions
from processor.worker.samples import sample_registry
from processor.worker.steps import StepRegistry

_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"  # dotted Python identifiers
_SPEC = re.compile(f"({_NAME}):({_NAME})")


class AppError(ValueError):
    """``--app`` does not name a usable step registry; the message says why."""


def load_registry(spec: str) -> StepRegistry:
    """The StepRegistry that ``spec`` (``module.path:attribute``, the attribute possibly
    dotted) names, directly or as a code-first ``Workflow``'s (processor/authoring.py), or
    AppError saying what is wrong: a malformed spec, a module that cannot be imported (and
    why), a missing attribute, something that is neither or one with no step function."""
    target = load_attribute(spec, "--app", "my_package.steps:registry")
    # A code-first Workflow (processor/authoring.py, a layer above the worker) carries its
    # registry: asked for by that attribute, not by its class, so the worker imports nothing
    # above its layer.
    carried = getattr(target, "registry", None)
    if isinstance(carried, StepRegistry) and not isinstance(target, StepRegistry):
        target = carried
    if not isinstance(target, StepRegistry):
        raise AppError(
            f"--app: {spec} is a {type(target).__name__}, not a StepRegistry (processor.worker)"
            " nor a Workflow"
        )
    if not target.types():
        raise AppError(f"--app: {spec} registers no step function")
    return target


def load_attribute(spec: str, option: str, example: str) -> object:
    """What ``spec`` (``module.path:attribute``) names, imported as uvicorn imports an
    application; AppError (its message starting with ``option``) when it cannot be."""
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise AppError(f"{option} {spec!r} is not MODULE:ATTRIBUTE, e.g. {example}")
    module_name, attribute = match.groups()
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        target: object = importlib.import_module(module_name)
    except Exception as exc:  # whatever the module raises while it is imported
        raise AppError(
            f"{option}: cannot import module {module_name!r}: {type(exc).__name__}:"
            f" {first_line(exc)}"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise AppError(f"{option}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def registry_for(spec: str | None) -> StepRegistry:
    """The registry ``--app`` names, or the sample steps without one."""
    return sample_registry() if spec is None else load_registry(spec)


def child_spec(registry: StepRegistry, app: str | None) -> str | None:
    """What a child process imports to run ``registry``'s steps (isolation.py): ``app`` when
    given; else the ``module:attribute`` of an imported module that holds ``registry`` (a
    worker built in Python with a module's registry); else None when ``registry`` is the
    sample steps (a child without a spec builds them). AppError when a child cannot get it:
    a registry built in a function, or in the ``__main__`` script."""
    if app is not None:
        return app
    for name, module in list(sys.modules.items()):
        if name == "__main__" or module is None:
            continue
        try:
            attributes = list(vars(module).items())
        except TypeError:  # something without a __dict__ put in sys.modules
            continue
        for attribute, value in attributes:
            if value is registry:
                return f"{name}:{attribute}"
    if all(
        getattr(registry.get(t), "__module__", None) == sample_registry.__module__
        for t in registry.types()
    ):
        return None
    raise AppError(
        "the step registry is not an attribute of an imported module, so a child process"
        " cannot import it: give the worker its MODULE:ATTRIBUTE (WorkerOptions.app, --app)"
    )


def for_children(options: WorkerOptions, registry: StepRegistry) -> WorkerOptions:
    """The options, with where child processes import the steps from (``app``: reruns run in
    a child of their own, and so does every step under process isolation). A registry no
    child can import refuses process isolation (ValueError); its reruns run in the worker's
    own threads, with a warning."""
    try:
        return replace(options, app=child_spec(registry, options.app))
    except AppError as exc:
        if options.isolation == "process":
            raise ValueError(f"isolation 'process': {exc}") from None
        logging.getLogger("ductor.worker").warning(
            "reruns run in the worker's own process: %s", exc
        )
        return replace(options, reruns_in_child=False)
