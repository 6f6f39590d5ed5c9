"""The README's examples run, the README stays short, and the package cites only its own docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_is_at_most_12_kb():
    assert README.stat().st_size <= 12 * 1024


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks[0].strip() == "pip install -e . && jaxbnp cluster"
    assert blocks[1].strip() == 'pip install -e ".[test,plot]" && python -m pytest'
    # .ci/run runs exactly the README's test command
    assert blocks[1].strip() in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_python_examples_run():
    blocks = _python_blocks(README.read_text())
    assert len(blocks) >= 3
    script = "\n\n".join(blocks)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "JAXBNP_PROGRESS": "0"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_package_cites_only_the_repos_docs():
    offenders = []
    for path in (ROOT / "jaxbnp").rglob("*.py"):
        text = path.read_text()
        for name in ("MATH.md", "ARCHITECTURE.md"):
            if name in text:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders


def test_readme_links_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, missing
