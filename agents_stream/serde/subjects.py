"""Registry subject names of topic values: Confluent's three strategies.

* ``topic`` (TopicNameStrategy, the default): ``<topic>-value``; one schema lineage per
  topic, checked for compatibility as a whole.
* ``record`` (RecordNameStrategy): the record's full name; one lineage per record type
  whichever topic carries it (several record types on one topic).
* ``topic_record`` (TopicRecordNameStrategy): ``<topic>-<full name>``.

The ActionState journal always uses ``<topic>-value``: it is one record type on one
topic, and ``agents-stream schemas register --topic`` registers it there.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from ..errors import ConfigurationError

SubjectStrategy = Literal["topic", "record", "topic_record"]
STRATEGIES: tuple[str, ...] = get_args(SubjectStrategy)


def record_full_name(schema: Any) -> str:
    """``namespace.Name`` of a record schema (JSON data)."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigurationError(
            "a record-name subject strategy needs a record schema at the top level"
        )
    name = str(schema.get("name", ""))
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def value_subject(topic: str, schema: Any, strategy: str = "topic") -> str:
    """The subject the values of ``topic`` written with ``schema`` register under.

    Raises:
        ConfigurationError: an unknown strategy, or a record strategy with a schema that
            is not a record.
    """
    if strategy == "topic":
        return f"{topic}-value"
    if strategy == "record":
        return record_full_name(schema)
    if strategy == "topic_record":
        return f"{topic}-{record_full_name(schema)}"
    raise ConfigurationError(
        f"subject_name_strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}"
    )
