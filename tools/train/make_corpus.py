#!/usr/bin/env python3
"""English training text for the built-in model, from Debian documentation packages (offline, DFSG-free).

Sources (licences as their debian/copyright files state them):
  debian-handbook      The Debian Administrator's Handbook (GPL-2+ or CC-BY-SA-3.0), html/en-US
  debian-reference-en  The Debian Reference (GPL-2+ style, see its copyright file), html
  python3.11-doc       The Python documentation (PSF License), the tutorial/howto/faq/reference/library sources
  debian-policy, developers-reference, debian-faq (GPL-2+ and similar free licences)
  linux-doc-6.1        The Linux kernel's documentation (GPL-2), its prose sections

Get them without installing (any Debian/Ubuntu machine):
  mkdir debs && cd debs && apt-get download debian-handbook debian-reference-en python3.11-doc \\
      debian-policy developers-reference debian-faq linux-doc-6.1
  for f in *.deb; do dpkg -x "$f" ../root; done

Then: python3 tools/train/make_corpus.py --root root --out tools/train/data
writes corpus.train.txt.gz and corpus.valid.txt.gz (documents separated by a line holding only \\f; whole
documents go to the validation split by a hash of their name, so no paragraph of it is seen in training)
and SOURCES.txt. Prose only: code blocks, tables and navigation are dropped, since a model this small learns
English better from paragraphs.
"""
import argparse
import glob
import gzip
import hashlib
import html
import os
import re
from html.parser import HTMLParser

DOC_SEP = "\f"
VALID_PER_MILLE = 40  # 4% of documents


