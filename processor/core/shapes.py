"""The small shapes passed between modules, each named once here (aiokafka's ``structs.py`` is
the model) instead of bare tuples whose meaning a reader guesses from the position.

They are type aliases of plain tuples, not NamedTuples: the hot paths (compiled by mypyc) build
and hash them per record and per run, where a plain tuple is what costs least, and a row read
from Postgres or a pair taken from a Kafka message is one already. The comment beside each says
what its places hold.
"""

from __future__ import annotations

# (topic, partition): a partition of a consumed topic (confluent_kafka's own class, which
# carries an offset too, is imported as ``KafkaTopicPartition`` where both are used).
TopicPartition = tuple[str, int]

# (run id, transition seq): an outbox row (eec_outbox's key), e.g. one whose records the broker
# acknowledged and that the next commit deletes.
OutboxKey = tuple[str, int]

# (run id, tier): a run to wake, on its tier's wakeup topic.
RunRef = tuple[str, str]

# (workflow name, version): a registered workflow definition.
WorkflowKey = tuple[str, int]

# (node, attempt): one attempt of a step of a run.
AttemptRef = tuple[str, int]

# (run id, transition seq): a run as it was read at that seq, e.g. a stuck run the sweep
# selected, force-failed only if it has not moved since.
RunAtSeq = tuple[str, int]
