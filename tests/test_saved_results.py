"""The committed benchmark results name one machine: the one the committed notebooks ran on."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "lib" / "servelab" / "data"


def cpus(record: object) -> list[str]:
    """Every ``hardware["cpu"]`` inside a JSON record, however deep."""
    if isinstance(record, dict):
        own = [record["hardware"]["cpu"]] if isinstance(record.get("hardware"), dict) else []
        return own + [cpu for value in record.values() for cpu in cpus(value)]
    if isinstance(record, list):
        return [cpu for value in record for cpu in cpus(value)]
    return []


def test_every_committed_cpu_result_names_the_notebooks_machine():
    machine = json.loads((ROOT / "notebooks" / "machine-profile.json").read_text())["cpu"]
    found = {path.name: cpus(json.loads(path.read_text())) for path in sorted(DATA.glob("*_cpu*.json"))}
    assert found and all(found.values()), f"a result without its hardware: {found}"
    others = {name: names for name, names in found.items() if set(names) != {machine}}
    assert not others, f"results measured elsewhere than {machine!r}: {others}"
    assert machine.split()[0] in (ROOT / "README.md").read_text()


def test_the_check_reads_nested_hardware():
    record = {"runs": {"a": {"hardware": {"cpu": "X"}}, "b": [{"hardware": {"cpu": "Y"}}]}}
    assert sorted(cpus(record)) == ["X", "Y"]