class ProseExtractor(HTMLParser):
    """Text of <p>, <li>, <dd>, <dt>, <h1..4> and <title>, one paragraph per block; skips pre/code tables."""

    BLOCK = {"p", "li", "dd", "dt", "h1", "h2", "h3", "h4", "blockquote"}
    SKIP = {"pre", "script", "style", "table", "nav", "head"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paras, self.buf, self.depth_block, self.depth_skip, self.divs = [], [], 0, 0, []

    def handle_starttag(self, tag, attrs):
        if tag == "div":  # publican html writes paragraphs as <div class="para">; navigation is in divs too
            cls = dict(attrs).get("class", "") or ""
            kind = "skip" if any(c in cls for c in ("navheader", "navfooter", "toc", "footnotes", "sphinxsidebar",
                                                     "related", "titlepage")) else \
                "block" if cls.split()[:1] == ["para"] else ""
            self.divs.append(kind)
            tag = {"skip": "table", "block": "p"}.get(kind, "")
        if tag in self.SKIP:
            self.depth_skip += 1
        elif tag in self.BLOCK:
            self.flush()
            self.depth_block += 1

    def handle_endtag(self, tag):
        if tag == "div":
            kind = self.divs.pop() if self.divs else ""
            tag = {"skip": "table", "block": "p"}.get(kind, "")
        if tag in self.SKIP:
            self.depth_skip = max(0, self.depth_skip - 1)
        elif tag in self.BLOCK:
            self.flush()
            self.depth_block = max(0, self.depth_block - 1)

    def handle_data(self, data):
        if self.depth_skip == 0 and self.depth_block > 0:
            self.buf.append(data)

    def flush(self):
        text = re.sub(r"\s+", " ", "".join(self.buf)).strip()
        self.buf = []
        if text:
            self.paras.append(text)


def html_paragraphs(path):
    p = ProseExtractor()
    with open(path, encoding="utf-8", errors="replace") as f:
        p.feed(f.read())
    p.flush()
    return p.paras


RST_ROLE = re.compile(r":[a-zA-Z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")


def rst_paragraphs(path):
    """Paragraphs of a reStructuredText source, without directives, literal blocks, tables or headings' rules."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    paras, cur, literal_indent = [], [], None

    def flush():
        if cur:
            t = " ".join(cur)
            t = RST_ROLE.sub(r"\1", t)
            t = re.sub(r"``([^`]*)``", r"\1", t)
            t = re.sub(r"`([^`<]*?)(?:\s*<[^>]*>)?`_{0,2}", r"\1", t)
            t = re.sub(r"\*\*([^*]*)\*\*", r"\1", t)
            t = re.sub(r"\*([^*]*)\*", r"\1", t)
            t = re.sub(r"\|([^|]*)\|", r"\1", t)
            t = re.sub(r"\s+", " ", t).strip()
            if t.endswith("::"):
                t = t[:-1]
            if len(t) > 1:
                paras.append(t)
            cur.clear()

    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if stripped == "" or indent > literal_indent:
                continue
            literal_indent = None
        if stripped == "":
            flush()
            continue
        if stripped.startswith(".. ") or stripped.startswith(">>>") or stripped.startswith("..."):
            flush()
            literal_indent = indent  # a directive's body (code, notes' options, ...) is indented below it
            continue
        if re.fullmatch(r"([=\-~^\"'`#*+<>_:.])\1{2,}", stripped) or stripped.startswith("+--") or \
                stripped.startswith("|") or re.match(r"^[=\- ]{6,}$", stripped):
            cur.clear()  # a heading's text, or a table
            continue
        if stripped.startswith((":param", ":returns", ":raises", ":type")):
            continue
        cur.append(stripped[2:] if stripped.startswith(("* ", "- ")) else stripped)
        if stripped.endswith("::"):
            flush()
            literal_indent = indent
    flush()
    return paras


def keep(par):
    """Sentences, not code or lists of names: mostly letters, some words, ends like a sentence."""
    if len(par) < 40:
        return False
    letters = sum(c.isalpha() or c == " " for c in par)
    if letters / len(par) < 0.8:
        return False
    return par[-1] in ".:;?!)\"'"


def documents(root):
    share = os.path.join(root, "usr", "share")
    srcs = []
    for p in sorted(glob.glob(os.path.join(share, "doc", "debian-handbook", "html", "en-US", "*.html"))):
        srcs.append(("debian-handbook/" + os.path.basename(p), html_paragraphs, p))
    for p in sorted(glob.glob(os.path.join(share, "debian-reference", "*.en.html"))):
        srcs.append(("debian-reference/" + os.path.basename(p), html_paragraphs, p))
    for p in sorted(glob.glob(os.path.join(share, "doc", "debian-policy", "policy.html", "*.html"))):
        srcs.append(("debian-policy/" + os.path.basename(p), html_paragraphs, p))
    for p in sorted(glob.glob(os.path.join(share, "developers-reference", "*.html"))):
        srcs.append(("developers-reference/" + os.path.basename(p), html_paragraphs, p))
    for p in sorted(glob.glob(os.path.join(share, "doc", "debian", "FAQ", "*.en.html"))):
        srcs.append(("debian-faq/" + os.path.basename(p), html_paragraphs, p))
    pyroot = glob.glob(os.path.join(share, "doc", "python3*", "html", "_sources"))
    for base in pyroot[:1]:
        for sub in ("tutorial", "howto", "faq", "reference", "library", "using", "glossary.rst.txt"):
            for p in sorted(glob.glob(os.path.join(base, sub, "**", "*.rst.txt"), recursive=True)) + \
                    ([os.path.join(base, sub)] if sub.endswith(".txt") else []):
                srcs.append(("python-doc/" + os.path.relpath(p, base), rst_paragraphs, p))
    # The Linux kernel's documentation (GPL-2), without its translations.
    for kroot in sorted(glob.glob(os.path.join(share, "doc", "linux-doc-*", "html")))[:1]:
        for p in sorted(glob.glob(os.path.join(kroot, "**", "*.html"), recursive=True)):
            rel = os.path.relpath(p, kroot)
            if rel.split(os.sep)[0] in ("translations", "_sources", "_static") or os.sep not in rel:
                continue
            srcs.append(("linux-doc/" + rel, html_paragraphs, p))
    if not srcs:
        raise SystemExit(f"no documentation found under {share} (see this script's docstring for how to get it)")
    for name, fn, path in srcs:
        paras = [html.unescape(x) for x in fn(path) if keep(x)]
        if paras:
            yield name, paras


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="folder the .deb files were extracted into (dpkg -x)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    counts = {"train": [0, 0, 0], "valid": [0, 0, 0]}
    outs = {s: gzip.open(os.path.join(a.out, f"corpus.{s}.txt.gz"), "wt", encoding="utf-8", compresslevel=9)
            for s in counts}
    names = []
    for name, paras in documents(a.root):
        h = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 1000
        split = "valid" if h < VALID_PER_MILLE else "train"
        text = "\n".join(paras)
        outs[split].write(text + "\n" + DOC_SEP + "\n")
        c = counts[split]
        c[0] += 1
        c[1] += len(paras)
        c[2] += len(text.encode())
        names.append(f"{split}\t{name}")
    for f in outs.values():
        f.close()
    with open(os.path.join(a.out, "SOURCES.txt"), "w") as f:
        f.write("# split<TAB>document; from debian-handbook (GPL-2+ or CC-BY-SA-3.0), debian-reference (GPL-2+),\n"
                "# python3.11-doc (PSF License), debian-policy, developers-reference, debian-faq (GPL-2+),\n"
                "# linux-doc (GPL-2)\n")
        f.write("\n".join(names) + "\n")
    for s, (d, p, b) in counts.items():
        print(f"{s}: {d} documents, {p} paragraphs, {b / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
