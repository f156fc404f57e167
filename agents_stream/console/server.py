"""The console's web application (aiohttp): routes over the journal index, the cluster
overview and the dead letters.

Read-only unless built with ``allow_replay``: then (and only then) ``POST /dlq/replay``
produces dead letters back to their source partition with their original identity, as
``agents-stream dlq replay`` does; every form carries a token made at start-up, so a
page of another site cannot post one. Nothing else ever writes to a topic.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web

from ..app import App
from ..cli.dlq import DeadLetter, read_dead_letters, replay
from ..cli.dlq import _select as select_letters
from . import pages
from .cluster import MetricsScraper, read_overview
from .history import key_history
from .journal import JournalIndex


@dataclass
class Console:
    """What the pages read, and whether they may replay."""

    app: App
    bootstrap: str
    index: JournalIndex
    allow_replay: bool = False
    refresh: int = 5  # seconds between a live page's reloads (0: none)
    metrics: MetricsScraper = field(default_factory=lambda: MetricsScraper([]))
    token: str = field(default_factory=lambda: secrets.token_urlsafe(16))

    def page(self, title: str, body: str, *, live: bool) -> web.Response:
        html = pages.layout(title, self.app.id, body, refresh=self.refresh if live else 0)
        return web.Response(text=html, content_type="text/html")


CONSOLE: web.AppKey[Console] = web.AppKey("console", Console)


def make_app(console: Console) -> web.Application:
    app = web.Application()
    app[CONSOLE] = console
    app.router.add_get("/", overview)
    app.router.add_get("/key/{key}", key_page)
    app.router.add_get("/search", search)
    app.router.add_get("/pending", pending)
    app.router.add_get("/dlq", dead_letters)
    app.router.add_post("/dlq/replay", replay_letters)
    app.router.add_get("/healthz", healthz)
    app.middlewares.append(_never_crash)
    return app


@web.middleware
async def _never_crash(request: web.Request, handler: Any) -> web.StreamResponse:
    """A page that fails says why, in the page; the console goes on."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException:
        raise
    except Exception as exc:
        console = request.app[CONSOLE]
        body = f'<p class="bad">This page could not be built: {pages.text(exc)}</p>'
        html = pages.layout("Error", console.app.id, body)
        return web.Response(text=html, content_type="text/html", status=500)


async def healthz(request: web.Request) -> web.Response:
    index = request.app[CONSOLE].index
    return web.json_response({"caught_up": index.caught_up, "error": index.error})


async def overview(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    try:
        cluster = await asyncio.to_thread(read_overview, console.app, console.bootstrap)
        cluster_error = ""
    except Exception as exc:
        cluster, cluster_error = None, f"cannot read the cluster: {exc}"
    metrics = await asyncio.to_thread(console.metrics.rates) if console.metrics.urls else []
    agents = [(b.name, b.input, b.output or "") for b in console.app.agents]
    agents += [(b.name, b.input, b.output) for b in console.app.async_ios]
    body = pages.overview_body(
        agents,
        console.app.action_state_topic,
        console.index.stats(),
        console.index.caught_up,
        console.index.error,
        cluster,
        cluster_error,
        metrics,
        console.index.unreadable()[:100],
        console.index.two_phase_waiting(),
    )
    return console.page("Overview", body, live=True)


async def key_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    key = request.match_info["key"]
    history = key_history(key, console.index.entries_of(key))
    body = pages.history_body(history, console.app.id, None)
    return console.page(f"Key {key}", body, live=True)


async def search(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    query = request.query.get("q", "")
    found = console.index.find(query)
    if found is not None:
        raise web.HTTPFound(f"/key/{quote(found, safe='')}")
    body = f"<p>Nothing in the journal is named {pages.text(query)!s} (key, call id or output identity).</p>"
    return console.page("Not found", body, live=False)


async def pending(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    index = console.index
    body = pages.pending_body(index.pending(), int(time.time() * 1000), index.settled())
    return console.page("PENDING calls", body, live=True)


async def _letters(console: Console) -> dict[str, list[DeadLetter] | str]:
    found: dict[str, list[DeadLetter] | str] = {}
    for topic in console.app.input_topics:
        dlq = f"{topic}-dlq"
        try:
            found[dlq] = await asyncio.to_thread(
                read_dead_letters, console.bootstrap, dlq, timeout=10.0
            )
        except Exception as exc:  # no such topic yet: nothing failed
            found[dlq] = f"not readable: {exc}"
    return found


async def dead_letters(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    body = pages.dlq_body(
        await _letters(console), console.allow_replay, console.token, request.query.get("done", "")
    )
    return console.page("Dead letters", body, live=False)


async def replay_letters(request: web.Request) -> web.Response:
    """Replay one dead letter (``position`` ``partition:offset`` in its DLQ) or, with no
    position, every one of the DLQ topic (each source record once)."""
    console = request.app[CONSOLE]
    if not console.allow_replay:
        raise web.HTTPForbidden(text="read-only console: start it with --allow-replay")
    form = await request.post()
    if not secrets.compare_digest(str(form.get("token", "")), console.token):
        raise web.HTTPForbidden(text="stale or foreign form: reload the page")
    dlq = str(form.get("dlq", ""))
    topic = dlq.removesuffix("-dlq")
    if not dlq.endswith("-dlq") or topic not in console.app.input_topics:
        raise web.HTTPBadRequest(text=f"{dlq!r} is not a dead-letter topic of this app")
    letters = await asyncio.to_thread(read_dead_letters, console.bootstrap, dlq)
    position = str(form.get("position", ""))
    chosen = _choose(letters, topic, position)
    count = await asyncio.to_thread(replay, console.bootstrap, topic, chosen) if chosen else 0
    message = f"replayed {count} dead letter(s) of {dlq} to {topic}"
    raise web.HTTPSeeOther(f"/dlq?done={quote(message)}")


def _choose(letters: list[DeadLetter], topic: str, position: str) -> list[DeadLetter]:
    """The letters to replay: the one at DLQ ``position``, or every one whose source is
    ``topic``, each source record once (it may have been dead-lettered twice)."""
    if not position:
        return list(select_letters(letters, topic, None))
    return [
        letter
        for letter in letters
        if f"{letter.dlq_partition}:{letter.dlq_offset}" == position
        and letter.source is not None
        and letter.source[0] == topic
    ]
