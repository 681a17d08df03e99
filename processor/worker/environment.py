"""What step code finds in the worker's environment: none of the engine's keys.

``ductor worker`` reads its settings at start (processor/io/config/settings.py: the values are in
the
``Settings`` it was given from then on), then removes every secret variable from its own
environment before it imports the steps module (``--app``): the DSNs (``DUCTOR_PG_DSN``,
``DUCTOR_WORKER_PG_DSN``), the UI token, the Kafka SASL and SSL key properties, and the
``_FILE`` variables naming files that hold any of them. A step running on a thread reads the
process's ``os.environ`` without them; one running in a child process (``--isolation
process``) starts from that environment, so neither its ``os.environ`` nor its
``/proc/self/environ`` holds them. libpq's own ``PG*`` variables are left: libpq reads them at
every connection the worker opens (give the worker its password in its DSN instead).

What this does not do: a step on a thread shares the worker's memory, so code that goes looking
(the ``Settings`` object, ``/proc/self/environ`` of the worker, which keeps the environment it
started with) finds the worker's own DSN. The boundary is the worker's database role, which may
only claim, record and read what steps need
(docs/operations/access.md#the-workers-database-role), and process isolation.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

from processor.io.config.variables import FILE_SUFFIX, SECRET_VARIABLES

# Besides the secrets the settings name (and their _FILE forms), any DUCTOR_* variable whose
# name says it holds credentials: a password, a secret, a token, a DSN, a SASL property, an SSL
# key (its PEM, its password, where it is).
_SECRET_NAME = re.compile(r"DUCTOR_\w*(PASSWORD|SECRET|TOKEN|DSN|SASL|SSL_KEY|CREDENTIAL)\w*")


def is_secret_variable(name: str) -> bool:
    if name in SECRET_VARIABLES or name.removesuffix(FILE_SUFFIX) in SECRET_VARIABLES:
        return True
    return _SECRET_NAME.fullmatch(name) is not None


def scrub_secrets(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove the secret variables from ``environ`` (default: this process's environment,
    which the child processes it starts from then on inherit); their names, sorted."""
    env = os.environ if environ is None else environ
    removed = sorted(name for name in env if is_secret_variable(name))
    for name in removed:
        del env[name]
    return removed


__all__ = ["is_secret_variable", "scrub_secrets"]
