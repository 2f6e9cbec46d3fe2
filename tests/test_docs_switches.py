"""The handbook's switches page: generated from the registered patches when the site is built."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_switches_page_lists_every_registered_switch_in_order():
    from cogvideox_torchax.patches.registry import patches

    spec = importlib.util.spec_from_file_location("switches_hook", ROOT / "docs" / "hooks" / "switches.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "switches.md").read_text()
    assert hook.MARKER in page
    rendered = hook.on_page_markdown(page, None, None, None)
    rows = [line for line in rendered.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    assert [row.split("`")[1] for row in rows] == [p.switch for p in patches()]
    assert all(p.doc.split(" ")[0] in rendered for p in patches())
    assert "switches.py" in (ROOT / "mkdocs.yml").read_text()
