"""The documentation's links lead somewhere, and the README's code map is the layers.

Every relative link in README.md, CHANGELOG.md, docs/*.md, bench/README.md and
bench/results/*.md must name a file that exists and, when it names a heading of
a Markdown page
(``page.md#heading``), a heading that page has: folding a notes page into the
reference, or renaming a heading, must not leave a link behind.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "bench" / "README.md",
    *sorted((ROOT / "bench" / "results").glob("*.md")),
]

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
INDENTED = re.compile(r"^(?: {4}|\t).*$", re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The page without its code: links inside code blocks or spans are no links."""
    return INLINE_CODE.sub("", INDENTED.sub("", FENCE.sub("", text)))


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a page: lower case, punctuation dropped,
    spaces as '-', a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_pages_exist() -> None:
    assert (ROOT / "docs" / "README.md") in PAGES
    assert all(page.is_file() for page in PAGES)


def test_every_relative_link_points_at_an_existing_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def test_links_are_found() -> None:
    """The checker sees the README's links (a regex that matched nothing would pass)."""
    assert "docs/README.md" in links(ROOT / "README.md")
    assert "../bench/README.md" in links(ROOT / "docs" / "README.md")


def test_the_readme_code_map_lists_the_layers_in_order() -> None:
    readme = ROOT / "README.md"
    blocks = [b.group(0) for b in FENCE.finditer(readme.read_text()) if "cni/spec/" in b.group(0)]
    assert len(blocks) == 1, "the README has one code block listing cni/spec/"
    listed = [line.split()[0] for line in blocks[0].splitlines()[1:-1] if line.strip()]
    paths = [unit.replace(".", "/") for units in LAYERS for unit in units]
    layers = [path + ("/" if (ROOT / path).is_dir() else ".py") for path in paths]
    assert listed == layers


# A map of bpf/maps.h: BPF_TABLE_PINNED("type", ..., name, ...), the hash-of-maps
# BPF_TABLE("hash_of_maps$...:<pin dir>/name", ...), or the ring buffer's pinned section.
PINNED_MAP = re.compile(
    r'BPF_TABLE_PINNED\("[a-z_]+",[^,]+,[^,]+,\s*(\w+),'
    r'|BPF_TABLE\("hash_of_maps\$\w+:" SL_PIN_DIR "/(\w+)"'
    r'|section\("maps/ringbuf:" SL_PIN_DIR "/(\w+)"\)'
)


def test_the_datapath_page_lists_every_pinned_map_and_no_other() -> None:
    source = (ROOT / "bpf" / "maps.h").read_text()
    pinned = {next(name for name in found if name) for found in PINNED_MAP.findall(source)}
    assert {"endpoints", "peers", "events", "ledger"} <= pinned, pinned  # the pattern reads
    page = (ROOT / "docs" / "datapath.md").read_text()
    table = page[page.index("| map | type | holds |") :].split("\n\n", 1)[0]
    listed = {
        name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])
    }
    assert listed == pinned, (
        f"docs/datapath.md lists {sorted(listed - pinned)} that bpf/maps.h does not pin, "
        f"misses {sorted(pinned - listed)}"
    )
