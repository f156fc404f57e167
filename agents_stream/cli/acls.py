"""``agents-stream acls``: the Kafka ACLs an app's workers need, generated from the app.

An operator of a cluster with an authorizer grants each principal exactly what it uses;
guessing from the docs misses a topic (the output topic is also *read*, to find outputs
already sent after a crash) or grants too much. The list comes from the same App the
worker runs, so it cannot drift from the topics the worker touches.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..app import App
from ..errors import AgentsStreamError, ConfigurationError
from .common import add_app_arg, load_app

# Throwaway consumer groups of the readers that assign partitions and never commit: the
# cache rebuild and output lookup (``agents-stream-reader-<random>``), the CLI tools
# (``agents-stream-dlq-cli-``, ``agents-stream-state-cli-``...) and the Spark jobs
# (``agents-stream-spark-``). librdkafka still looks up their coordinator, which an
# authorizer refuses without Describe on the group.
READER_GROUP_PREFIX = "agents-stream-"


@dataclass(frozen=True)
class Acl:
    resource: str  # "topic", "group", "transactional-id" or "cluster"
    name: str
    operations: tuple[str, ...]
    why: str
    pattern: str = "literal"  # or "prefixed": every name starting with ``name``


def app_acls(app: App, *, create_topics: bool = True) -> list[Acl]:
    """Every ACL a worker of ``app`` needs (and the CLI tools run with its config)."""
    out: list[Acl] = []
    create = ("Create",) if create_topics else ()
    inputs = list(app.input_topics)
    for topic in inputs:
        out.append(Acl("topic", topic, ("Read", "Describe", *create),
                       "input: consumed by the group"))  # fmt: skip
        out.append(Acl("topic", topic, ("Write",),
                       "input: `dlq replay` produces dead letters back to it (leave it out "
                       "for a principal that never replays)"))  # fmt: skip
        out.append(Acl("topic", f"{topic}-dlq", ("Write", "Read", "Describe", *create),
                       "dead letters: written by the worker, read by `dlq show|replay`"))  # fmt: skip
    outputs = [b.output for b in app.agents if b.output]
    for topic in outputs:
        out.append(Acl("topic", topic, ("Write", "Read", "Describe", *create),
                       "output: written; read after a crash to find outputs already sent"))  # fmt: skip
    for aio in app.async_ios:
        out.append(Acl("topic", aio.output, ("Write", "Describe", *create),
                       "Async I/O output: written"))  # fmt: skip
    if app.agents:
        out.append(Acl("topic", app.action_state_topic,
                       ("Write", "Read", "Describe", "DescribeConfigs", *create),
                       "ActionState journal: written, read to rebuild the cache, its "
                       "cleanup.policy checked at startup"))  # fmt: skip
        # Write on a topic also covers the idempotent producer (KIP-679); clusters older
        # than Kafka 2.8 need IdempotentWrite on the cluster as well.
    out.append(Acl("group", app.id, ("Read", "Describe"),
                   "the consumer group of the workers (offsets, rebalances)"))  # fmt: skip
    out.append(Acl("group", READER_GROUP_PREFIX, ("Describe",),
                   "throwaway groups of the cache rebuild, output lookup, CLI and Spark "
                   "readers (assigned, never committed)", pattern="prefixed"))  # fmt: skip
    if getattr(app, "processing_guarantee", "at_least_once") == "exactly_once":
        out.append(Acl("transactional-id", f"{app.id}-", ("Write", "Describe"),
                       "exactly-once: the transactional producers' ids "
                       f"({app.id}-...)", pattern="prefixed"))  # fmt: skip
    return out


def faust_acls(durable: Any, *, create_topics: bool = True) -> list[Acl]:
    """Every ACL a Faust app running ``durable`` (a ``durable_agent(...)``) needs: the
    durable agent's topics (as a worker's) and Faust's own group and internal topics."""
    faust_app = durable.faust_app
    faust_id = str(faust_app.conf.id)
    like_app = SimpleNamespace(
        id=faust_id,  # Faust's consumer group
        input_topics=[durable.input],
        agents=[SimpleNamespace(output=durable.output)],
        async_ios=[],
        action_state_topic=durable.action_state_topic,
    )
    out = app_acls(like_app, create_topics=create_topics)  # type: ignore[arg-type]
    create = ("Create",) if create_topics else ()
    internal = [f"{faust_id}-__assignor-__leader"]
    internal += [t.changelog_topic.get_topic_name() for t in faust_app.tables.values()]
    for topic in internal:
        out.append(Acl("topic", topic, ("Write", "Read", "Describe", *create),
                       "Faust's own topic (leader election, table changelogs)"))  # fmt: skip
    return out


def _load(spec: str) -> Any:
    """The App of ``spec``, or a Faust durable agent (``durable_agent(...)``'s result)."""
    try:
        return load_app(spec)
    except ConfigurationError:
        module, _, attr = spec.partition(":")
        found = getattr(sys.modules.get(module), attr or "app", None)
        if type(found).__module__ == "agents_stream.faust.host":
            return found
        raise


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "acls",
        help="print the Kafka ACLs an app's workers need (kafka-acls commands or a table)",
        description=(
            "Print every ACL a principal running the workers of -A needs on a cluster with "
            "an authorizer: read on its inputs and group, write (and read) on its "
            "output, dead-letter and ActionState topics, create on the topics the worker "
            "creates (--no-create when they are created beforehand). -A may also name a "
            "Faust app's durable_agent(...) result. Nothing is sent to the cluster."
        ),
        epilog=(
            "example:\n"
            "  agents-stream acls -A examples.payments:app --principal User:payments "
            "--bootstrap kafka:9093\n"
            "then run the printed kafka-acls commands with an admin's --command-config."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_app_arg(p)
    p.add_argument(
        "--principal", default="User:<principal>", help="the workers' principal (User:NAME)"
    )
    p.add_argument(
        "--bootstrap",
        default="<bootstrap>",
        help="--bootstrap-server value put in the printed commands",
    )
    p.add_argument(
        "--no-create",
        action="store_true",
        help="topics are created beforehand: no Create ACL (the worker then only checks them)",
    )
    p.add_argument(
        "--format",
        choices=["commands", "table"],
        default="commands",
        help="kafka-acls commands (default) or a table",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        app = _load(args.app)
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not args.principal.startswith(("User:", "Group:")) or args.principal.endswith(":"):
        print(f"error: --principal {args.principal!r}: expected User:NAME", file=sys.stderr)
        return 1
    create = not args.no_create
    acls = (
        app_acls(app, create_topics=create)
        if isinstance(app, App)
        else faust_acls(app, create_topics=create)
    )
    if args.format == "table":

        def where_of(a: Acl) -> str:
            return f"{a.resource} {a.name}{'*' if a.pattern == 'prefixed' else ''}"

        width = max(len(where_of(a)) for a in acls)
        for a in acls:
            where = where_of(a)
            print(f"{where:<{width}}  {','.join(a.operations):<44}  {a.why}")
        return 0
    app_id = app.id if isinstance(app, App) else app.faust_app.conf.id
    print(f"# ACLs of app {app_id!r} for {args.principal} (agents-stream acls)")
    for a in acls:
        ops = " ".join(f"--operation {op}" for op in a.operations)
        pattern = "" if a.pattern == "literal" else f" --resource-pattern-type {a.pattern}"
        print(f"# {a.why}")
        print(
            f"kafka-acls --bootstrap-server {args.bootstrap} --add --allow-principal "
            f"{args.principal} {ops}{pattern} --{a.resource} {a.name}"
        )
    return 0
