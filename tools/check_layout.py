#!/usr/bin/env python3
"""Size budget (CI gate): source files at most 800 lines, functions at most 120.

Files: every tracked .cpp/.h/.cu/.cuh under src/, include/, tests/ and bench/. Functions: a
definition whose header starts at column 0 or 2 (the house style's namespace and class levels)
and ends its line with '{', up to the closing '}' at the same indentation. Exceptions are listed
in tools/layout_allowlist.txt, one per line: 'PATH reason' for a file, 'PATH:NAME reason' for a
function (NAME: the identifier before its parameter list), each with the reason it is allowed.
Exits non-zero naming every file or function over budget and every allow-list entry that no
longer matches anything.
"""
import os
import re
import subprocess
import sys

MAX_FILE, MAX_FUNCTION = 800, 120
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = re.compile(r"^( {0,2})(?!(?:namespace|class|struct|enum|union|if|for|while|switch|do|"
                    r"else|return|template|extern|typedef|using)\b)[^\s/#}].*\)\s*"
                    r"(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?(?:final\s*)?"
                    r"(?:->\s*[\w:<>,\s*&]+)?\{\s*$")


TAIL = re.compile(r"^\s+.*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?(?:final\s*)?\{\s*$")
START = re.compile(r"^( {0,2})(?!(?:namespace|class|struct|enum|union|if|for|while|switch|do|"
                   r"else|return|template|extern|typedef|using)\b)[^\s/#}].*\(")


def functions(lines):
    """(name, first line, length) of each function definition found."""
    i = 0
    while i < len(lines):
        m = HEADER.match(lines[i])
        first = i
        if not m and TAIL.match(lines[i]):
            # Parameters wrapped onto continuation lines: the header starts a few lines up.
            for k in range(i - 1, max(i - 5, -1), -1):
                if START.match(lines[k]):
                    m, first = START.match(lines[k]), k
                    break
                if not lines[k].startswith("   "):
                    break
        if not m:
            i += 1
            continue
        indent = m.group(1)
        name = re.findall(r"([~\w:]+)\s*\(", " ".join(lines[first:i + 1]))
        end = i + 1
        while end < len(lines) and not re.match(r"^" + indent + r"\}", lines[end]):
            end += 1
        yield (name[0] if name else "?"), first + 1, end - first + 1
        i = end + 1


def main():
    files = subprocess.run(["git", "ls-files", "src", "include", "tests", "bench"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in files if f.endswith((".cpp", ".h", ".cu", ".cuh"))]
    allowed = {}
    with open(os.path.join(ROOT, "tools", "layout_allowlist.txt")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, reason = line.partition(" ")
                if not reason.strip():
                    sys.exit(f"tools/layout_allowlist.txt: '{key}' gives no reason")
                allowed[key] = False
    errors = []
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        if len(lines) - 1 > MAX_FILE:
            if path in allowed:
                allowed[path] = True
            else:
                errors.append(f"{path}: {len(lines) - 1} lines (budget {MAX_FILE})")
        for name, first, length in functions(lines):
            if length <= MAX_FUNCTION:
                continue
            key = f"{path}:{name}"
            if key in allowed:
                allowed[key] = True
            else:
                errors.append(f"{path}:{first}: function {name} is {length} lines "
                              f"(budget {MAX_FUNCTION})")
    errors += [f"tools/layout_allowlist.txt: '{k}' matches nothing over budget; remove it"
               for k, used in allowed.items() if not used]
    for e in errors:
        print(e)
    print(f"size budget: {len(files)} files, {len(errors)} over budget")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
