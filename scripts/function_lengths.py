#!/usr/bin/env python3
"""List C++ function definitions longer than a limit (default 80 lines), signature to closing brace.

    scripts/function_lengths.py [--max 80] [--all] PATH...

PATH: files or folders (*.cpp, *.cc, *.h, *.hpp under them). A tokenizer, not a compiler: comments,
string and character literals and preprocessor lines are blanked, then braces are matched. A brace
at namespace or class scope opens a function body when the statement before it holds a parameter
list and ends like a signature (`)`, qualifiers, a trailing return type, or a constructor's
initializer list). Lambdas and local classes count toward the function that holds them. Exit
status 1 when some function is longer than the limit.
"""
import argparse
import os
import re
import sys

SIGNATURE_END = re.compile(
    r"\)\s*(const|override|final|noexcept(\([^()]*\))?|mutable|&|&&|\s)*(->\s*[\w:<>,\s\*&]+)?$")


def blank(text):
    """Comments, literals and preprocessor lines become spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":  # a directive, with its continuation lines
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):  # raw string literal R"delim(...)delim"
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()):  # digit separator 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of every function defined at namespace or class scope."""
    code = blank(text)
    line_of = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_of[k] = line
        if ch == "\n":
            line += 1
    found = []
    stack = []  # kinds of open braces: ns, class, func, other
    stmt_start = 0
    i = 0
    while i < len(code):
        ch = code[i]
        scope = all(k in ("ns", "class") for k in stack)
        if ch == ";" and scope:
            stmt_start = i + 1
        elif ch == "{":
            stmt = code[stmt_start:i].strip()
            kind = "other"
            if scope:
                if re.search(r"\bnamespace\b", stmt) or re.match(r'extern\s+"', stmt):
                    kind = "ns"
                elif re.search(r"\b(class|struct|union|enum)\b", stmt) and "(" not in stmt:
                    kind = "class"
                elif "(" in stmt and "=" not in stmt.split("(")[0] and (
                        SIGNATURE_END.search(stmt) or stmt.endswith("}") or re.search(r"\)\s*:\s*[\w:]+[({]", stmt)):
                    kind = "func"
            if kind == "func":
                head = stmt.split("(")[0] if not stmt.startswith("operator") else stmt
                m = re.search(r"(operator\s*\S+|[~\w:]+)\s*$", stmt[:stmt.find("(")] if "operator" not in head else
                              stmt[:stmt.find("(", stmt.find("operator") + 9)])
                name = m.group(1) if m else stmt[:40]
                first = line_of[stmt_start + (len(code[stmt_start:i]) - len(code[stmt_start:i].lstrip()))]
                depth, j = 1, i + 1
                while j < len(code) and depth:
                    depth += {"{": 1, "}": -1}.get(code[j], 0)
                    j += 1
                found.append((name, first, line_of[j - 1]))
                i = j
                stmt_start = j
                continue
            stack.append(kind)
            if kind in ("ns", "class"):
                stmt_start = i + 1
        elif ch == "}":
            kind = stack.pop() if stack else "ns"
            if kind in ("ns", "class"):
                stmt_start = i + 1
        elif ch == ":" and scope and re.search(r"\b(public|private|protected)\s*$", code[stmt_start:i]):
            stmt_start = i + 1
        i += 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=80)
    ap.add_argument("--all", action="store_true", help="list every function, longest first")
    ap.add_argument("paths", nargs="+")
    a = ap.parse_args()
    files = []
    for p in a.paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, f) for f in names if f.endswith((".cpp", ".cc", ".h", ".hpp"))]
        else:
            files.append(p)
    rows = []
    for f in sorted(files):
        with open(f, encoding="utf-8", errors="replace") as fh:
            for name, first, last in functions(fh.read()):
                rows.append((last - first + 1, f, first, name))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    over = [r for r in rows if r[0] > a.max]
    for n, f, first, name in rows if a.all else over:
        print(f"{n:5d}  {f}:{first}  {name}")
    print(f"{len(rows)} functions in {len(files)} files; {len(over)} over {a.max} lines"
          + (f"; longest {rows[0][0]} ({rows[0][3]})" if rows else ""))
    return 1 if over else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # piped into head
        sys.exit(0)
