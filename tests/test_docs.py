"""The documentation site builds in strict mode: a broken link, anchor or page fails it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from config.settings import ENVIRONMENT_MAP

ROOT = Path(__file__).resolve().parent.parent
HOOK = "docs/hooks/openapi_reference.py"


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """Run ``mkdocs build --strict`` on ``config`` into ``site``, as a contributor would."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        # Material's notice of its successor, printed at every build, is not a warning.
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def warnings_of(log: str) -> list[str]:
    """The build's warnings, each with the indented lines that go on with it."""
    warnings: list[str] = []
    for line in log.splitlines():
        if line.startswith("WARNING"):
            warnings.append(line)
        elif line.startswith(" ") and warnings and not line.strip().startswith(("INFO", "DEBUG")):
            warnings[-1] += "\n" + line
    return warnings


def nav_pages(nav: list) -> list[str]:
    """Every page the nav names, however deep."""
    pages = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_site_builds_strict_with_every_page_and_the_api_reference(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")

    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    for page in nav_pages(config["nav"]):
        assert (tmp_path / "site" / page.removesuffix(".md").removesuffix("index")).is_dir()
    reference = (tmp_path / "site" / "api" / "reference" / "index.html").read_text()
    document = json.loads((ROOT / "app" / "openapi.json").read_text())
    for path in document["paths"]:
        assert f" {path}</code>" in reference, f"{path} is missing from the API reference"


def test_a_broken_link_anchor_or_page_fails_the_build(tmp_path):
    docs = shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("hooks"))
    broken = (
        "See [a page that is not there](missing.md) and "
        "[an anchor that is not there](alerts.md#no-such-heading).\n"
    )
    (docs / "index.md").write_text((docs / "index.md").read_text() + broken)
    (docs / "left-out.md").write_text("# Left out of the nav\n")
    config = (ROOT / "mkdocs.yml").read_text()
    config = config.replace("docs_dir: docs", f"docs_dir: {docs}").replace(HOOK, str(ROOT / HOOK))
    (tmp_path / "mkdocs.yml").write_text(config)

    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")

    assert done.returncode != 0
    warnings = warnings_of(done.stderr)
    for named in ("missing.md", "no-such-heading", "left-out.md"):
        assert any(named in warning for warning in warnings), done.stderr


def test_the_environment_page_lists_every_variable_in_one_table():
    page = (ROOT / "docs" / "operating" / "environment.md").read_text()
    table = page.split("| variable | default | meaning |\n", 1)[1].split("\n\n", 1)[0]
    listed = {row.split("`")[1] for row in table.splitlines() if row.startswith("| `")}
    gunicorn = {"HOST", "PORT", "WEB_CONCURRENCY", "WORKER_CONNECTIONS", "PROMETHEUS_MULTIPROC_DIR"}
    read = {variable for variable, _, _ in ENVIRONMENT_MAP} | gunicorn | {"APP_ENV", "FLASK_APP"}
    assert read <= listed, f"not in the table: {sorted(read - listed)}"
    assert all(line.startswith("|") for line in table.splitlines())
