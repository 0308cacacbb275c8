"""Checks the internal links of the book (docs/src), README.md and
CHANGELOG.md, with no network and nothing to install.

    python3 scripts/check_links.py

- Every relative link and image must name a file that exists; a link with
  an `#anchor` into a Markdown file must name one of its headings, made
  into an id as mdBook does (GitHub does the same for these headings).
- A chapter may link only inside docs/src: mdBook renders nothing else, so
  a link out of it would be dead on the built site.
- Every code comment that cites the design ("docs/src/design.md §1 rule
  5") names a section of docs/src/design.md, and a rule that section has.
- Every chapter under docs/src is listed in SUMMARY.md (mdBook renders
  only those), and every `{{#include file[:anchor]}}` names a file that
  exists, with that anchor.

External links (http:, https:, mailto:) are not fetched. Prints each broken
link as `file:line: message` and exits 1 if there is one.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOK = os.path.join(ROOT, "docs", "src")

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text, blank_code=True):
    """(line number, line) outside fenced code, inline code blanked out
    (unless blank_code is false)."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        m = re.match(r"(`{3,}|~{3,})", stripped)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
                continue
            if stripped.startswith(fence):
                fence = None
                continue
        if fence is None:
            yield n, re.sub(r"(`+)(?:(?!\1).)+?\1", "``", line) if blank_code else line


def heading_id(title):
    """mdBook's id for a heading: the text, lowercased, spaces to '-',
    keeping letters, digits, '_' and '-'."""
    title = re.sub(r"<[^>]+>", "", title)
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    out = []
    for ch in title:
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)


_anchors = {}


def anchors(path):
    """The ids of a Markdown file's headings; a repeated one gets -1, -2…"""
    if path not in _anchors:
        ids, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            for _, line in prose_lines(f.read(), blank_code=False):
                m = HEADING.match(line)
                if m:
                    base = heading_id(m.group(2))
                    n = seen.get(base, 0)
                    seen[base] = n + 1
                    ids.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = ids
    return _anchors[path]


def check_file(path, problems):
    rel = os.path.relpath(path, ROOT)
    in_book = os.path.commonpath([path, BOOK]) == BOOK
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for n, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{rel}:{n}"
            if not os.path.exists(dest):
                problems.append(f"{where}: {target}: no such file")
                continue
            if in_book and os.path.commonpath([dest, BOOK]) != BOOK:
                problems.append(f"{where}: {target}: leaves docs/src, which mdBook does not render")
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{where}: {target}: {os.path.relpath(dest, ROOT)} has no heading #{anchor}")
    for n, line in enumerate(text.split("\n"), 1):
        for spec in INCLUDE.findall(line):
            file_part, _, anchor = spec.partition(":")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.isfile(dest):
                problems.append(f"{rel}:{n}: include {spec}: no such file")
            elif anchor and not re.fullmatch(r"[\d:]*", anchor):
                with open(dest, encoding="utf-8") as f:
                    if f"ANCHOR: {anchor}" not in f.read():
                        problems.append(f"{rel}:{n}: include {spec}: no ANCHOR: {anchor} in it")


CITATION = re.compile(r"docs/src/design\.md\s+§(\d+)(?:,?\s+rule\s+(\d+))?")
SOURCES = ("crates", "src", "tests", "clients", "scripts", "proto")


def check_design_citations(problems):
    """Section numbers are headings `## §N …`; rules are the numbered list
    of a section's `### Rules that always hold`."""
    with open(os.path.join(BOOK, "design.md"), encoding="utf-8") as f:
        design = f.read()
    rules, section, in_rules = {}, None, False
    for _, line in prose_lines(design, blank_code=False):
        m = re.match(r"## §(\d+) ", line)
        if m:
            section, in_rules = m.group(1), False
            rules.setdefault(section, set())
        elif line.startswith("### "):
            in_rules = "rules" in line.lower()
        elif in_rules and section:
            m = re.match(r"(\d+)\. ", line)
            if m:
                rules[section].add(m.group(1))
    for top in SOURCES:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith((".rs", ".py", ".sh", ".proto", ".toml")):
                    continue
                path = os.path.join(d, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for n, line in enumerate(text.split("\n"), 1):
                    for sec, rule in CITATION.findall(line):
                        where = f"{os.path.relpath(path, ROOT)}:{n}"
                        if sec not in rules:
                            problems.append(f"{where}: cites docs/src/design.md §{sec}, which has no such section")
                        elif rule and rule not in rules[sec]:
                            problems.append(f"{where}: cites docs/src/design.md §{sec} rule {rule}, which §{sec} does not have")


def main():
    problems = []
    check_design_citations(problems)
    chapters = []
    for d, _, files in os.walk(BOOK):
        chapters += [os.path.join(d, f) for f in files if f.endswith(".md")]
    with open(os.path.join(BOOK, "SUMMARY.md"), encoding="utf-8") as f:
        summary = f.read()
    listed = {os.path.normpath(os.path.join(BOOK, t)) for t in LINK.findall(summary)}
    for chapter in sorted(chapters):
        if os.path.basename(chapter) != "SUMMARY.md" and chapter not in listed:
            problems.append(f"{os.path.relpath(chapter, ROOT)}: not in docs/src/SUMMARY.md, so mdBook leaves it out")
    for path in sorted(chapters) + [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")]:
        if os.path.exists(path):
            check_file(path, problems)
    for p in problems:
        print(p)
    print(f"links: {len(problems)} broken, in {len(chapters) + 2} files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
