"""The console driven in a real headless browser (Debian's chromium and chromium-driver,
through selenium from the dev extra; browser builds cannot be downloaded here). Runs
wherever the three are installed and skips under one line naming the install otherwise;
CI (``.ci/run``) installs them and sets ``AGENTS_STREAM_TEST_REQUIRE_BROWSER=1``, under
which a missing one fails the test instead. A dead letter replayed by clicking its
button lands under its original identity; the key's page, reached through the search
box, shows the journaled call replayed by the restarted worker.
``AGENTS_STREAM_SCREENSHOT=path.png`` saves that page (the README's screenshot)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path

import pytest

from agents_stream.testing.topics import create_topics, produce, wait_for_records
from tests.apps.effects import connect
from tests.cli.test_ui import APP, Console

INSTALL = "apt-get install chromium chromium-driver; pip install -e '.[dev]' (selenium)"


def _missing() -> str:
    """What of the browser stack is not installed ("" when all of it is)."""
    absent = [
        name
        for name, found in (
            ("chromium", shutil.which("chromium")),
            ("chromedriver", shutil.which("chromedriver")),
            ("selenium", importlib.util.find_spec("selenium")),
        )
        if found is None
    ]
    return ", ".join(absent)


MISSING = _missing()
# CI must run this test: there a missing browser is a failure, not a skip.
REQUIRED = os.environ.get("AGENTS_STREAM_TEST_REQUIRE_BROWSER", "") not in ("", "0")

pytestmark = [
    pytest.mark.broker,
    pytest.mark.browser,
    pytest.mark.skipif(bool(MISSING) and not REQUIRED, reason=f"no {MISSING}: {INSTALL}"),
]


@pytest.fixture
def browser():
    if MISSING:  # only when required: else the module is skipped (above)
        pytest.fail(f"AGENTS_STREAM_TEST_REQUIRE_BROWSER is set but {MISSING} missing: {INSTALL}")
    from selenium import webdriver

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1500,1000"):  # fmt: skip
        options.add_argument(flag)
    # The driver Debian ships: selenium must not look for (download) one of its own.
    session = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver))
    session.set_page_load_timeout(60)
    yield session
    session.quit()


def _until(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.3)


def test_replay_from_the_page_and_the_replayed_call_on_the_keys_page(
    broker, topic_factory, worker_factory, tmp_path, browser
):
    from selenium.webdriver.common.by import By

    connect(str(tmp_path / "effects.sqlite")).close()
    shot = os.environ.get("AGENTS_STREAM_SCREENSHOT")
    # Readable names on the screenshot (its broker is this run's alone); unique ones else.
    names = ("shop", "orders", "receipts") if shot else map(topic_factory, ("app", "in", "out"))
    env = dict(zip(("AS_APP_ID", "AS_INPUT", "AS_OUTPUT"), names, strict=True))
    env["AS_EFFECTS_DB"] = str(tmp_path / "effects.sqlite")
    source, out = env["AS_INPUT"], env["AS_OUTPUT"]
    create_topics(broker.bootstrap, [source], partitions=2)
    worker = worker_factory(APP, env)
    produce(broker.bootstrap, source,
            [(f"c{i % 3}", {"order": f"o{i}", "bad": i == 3}) for i in range(6)])  # fmt: skip
    wait_for_records(broker.bootstrap, f"{source}-dlq", 1, timeout=60)
    wait_for_records(broker.bootstrap, out, 5, timeout=60)
    time.sleep(1.0)
    assert worker.terminate() == 0, worker.log()
    fixed = worker_factory(APP, {**env, "AS_FIXED": "1"})
    ui = Console(broker, env, tmp_path / "ui.log", "--allow-replay")
    try:
        base = str(ui.http.base_url).rstrip("/")
        browser.get(base + "/")
        _until(lambda: "read to its end" in browser.page_source or browser.refresh())
        browser.find_element(By.LINK_TEXT, "dead letters").click()
        # A click returns before the page it asked for has loaded (seen in CI: the old
        # page's source read right after the replay button's click): wait for the new one.
        _until(lambda: "shipping address of o3 missing" in browser.page_source)
        browser.find_element(By.XPATH, "//button[text()='replay']").click()
        _until(lambda: "replayed 1 dead letter(s)" in browser.page_source)  # no refresh: a POST
        wait_for_records(broker.bootstrap, out, 6, timeout=60)

        search = browser.find_element(By.NAME, "q")
        search.send_keys("c0")
        search.submit()
        _until(lambda: "tests.apps.dlq_app.ship" in browser.page_source or browser.refresh())
        row = browser.find_element(By.XPATH, "//tr[td[contains(., 'dlq_app.reserve')]]")
        assert "replayed by w" in row.text and row.get_attribute("class") == "replayed"
        browser.save_screenshot(shot or str(tmp_path / "key.png"))
        assert Path(shot or tmp_path / "key.png").stat().st_size > 10_000
    finally:
        ui.close()
    assert fixed.terminate() == 0, fixed.log()
