"""Refresh the tables that README.md and docs/*.md quote from committed results.

A quoted table sits between ``<!-- table: results/<study>/tables/<name>.md -->`` and
``<!-- end table -->`` (the path relative to docs/); this script replaces what is between them
with that file's text. Rebuild a study's tables from its committed rows first::

    flaxformer-lite report docs/results/cpu --noplots $(cat docs/results/cpu/report.args)
    python scripts/quote_tables.py

tests/report/test_report_committed_results.py checks both steps.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUOTE = re.compile(r"(<!-- table: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def refresh(page: Path) -> int:
    """Rewrite ``page``'s quoted tables; returns how many changed."""
    text = page.read_text(encoding="utf-8")
    changed = 0

    def quoted(match: re.Match) -> str:
        nonlocal changed
        source = ROOT / "docs" / match["path"]
        if not source.is_file():
            raise SystemExit(f"{page}: quotes {match['path']}, which does not exist")
        body = source.read_text(encoding="utf-8")
        changed += body != match["body"]
        return match.group(1) + body + match.group(4)

    new = QUOTE.sub(quoted, text)
    if new != text:
        page.write_text(new, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="default: README.md and docs/*.md")
    args = parser.parse_args(argv)
    pages = args.pages or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        n = refresh(page)
        if n:
            print(f"{page.relative_to(ROOT)}: {n} table(s) refreshed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
