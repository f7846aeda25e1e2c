"""The user's documentation stays true: the configuration page is what docs/gen_config.py
generates from ``Config`` today, and every relative link of README.md, docs/*.md and
perf/README.md points to a file (or folder) that exists, and, inside a page of this repository,
to a heading it has."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "perf" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DEFINITION = re.compile(r"^\[[^\]]+\]:\s+(\S+)", re.M)  # a reference-style link's target


def _gen_config():
    spec = importlib.util.spec_from_file_location("gen_config", ROOT / "docs" / "gen_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_is_generated_from_config():
    gen = _gen_config()
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == gen.render(), "docs/configuration.md is stale: run python docs/gen_config.py"


def test_configuration_page_names_every_config_field():
    from fastrl.config.settings import Config

    page = (ROOT / "docs" / "configuration.md").read_text()
    missing = [f for f in Config.__dataclass_fields__ if f"| `--{f}` |" not in page]
    assert not missing


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces -> '-'."""
    anchors = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    targets = LINK.findall(text) + DEFINITION.findall(text)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_every_relative_link_points_to_an_existing_file_and_heading():
    assert all(p.exists() for p in PAGES[:2])
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](page.md#top) [gone](nowhere.md) [web](https://x.org)\n"
                    "```\n[in code](skipped.md)\n```\n[r]: ref.md#x\n")
    assert links(page) == ["page.md#top", "nowhere.md", "ref.md#x"]
    assert _anchors(page) == {"top"}


def test_the_module_map_names_every_library_module():
    """docs/internals.md's module map lists every module of fastrl/ (by its path, or, for the
    leaf pairs, by name in a row of its folder): a module added without a row fails here."""
    section = (ROOT / "docs" / "internals.md").read_text().split("## Module map", 1)[1]
    section = section.split("\n## ", 1)[0]
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "fastrl").rglob("*.py")
                     if p.name != "__init__.py")
    missing = [m for m in modules if f"`{m}`" not in section]
    assert not missing, f"modules without a row in docs/internals.md's module map: {missing}"
