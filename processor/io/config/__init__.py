"""Configuration: the one typed settings object read from the ``DUCTOR_*`` variables
(``settings``), the ``OTEL_*`` variables, the librdkafka properties a variable may set, and
``ductor config check``."""
