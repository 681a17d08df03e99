"""What `ductor worker` leaves in its environment for step code (worker/environment.py), and
the worker's own DSN setting (DUCTOR_WORKER_PG_DSN, falling back to DUCTOR_PG_DSN)."""

from __future__ import annotations

from processor.io.config.settings import Settings, load_settings
from processor.io.config.variables import FILE_SUFFIX, SECRET_VARIABLES
from processor.worker.environment import is_secret_variable, scrub_secrets

KEPT = {
    "PATH": "/bin",
    "PGHOST": "db",  # libpq reads its own variables at every connect
    "DUCTOR_BOOTSTRAP_SERVERS": "k:9092",
    "DUCTOR_TOPIC_PREFIX": "p",
    "DUCTOR_PURE_PYTHON": "1",  # read at import, by the isolated children too
    "DUCTOR_TEST_FAULTS": "",
    "DUCTOR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "DUCTOR_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem",
}


def test_every_secret_and_every_file_naming_one_is_removed_and_nothing_else() -> None:
    secret = dict.fromkeys(SECRET_VARIABLES, "x") | {
        v + FILE_SUFFIX: "/f" for v in SECRET_VARIABLES
    }
    secret |= {
        "DUCTOR_KAFKA_SASL_USERNAME": "u",
        "DUCTOR_KAFKA_SASL_JAAS_CONFIG": "... password=p",
        "DUCTOR_KAFKA_SSL_KEY_LOCATION": "/etc/key.pem",
        "DUCTOR_KAFKA_SSL_KEYSTORE_LOCATION": "/etc/ks.p12",
    }
    assert {"DUCTOR_PG_DSN", "DUCTOR_WORKER_PG_DSN_FILE", "DUCTOR_UI_TOKEN"} <= set(secret)
    env = KEPT | secret
    removed = scrub_secrets(env)
    assert removed == sorted(secret)
    assert env == KEPT
    assert all(is_secret_variable(name) for name in secret)
    assert not any(is_secret_variable(name) for name in KEPT)


def test_the_worker_uses_its_own_dsn_when_given_and_keeps_no_other() -> None:
    both = load_settings(
        {
            "DUCTOR_PG_DSN": "postgresql://coord:c@db/x",
            "DUCTOR_WORKER_PG_DSN": "postgresql://w:p@db/x",
        }
    )
    assert both.worker_dsn == "postgresql://w:p@db/x"
    worker = both.for_worker()
    assert (worker.pg_dsn, worker.worker_pg_dsn) == ("postgresql://w:p@db/x", "")
    alone = load_settings({"DUCTOR_PG_DSN": "postgresql://coord:c@db/x"})
    assert alone.worker_dsn == alone.for_worker().pg_dsn == "postgresql://coord:c@db/x"
    assert load_settings({"DUCTOR_WORKER_PG_DSN": ""}).worker_pg_dsn == ""
    assert "w:p@" not in repr(both)
    assert Settings().worker_dsn == Settings().pg_dsn
