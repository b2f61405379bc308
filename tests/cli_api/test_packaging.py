"""The wheel installs everything under relsearch.* (no top-level bench/ or pipelines/)."""
import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_file_list(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("relsearch-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"relsearch"}
    for module in ("cli.py", "encoder/model.py", "indexer/store.py", "retrieval/search.py", "pipelines/index.py",
                   "bench/__init__.py", "data/sp500_2017.jsonl", "ui/index.html", "ui/app.js", "ui/style.css"):
        assert f"relsearch/{module}" in names, module
    assert not any(n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "relsearch = relsearch.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
