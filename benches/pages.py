#!/usr/bin/env python3
"""Compare HTML-to-Markdown outputs on the real-page fixtures (standard library only).

For every fixture page NAME.html in DIR (in pages.json order when that file exists),
reads the output NAME.SUFFIX beside it and prints one Markdown-table row:

  chars     characters in the output
  pre       outermost <pre> elements in the HTML (code blocks)
  fenced    closed ``` / ~~~ fenced blocks in the output
  lang      fenced blocks with a language tag
  tables    outermost <table> elements in the HTML
  pipe      Markdown pipe tables in the output (header row + `| --- |` separator line)
  links     inline links [text](target) plus reference definitions [n]: target
            (images, and text inside fenced blocks or `code spans`, are not counted)
  abs/rel/other   links to http(s) URLs / without a scheme (path, #fragment) / other schemes

Run:
  python3 benches/pages.py tests/fixtures/pages trafilatura.md
  python3 benches/pages.py tests/fixtures/pages subagentd.md --json   # JSON lines
"""
import argparse
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

# A fence may sit in a blockquote (`> `) or a list item (indented), as CommonMark allows.
FENCE = re.compile(r"^(?: {0,3}> ?)*\s*(`{3,}|~{3,})(.*)$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(
    r"(?<!!)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]"  # [text], one level of nested brackets
    r"\(\s*<?((?:[^()\s<>]|\([^()\s]*\))*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*<?(\S+?)>?(?:\s.*)?$")
PIPE_SEP = re.compile(r"^(?: {0,3}> ?)*\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class HtmlCounter(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.pre = self.pre_all = self.pre_depth = 0
        self.tables = self.tables_all = self.depth = 0

    def handle_starttag(self, tag, attrs):
        if tag == "pre":  # mdBook nests <pre><pre class="playground">: count the outer one
            self.pre_all += 1
            self.pre += self.pre_depth == 0
            self.pre_depth += 1
        elif tag == "table":
            self.tables_all += 1
            self.tables += self.depth == 0
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "table" and self.depth:
            self.depth -= 1
        elif tag == "pre" and self.pre_depth:
            self.pre_depth -= 1


def count_html(html):
    c = HtmlCounter()
    c.feed(html)
    c.close()
    return {"pre": c.pre, "pre_all": c.pre_all, "tables": c.tables, "tables_all": c.tables_all}


def count_markdown(md):
    r = dict(chars=len(md), fenced=0, lang=0, unclosed=0, pipe=0, links=0, abs=0, rel=0, other=0)
    prose, fence = [], None  # fence = (char, length, has_lang) while inside a fenced block
    for line in md.splitlines():
        m = FENCE.match(line)
        if fence is None and m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = (m.group(1)[0], len(m.group(1)), bool(m.group(2).strip()))
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= fence[1] and not m.group(2).strip():
                r["fenced"] += 1
                r["lang"] += fence[2]
                fence = None
        else:
            prose.append(line)
    r["unclosed"] = int(fence is not None)
    for prev, line in zip(prose, prose[1:]):
        if "|" in prev and "|" in line and "-" in line and PIPE_SEP.match(line):
            r["pipe"] += 1
    targets = []
    for line in prose:
        d = REF_DEF.match(line)
        if d:
            targets.append(d.group(2))
            continue
        targets += [m.group(2) for m in INLINE_LINK.finditer(CODE_SPAN.sub("", line))]
    for t in targets:
        r["links"] += 1
        if re.match(r"(?i)https?://", t):
            r["abs"] += 1
        elif SCHEME.match(t):
            r["other"] += 1
        else:
            r["rel"] += 1
    return r


def fixtures(directory):
    listing = directory / "pages.json"
    if listing.exists():
        return [directory / p["file"] for p in json.loads(listing.read_text(encoding="utf-8"))]
    return sorted(directory.glob("*.html"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("directory", type=Path, help="fixture directory, e.g. tests/fixtures/pages")
    ap.add_argument("suffix", help="output set, e.g. trafilatura.md: reads NAME.<suffix> beside NAME.html")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of a Markdown table")
    args = ap.parse_args()

    cols = ["chars", "pre", "fenced", "lang", "tables", "pipe", "links", "abs", "rel", "other"]
    rows = []
    for page in fixtures(args.directory):
        out = page.with_name(page.name[: -len(".html")] + "." + args.suffix.lstrip("."))
        row = {"file": page.name, **count_html(page.read_bytes().decode("utf-8", "replace"))}
        if out.exists():
            row.update(count_markdown(out.read_text(encoding="utf-8", errors="replace")))
        else:
            row["missing"] = out.name
        rows.append(row)

    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print("| file | " + " | ".join(cols) + " |")
    print("| --- |" + " ---: |" * len(cols))
    for row in rows:
        print(f"| {row['file']} | " + " | ".join(str(row.get(c, "-")) for c in cols) + " |")
    total = {c: sum(row.get(c, 0) for row in rows) for c in cols}
    print("| **total** | " + " | ".join(str(total[c]) for c in cols) + " |")
    missing = [row["missing"] for row in rows if "missing" in row]
    if missing:
        print(f"\nmissing outputs: {', '.join(missing)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
