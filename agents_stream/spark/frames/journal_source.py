"""``agents_stream.journal``: the ActionState topic read, compacted and decoded in one pass.

A PySpark batch data source over the same offset ranges as ``agents_stream.kafka``, whose
partition reader keeps the last record of each key of its Kafka partition (compaction,
tombstones applied), decodes the live values with the journal codec and yields journal
rows (:data:`~agents_stream.spark.frames.journal_rows.JOURNAL_DDL`) as Arrow batches. The
shuffle that compaction costs in Spark, and the second trip through a Python worker that
decoding in ``mapInArrow`` costs, are both gone: the reader is the only Python step.

Compacting in the reader needs each Kafka partition read by one reader, so the options
that split ranges (``maxRecordsPerPartition``, ``minPartitions``) are refused here;
:func:`~agents_stream.spark.frames.action_state.read_journal` takes the shuffle path for
them. Options: those of ``agents_stream.kafka`` plus ``journal.registryUrl`` (Confluent
framed values), ``journal.topic`` (its subject's topic), ``journal.includeRaw`` and
``journal.view``: ``rows`` (the default: journal rows), ``audit`` (the audit's partial
results per partition, :mod:`.journal_audit`, instead of the rows; with
``journal.viewRowLimit``, a partition with more rows than that yields an ``overflow`` row
instead) or ``checks`` (journal rows with only the columns of the audit's input and output
checks, :data:`~.journal_rows.CHECK_COLUMNS`, read without decoding most records whole).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..source.datasource import KafkaRangePartition, planned_range
from ..source.errors import KafkaSourceOptionError
from ..source.offsets import plan_offset_ranges
from ..source.options import KafkaSourceOptions
from .journal_audit import AUDIT_DDL
from .journal_rows import CHECK_DDL, JOURNAL_DDL

if TYPE_CHECKING:
    import pyarrow as pa

JOURNAL_SOURCE_NAME = "agents_stream.journal"
_OWN = (
    "journal.registryurl",
    "journal.topic",
    "journal.includeraw",
    "journal.view",
    "journal.viewrowlimit",
)
_VIEWS = ("rows", "audit", "checks")
_DDL = {"rows": JOURNAL_DDL, "audit": AUDIT_DDL, "checks": CHECK_DDL}
_SPLITTING = ("maxrecordsperpartition", "minpartitions")


def _split(options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(Kafka source options, this source's own), keys lower-cased."""
    kafka: dict[str, str] = {}
    own: dict[str, str] = {}
    for key, value in options.items():
        name = str(key).lower()
        if name in _SPLITTING:
            raise KafkaSourceOptionError(
                "splits a Kafka partition over several readers, which cannot compact it "
                "alone; read_journal() compacts with a shuffle when it is given",
                option=str(key),
            )
        (own if name in _OWN else kafka)[name] = str(value)
    return kafka, own


class JournalDataSource(DataSource):
    """Batch-only Python data source registered as ``agents_stream.journal``."""

    @classmethod
    def name(cls) -> str:
        return JOURNAL_SOURCE_NAME

    def schema(self) -> str:
        return _DDL[_view(self.options)]

    def reader(self, schema: Any) -> DataSourceReader:
        kafka, own = _split(self.options)
        return JournalRangeReader(
            KafkaSourceOptions.from_options(kafka),
            registry_url=own.get("journal.registryurl") or None,
            topic=own.get("journal.topic") or None,
            include_raw=own.get("journal.includeraw", "false").lower() == "true",
            view=_view(self.options),
            view_row_limit=_row_limit(own.get("journal.viewrowlimit")),
        )


def _view(options: Mapping[str, str]) -> str:
    view = next((str(v) for k, v in options.items() if str(k).lower() == "journal.view"), "rows")
    if view.lower() not in _VIEWS:
        raise KafkaSourceOptionError(f"must be one of {', '.join(_VIEWS)}", option="journal.view")
    return view.lower()


def _row_limit(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.strip().isdigit():
        raise KafkaSourceOptionError(
            "must be a whole number of rows", option="journal.viewRowLimit"
        )
    return int(value)


class JournalRangeReader(DataSourceReader):
    """Plans one range per Kafka partition; each executor compacts and decodes one."""

    def __init__(
        self,
        options: KafkaSourceOptions,
        *,
        registry_url: str | None,
        topic: str | None,
        include_raw: bool,
        view: str = "rows",
        view_row_limit: int | None = None,
    ) -> None:
        self.options = options
        self.registry_url = registry_url
        self.topic = topic
        self.include_raw = include_raw
        self.view = view
        self.view_row_limit = view_row_limit

    def partitions(self) -> Sequence[InputPartition]:
        return [KafkaRangePartition(r) for r in plan_offset_ranges(self.options)]

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        # Executor-side imports: the codec and the consumer are only needed where
        # records are read.
        from ..source.record_reader import read_messages
        from .journal_rows import check_batches, journal_batches_of, live_records, reader_codec

        rng = planned_range(partition)
        if rng is None:
            return
        live = live_records(
            read_messages(
                self.options.consumer_conf("reader"),
                rng,
                batch_size=self.options.batch_size,
                poll_timeout_s=self.options.poll_timeout_ms / 1000,
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
        )
        codec = reader_codec(self.registry_url, self.topic)
        if self.view == "audit":
            from .journal_audit import audit_batch

            yield audit_batch(codec, live, rng.partition, row_limit=self.view_row_limit)
            return
        if self.view == "checks":
            yield from check_batches(codec, live, rng.partition)
            return
        yield from journal_batches_of(codec, live, rng.partition, include_raw=self.include_raw)
