"""The README's install, run and test commands are what CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _section_commands(readme: str, heading: str) -> list[str]:
    section = readme.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [ln.strip() for ln in block.splitlines() if ln.strip()]


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    for heading in ("Install", "Run", "Test"):
        commands = _section_commands(readme, heading)
        assert commands, heading
        for command in commands:
            assert command in ci, f"README {heading} command not in .ci/run: {command}"
