"""The repository checkout the package runs from, when it does.

The local Kafka and Postgres of development (infra/local.py: Kafka assembled from Maven
Central jars, Debian's PostgreSQL installed with apt-get, state in the checkout's ``.infra``)
belong to the repository, not to the package: a deployment brings its own services, so the
wheel ships none of it. The tools that start or restart those services (`ductor demo` when
nothing answers, the chaos run) find them through this module, or say in one sentence that
they need a checkout.
"""

from __future__ import annotations

from pathlib import Path

# What a tool that needs the local services says when it runs from an installed package.
NEEDS_CHECKOUT = (
    "the local Kafka and Postgres are started by infra/local.py in a checkout of the"
    " repository (make up), which an installed package does not include"
)


def checkout_root() -> Path | None:
    """The root of the checkout this package is imported from (editable install or run in
    place), or None for an installed package."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "infra" / "local.py").is_file() else None
