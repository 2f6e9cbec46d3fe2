"""The README's install, run, test and docs commands are what CI runs; its links lead somewhere."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _section_commands(readme: str, heading: str) -> list[str]:
    section = readme.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [ln.strip() for ln in block.splitlines() if ln.strip()]


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    for heading in ("Install", "Run", "Encode", "Test"):
        commands = _section_commands(readme, heading)
        assert commands, heading
        for command in commands:
            assert command in ci, f"README {heading} command not in .ci/run: {command}"


def _python_block(readme: str, heading: str) -> str:
    section = readme.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_pipeline_example_runs(monkeypatch):
    """The README's pipeline lines, verbatim, on the tiny offline pipeline of tests/support/pipelines.py.

    Only what needs the hub is stood in for: ``from_pretrained`` builds the
    tiny pipeline in the dtype asked for, and its prompt encoding returns
    fixed embeddings (there is no T5 to run).
    """
    pytest.importorskip("transformers", reason="diffusers' CogVideoX pipelines need transformers")
    from diffusers import CogVideoXPipeline

    import cogvideox_torchax as ct
    from tests.support.pipelines import embeddings, tiny_pipeline  # imported here: it needs transformers

    def from_pretrained(cls, name, torch_dtype=None, **kwargs):
        assert name == "THUDM/CogVideoX-2b"
        pipe = tiny_pipeline(cls, 4).to(torch_dtype)
        prompt_embeds = tuple(e.to(torch_dtype) for e in embeddings())
        pipe.encode_prompt = lambda *args, **kwargs: prompt_embeds
        return pipe

    monkeypatch.setattr(CogVideoXPipeline, "from_pretrained", classmethod(from_pretrained))
    code = _python_block((ROOT / "README.md").read_text(), "Use it in a diffusers pipeline")
    assert len([ln for ln in code.splitlines() if ln and not ln.startswith(("import ", "from "))]) == 5
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    pipe, video = namespace["pipe"], namespace["video"]
    assert isinstance(pipe.vae, ct.TorchaxVAE) and pipe.vae.options.dtype == "float16"
    assert pipe.vae.use_tiling and pipe.vae.use_slicing
    assert len(video) == 49 and video[0].size == (32, 32)  # PIL frames, the tiny transformer's 32x32


def test_docs_commands_are_what_ci_runs():
    """The README serves the docs with the mkdocs install CI uses, and names the build CI runs."""
    readme = (ROOT / "README.md").read_text()
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = _section_commands(readme, "Documentation")
    assert commands[-1] == "mkdocs serve"
    for command in commands[:-1]:
        assert command in ci, f"README Documentation command not in .ci/run: {command}"
    assert "mkdocs build --strict" in ci and "`mkdocs build --strict`" in readme
    assert (ROOT / "mkdocs.yml").is_file()


def test_readme_is_short_and_its_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250 and len(readme.encode()) <= 15_000
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to a missing file: {target}"


def test_the_tested_sets_the_readme_names_exist_and_ci_installs_the_oldest_from_its_file():
    """Each constraints file the README names is there; CI installs the oldest stack through the README's own line."""
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    pinned = [" ".join(c.split()) for c in re.findall(r"`(pip\s+install\s+-c\s[^`]+)`", install)]
    assert len(pinned) == 2, pinned
    ci = [" ".join(ln.split()) for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in pinned:
        path = ROOT / command.split()[3]
        assert path.is_file(), command
        lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
        assert all(re.fullmatch(r"[a-z0-9-]+==[\w.]+", ln) for ln in lines), path
        assert {"jax", "torch", "diffusers", "torchax"} <= {ln.split("==")[0] for ln in lines}, path
    assert "pip install -c constraints/python3.11.txt -e \".[test,aot]\"" in pinned
    assert "pip install -c constraints/python3.11.txt -e \".[test,aot]\"" in ci
    assert "python .ci/constraints.py check constraints/python3.11.txt" in ci
