"""The package as PyPI shows it: the built wheel's metadata (license, classifiers, version,
long description) and the long description itself (install command first, an example
that runs, no relative links)."""

from __future__ import annotations

import email
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import celery_debounce

ROOT = Path(__file__).resolve().parents[2]
LONG = ROOT / "docs" / "pypi.md"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def test_the_wheel_declares_the_license_classifiers_and_version(built_wheel: Path) -> None:
    meta = metadata(built_wheel)
    assert meta["Name"] == "celery-debounced"
    assert meta["Version"] == celery_debounce.__version__
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(built_wheel) as archive:
        (license_file,) = [n for n in archive.namelist() if n.endswith("/licenses/LICENSE")]
        assert archive.read(license_file).decode().startswith("MIT License")
    classifiers = set(meta.get_all("Classifier"))
    assert "Framework :: Celery" in classifiers
    for python in PYTHONS:
        assert f"Programming Language :: Python :: {python}" in classifiers
    # no Python classifier beyond the ones the corners test
    listed = {
        c.rsplit(" :: ", 1)[1]
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert listed == set(PYTHONS)
    assert meta["Requires-Python"] == ">=3.10"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == LONG.read_text().strip()
    for url in meta.get_all("Project-URL"):
        assert re.fullmatch(r"[^,]+, https://\S+", url), url


SHIPPED = (
    "celery_debounce/dashboards/celery-debounce.json",
    "celery_debounce/dashboards/alerts.yml",
    "celery_debounce/store/postgres/steps/1.sql",
    "celery_debounce/store/postgres/functions/debounce_gate.sql",
)


def test_the_wheel_and_the_sdist_ship_the_dashboard_and_the_alert_rules(
    built_wheel: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(built_wheel) as archive:
        for name in SHIPPED:
            assert archive.read(name) == (ROOT / name).read_bytes(), name
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = tmp_path.glob("celery_debounced-*.tar.gz")
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        for name in (*SHIPPED, "CHANGELOG.md"):
            member = archive.extractfile(f"{top}/{name}")
            assert member is not None and member.read() == (ROOT / name).read_bytes(), name


def test_the_long_description_starts_with_the_install_command_and_has_no_relative_links() -> None:
    text = LONG.read_text()
    assert text.startswith("```bash\npip install celery-debounced\n```\n")
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(example.strip().splitlines()) <= 12
    # markdown links and images, bare HTML href/src: only absolute http(s) addresses
    targets = re.findall(r"\]\(([^)\s]+)", text) + re.findall(r"(?:href|src)=\"([^\"]+)", text)
    targets += re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.M)
    for target in targets:
        assert re.match(r"https?://", target), f"docs/pypi.md: relative link {target!r}"


def test_the_long_descriptions_example_runs(redis_server: str, tmp_path: Path) -> None:
    """The example, with the test server as the broker: 100 calls, one window."""
    example = re.search(r"```python\n(.*?)```", LONG.read_text(), re.S).group(1)
    assert 'broker="redis://localhost:6379/0"' in example
    script = tmp_path / "example.py"
    script.write_text(
        example.replace("redis://localhost:6379/0", f"{redis_server}/5") + "\nprint('one window')\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "one window"


def test_the_readmes_first_screen_keeps_the_two_commands() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:12])
    assert "./scripts/demo.sh" in first_screen
    assert "./scripts/test.sh" in first_screen
    assert "./scripts/quick-test.sh" in first_screen


def test_the_changelog_has_this_version_and_the_docs_site_its_name() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {celery_debounce.__version__} (" in changelog
    assert "### Upgrading from 0.1" in changelog
    assert re.search(r"^site_name: celery-debounced$", (ROOT / "mkdocs.yml").read_text(), re.M)
