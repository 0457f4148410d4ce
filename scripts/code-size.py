#!/usr/bin/env python3
"""Sizes of the Rust code: lines per crate, the largest files and functions.

    scripts/code-size.py            lines per crate, the ten largest files and functions
    scripts/code-size.py --top 20   twenty of each
    scripts/code-size.py --check    exit 1 when a file or function of the lab or a
                                    server crate is over the size the layout allows

Reads the files git tracks. A function's length is counted from its `fn` line to its
closing brace, with strings, characters and comments skipped while matching braces.
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

# The crates whose files and functions are held to the limits (docs/architecture.md).
LIMITED = ("netlane-lab", "netlane-bulk", "netlane-kv", "netlane-nvme", "netlane-rr", "netlane-lb")
MAX_FILE_LINES = 600
MAX_FN_LINES = 120

FN_RE = re.compile(
    r"^\s*(?:pub(?:\([\w:]+\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
    r"(?:extern\s+\"\w+\"\s+)?fn\s+(\w+)"
)


def code_only(text):
    """The text with strings, characters and comments blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        raw = re.match(r'b?r(#*)"', text[i : i + 40])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + raw.group(1)
            j = text.find(end, i + raw.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == "'":
            ch = re.match(r"'(\\.[^']*|[^\\'])'", text[i : i + 12])
            if ch:
                out.append("' '")
                i += ch.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    """(name, first line, length) of every function with a body in the file."""
    text = code_only(path.read_text())
    lines = text.split("\n")
    found = []
    for start, line in enumerate(lines):
        m = FN_RE.match(line)
        if not m:
            continue
        # `nested` counts open brackets and parentheses: a `;` inside them (an array
        # type, `[Check; 2]`) does not end a declaration.
        depth, nested, opened = 0, 0, False
        for end in range(start, len(lines)):
            for c in lines[end]:
                if c == "{":
                    depth, opened = depth + 1, True
                elif c == "}":
                    depth -= 1
                elif c in "[(" and not opened:
                    nested += 1
                elif c in "])" and not opened:
                    nested -= 1
                elif c == ";" and not opened and depth == 0 and nested == 0:
                    break  # a declaration without a body
            else:
                if opened and depth == 0:
                    found.append((m.group(1), start + 1, end - start + 1))
                    break
                continue
            break
    return found


def tracked_rust(root):
    out = subprocess.run(
        ["git", "ls-files", "crates/*.rs"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.split()
    return [Path(root, p) for p in out]


def crate_of(path, root):
    parts = path.relative_to(root).parts
    return parts[1] if len(parts) > 1 and parts[0] == "crates" else ""


def is_source(path, root):
    return "src" in path.relative_to(root).parts[2:3]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    root = Path(
        subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    files = tracked_rust(root)
    sizes = {p: p.read_text().count("\n") for p in files}
    per_crate = {}
    for p, n in sizes.items():
        src, all_ = per_crate.get(crate_of(p, root), (0, 0))
        per_crate[crate_of(p, root)] = (src + (n if is_source(p, root) else 0), all_ + n)
    fns = [(n, p, name, line) for p in files for name, line, n in functions(p)]

    if args.check:
        over = []
        for p, n in sizes.items():
            if crate_of(p, root) in LIMITED and is_source(p, root) and n > MAX_FILE_LINES:
                over.append(f"{p.relative_to(root)}: {n} lines (at most {MAX_FILE_LINES})")
        for n, p, name, line in fns:
            if crate_of(p, root) in LIMITED and is_source(p, root) and n > MAX_FN_LINES:
                over.append(
                    f"{p.relative_to(root)}:{line} fn {name}: {n} lines (at most {MAX_FN_LINES})"
                )
        for o in over:
            print(o)
        print(f"{len(over)} over the limits in {', '.join(LIMITED)}")
        return 1 if over else 0

    print("lines per crate (src, all)")
    for c, (src, all_) in sorted(per_crate.items()):
        print(f"  {c:14} {src:6} {all_:6}")
    print(f"  {'total':14} {sum(s for s, _ in per_crate.values()):6} {sum(sizes.values()):6}")
    print(f"the {args.top} largest files")
    for p, n in sorted(sizes.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {n:6} {p.relative_to(root)}")
    print(f"the {args.top} largest functions")
    for n, p, name, line in sorted(fns, key=lambda f: -f[0])[: args.top]:
        print(f"  {n:6} {p.relative_to(root)}:{line} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
