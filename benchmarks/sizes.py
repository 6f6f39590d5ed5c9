"""The library's largest files and functions, in lines (issue #39's evidence).

Reads ``jaxbnp/**/*.py`` under ``--root`` (default: this checkout) with ``ast``; nothing is
imported. A function's size is its ``def`` through its last line, docstring included;
methods count on their own (``Class.method``), and a class's size is not listed.

Usage::

    python benchmarks/sizes.py                              # this checkout
    git worktree add /tmp/old <commit> && python benchmarks/sizes.py --root /tmp/old --out-name sizes_before

Results: ``benchmarks/results/<out-name>.md`` (default ``sizes``).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from harness import RESULTS, write_lines


def sizes(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    files, functions = [], []
    for path in sorted((root / "jaxbnp").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        files.append((len(text.splitlines()), rel))

        def visit(node, prefix=""):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    functions.append((child.end_lineno - child.lineno + 1,
                                      f"{rel}:{child.lineno} {prefix}{child.name}"))
                    visit(child, prefix + child.name + ".")
                elif isinstance(child, ast.ClassDef):
                    visit(child, prefix + child.name + ".")

        visit(ast.parse(text))
    return sorted(files, reverse=True), sorted(functions, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out-name", default="sizes")
    args = parser.parse_args()
    files, functions = sizes(Path(args.root))
    lines = [f"# Largest library files and functions ({args.out_name})", "",
             f"`python benchmarks/sizes.py` (module docstring); {len(files)} files, "
             f"{sum(n for n, _ in files)} lines in all; {len(functions)} functions.", "",
             "| lines | file |", "|---|---|"]
    lines += [f"| {n} | `{name}` |" for n, name in files[:args.top]]
    lines += ["", "| lines | function |", "|---|---|"]
    lines += [f"| {n} | `{name}` |" for n, name in functions[:args.top]]
    print("\n".join(lines))
    write_lines(RESULTS / f"{args.out_name}.md", lines)


if __name__ == "__main__":
    main()
