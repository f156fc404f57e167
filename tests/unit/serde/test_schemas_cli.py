"""``agents-stream schemas check|register`` on the repo's schemas and on broken copies."""

from __future__ import annotations

import json
import shutil

import pytest

from agents_stream.cli.main import main
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions, schemas_dir


@pytest.fixture
def schema_copy(tmp_path):
    """A writable copy of the repo's schemas/ to break on purpose."""
    root = tmp_path / "schemas"
    shutil.copytree(schemas_dir(), root)
    return root


def add_version(root, mutate):
    folder = root / "ActionState"
    latest = max(int(p.stem[1:]) for p in folder.glob("v*.avsc"))
    schema = json.loads((folder / f"v{latest}.avsc").read_text())
    call = schema["fields"][0]["type"][0]
    mutate(call)
    (folder / f"v{latest + 1}.avsc").write_text(json.dumps(schema))
    return latest + 1


def test_repo_schemas_pass(capsys):
    assert main(["schemas", "check"]) == 0
    newest = load_versions(JOURNAL_RECORD_TYPE)[-1].version
    assert f"ActionState v1..v{newest} (BACKWARD_TRANSITIVE)" in capsys.readouterr().out


def test_new_field_without_default_fails_naming_type_version_field(schema_copy, capsys):
    version = add_version(
        schema_copy, lambda c: c["fields"].append({"name": "cost", "type": "double"})
    )
    assert main(["schemas", "check", "--dir", str(schema_copy)]) == 1
    err = capsys.readouterr().err
    assert f"ActionState v{version} field CallResult.cost" in err
    assert "BACKWARD" in err and "without a default" in err


def test_removed_required_field_breaks_forward_promise(schema_copy, capsys):
    def drop(call):
        call["fields"] = [f for f in call["fields"] if f["name"] != "function_id"]

    # The repo promises BACKWARD_TRANSITIVE since v4; promise FULL on the v1..v3 lineage.
    for path in (schema_copy / "ActionState").glob("v*.avsc"):
        if int(path.stem[1:]) >= 4:
            path.unlink()
    (schema_copy / "compatibility.json").write_text(
        json.dumps({"ActionState": {"compatibility": "FULL_TRANSITIVE"}})
    )
    add_version(schema_copy, drop)
    assert main(["schemas", "check", "--dir", str(schema_copy)]) == 1
    err = capsys.readouterr().err
    assert "ActionState v1 field CallResult.function_id: FORWARD" in err
    # Only BACKWARD promised: removing a field is then allowed.
    (schema_copy / "compatibility.json").write_text(
        json.dumps({"ActionState": {"compatibility": "BACKWARD_TRANSITIVE"}})
    )
    assert main(["schemas", "check", "--dir", str(schema_copy)]) == 0


def test_type_change_caught_by_resolution(schema_copy, capsys):
    def retype(call):
        for f in call["fields"]:
            if f["name"] == "function_id":
                f["type"] = "int"

    add_version(schema_copy, retype)
    assert main(["schemas", "check", "--dir", str(schema_copy)]) == 1
    assert "schema resolution failed" in capsys.readouterr().err


def test_register_in_order_and_idempotent(capsys):
    args = ["schemas", "register", "--registry", "mock://schemas-cli", "--topic", "app-as"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.index("ActionState v1 as id") < out.index("v2 as id") < out.index("v3 as id")
    assert main(args) == 0
    assert "already registered" in capsys.readouterr().out


def test_register_rejects_version_incompatible_with_registry(schema_copy, capsys):
    url = "mock://schemas-cli-reject"
    assert main(["schemas", "register", "--registry", url, "--topic", "t"]) == 0
    # Someone "re-released" v3 in place with a required field: the registry still
    # holds the original v3, which the edited file cannot read.
    path = schema_copy / "ActionState" / "v3.avsc"
    schema = json.loads(path.read_text())
    schema["fields"][0]["type"][0]["fields"].append({"name": "cost", "type": "double"})
    path.write_text(json.dumps(schema))
    args = ["schemas", "register", "--registry", url, "--topic", "t", "--dir", str(schema_copy)]
    assert main(args) == 1
    assert "CallResult.cost" in capsys.readouterr().err
