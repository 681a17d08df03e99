"""Configuration: the one typed settings object read from the ``DUCTOR_*`` variables
(``settings``; every variable and the secrets read from files in ``variables``, each kind of
value's parser and ``ConfigError`` in ``values``), the ``OTEL_*`` variables, the librdkafka
properties a variable may set, and ``ductor config check``.
"""
