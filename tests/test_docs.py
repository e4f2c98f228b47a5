"""The docs say what the code does: the reference pages are current with the code and every record field,
table column and sweep key has its doc there; the files and commands the pages name exist; the README
stays short; and the site builds with `mkdocs build --strict` (broken links, pages left out of the nav)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
# the pages a person writes (the reference pages are generated, and checked against the code below)
WRITTEN = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.fixture(scope="module")
def gen():
    """docs/gen_reference.py, the generator of the reference pages (and the MkDocs hook), as a module."""
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_pages_are_what_the_code_generates(gen):
    stale = gen.stale_pages()
    assert not stale, f"out of date with the code: {', '.join(stale)}; run `python docs/gen_reference.py`"


def test_every_record_field_has_a_comment_in_the_code(gen):
    missing = [
        f"{cls.__module__}.{cls.__name__}.{field.name}"
        for cls in gen.record_classes()
        for field in dataclasses.fields(cls)
        if not gen.record_docs(cls).get(field.name, gen.FieldDoc(doc="")).doc
    ]
    assert not missing, f"fields without a comment beside them (docs/reference/record.md): {', '.join(missing)}"


def test_every_table_column_is_named_in_the_aggregate_docstring(gen):
    columns = gen.full_table_columns()
    assert {"point_id", "samples_per_s_median", "phase_forward_s_median", "slurm_exclusive", "speedup"} <= set(columns)
    _, groups, unnamed = gen.group_of_columns(columns)
    assert not unnamed, f"columns ddlbench/analysis/aggregate.py's docstring does not name: {', '.join(unnamed)}"
    page = (DOCS / "reference" / "table.md").read_text()
    for figure, suffixes in (row for _, members in groups for row in gen.collapse_stats(members)):
        assert f"`{figure}_<s>`" in page if suffixes else f"`{figure}`" in page


def test_every_sweep_and_calibration_key_has_a_description(gen):
    from ddlbench.calibrate.suite import suite_schema
    from ddlbench.config.schema import sweep_schema

    for schema in (sweep_schema(), suite_schema()):
        missing = [key for key, spec in gen.schema_keys(schema) if not spec.get("description")]
        assert not missing, f"{schema['title']}: keys without a description: {', '.join(missing)}"


def test_an_undocumented_field_or_unnamed_column_is_caught(gen, tmp_path, monkeypatch):
    """The checks above can fail: a field with no comment reads as undocumented, a column no docstring
    bullet names is reported, and a group's patterns match only the columns they spell."""
    (tmp_path / "fresh_record.py").write_text(
        "from dataclasses import dataclass\n\n\n"
        "@dataclass\nclass Fresh:\n"
        "    documented: int  # a doc\n"
        "    # a block above\n    blocked: int\n"
        "    # a group note\n    grouped: int  # its own doc\n"
        "    bare: int\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import fresh_record

    docs = gen.field_docs(fresh_record.Fresh)
    assert docs["documented"].doc == "a doc" and docs["blocked"].doc == "a block above"
    assert (docs["grouped"].doc, docs["grouped"].note) == ("its own doc", "a group note")
    assert docs["bare"].doc == ""
    _, _, unnamed = gen.group_of_columns(["point_id", "samples_per_s_median", "samples_per_s_overall", "new_column"])
    assert unnamed == ["new_column"]
    assert gen._pattern("phase_<figure>_{median,ci_low}").fullmatch("phase_data_s_ci_low")
    assert not gen._pattern("samples_per_s_<s>").fullmatch("samples_per_s_overall")


def test_the_files_the_docs_name_exist():
    path = r"(?<![\w/.~-])((?:ddlbench|tests|benchmarks|workflow|templates|envs|docs)/[A-Za-z0-9_./-]*[A-Za-z0-9_/])"
    missing = []
    for page in WRITTEN:
        text = page.read_text()
        named = re.findall(rf"`{path}(?:::[\w\[\]-]+)?`", text) + re.findall(rf"\]\({path}\)", text)
        named += re.findall(rf"\b{path}[`:,)]", text)
        missing += [f"{page.relative_to(REPO)}: {name}" for name in set(named) if not (REPO / name).exists()]
    assert not missing, "named but absent:\n" + "\n".join(sorted(missing))


def _code_in(page: Path) -> list[str]:
    """The page's code: the lines of its fenced blocks (comments cut off) and its inline code spans."""
    code, fenced = [], False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            code.append(line.split(" #")[0])
        else:
            code += re.findall(r"`([^`]+)`", line)
    return code


def _commands_in_docs() -> dict[str, set[str]]:
    """`ddlbench <command> …` as the written pages' code shows it, with the options each use gives."""
    used: dict[str, set[str]] = {}
    for page in WRITTEN:
        for code in _code_in(page):
            for match in re.finditer(r"(?<![\w/.-])ddlbench ([a-z][a-z-]+)(.*)", code):
                options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", match.group(2)))
                used.setdefault(match.group(1), set()).update(options)
    return used


def test_the_commands_and_options_the_docs_show_exist():
    used = _commands_in_docs()
    assert {"plan", "report", "predict", "oracle", "certify", "fit"} <= set(used)
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["ddlbench"]
    module, function = entry.split(":")
    script = (
        "import contextlib, io, json, sys\n"
        f"from {module} import {function} as main\n"
        "helps = {}\n"
        "for command in sys.argv[1:]:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main([command, '--help'])\n"
        "        except SystemExit as exit:\n"
        "            helps[command] = out.getvalue() if exit.code == 0 else None\n"
        "print(json.dumps(helps))\n"
    )
    result = subprocess.run([sys.executable, "-c", script, *sorted(used)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    helps = json.loads(result.stdout.splitlines()[-1])
    unknown = sorted(command for command, text in helps.items() if text is None)
    assert not unknown, f"commands the docs show that ddlbench does not have: {unknown}"
    absent = sorted(
        f"ddlbench {command} {option}"
        for command, options in used.items()
        for option in options
        if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", helps[command])
    )
    assert not absent, f"options the docs show that the command does not take: {absent}"


def test_the_readme_is_short_and_keeps_its_two_commands_and_its_screenshot():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make run " in readme and "make test " in readme
    assert "](docs/report-screenshot.png)" in readme and (DOCS / "report-screenshot.png").exists()


def test_the_docs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("DDLBENCH_REQUIRE_DOCS") == "1":
            pytest.fail("DDLBENCH_REQUIRE_DOCS=1 but MkDocs is not installed (pip install -e '.[test]')")
        pytest.skip("MkDocs is not installed (pip install -e '.[test]'); DDLBENCH_REQUIRE_DOCS=1 makes this fail")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "table.html").exists()
