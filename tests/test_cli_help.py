"""`ddlbench --help` reads as a tool: the user's commands by task, each command's help complete with an
example, internals runnable but off the list, and renamed spellings refused with the new one named."""

from __future__ import annotations

import argparse
import re

import pytest

from ddlbench.cli import build_parser, main
from ddlbench.cli.common import INTERNAL


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


COMMANDS = _commands()
INTERNALS = sorted(name for name, command in COMMANDS.items() if command.section == INTERNAL)
USER_COMMANDS = sorted(set(COMMANDS) - set(INTERNALS))


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_the_parser_has_user_commands_and_internals():
    assert {"plan", "report", "profile", "predict", "fit", "certify", "history"} <= set(USER_COMMANDS)
    assert {"run-point", "run-group", "run-packed", "sample"} <= set(INTERNALS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_complete_description_and_an_example(name, capsys):
    command = COMMANDS[name]
    assert command.description and command.description.rstrip().endswith((".", ")")), name
    assert command.summary, name
    text = _help(capsys, name)
    assert f"usage: ddlbench {name}" in text
    examples = text.split("\nexample:\n", 1)
    assert len(examples) == 2, f"{name}: no example"
    assert re.search(rf"^  ddlbench {re.escape(name)}\b", examples[1], re.MULTILINE), examples[1]


def test_the_top_level_help_lists_user_commands_by_section_and_no_internal(capsys):
    text = _help(capsys)
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.split("\noptions:\n", 1)[0].splitlines():
        if re.fullmatch(r"[A-Z][^:]*:", line):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and line.startswith("  ") and line.strip():
            current.append(line.split()[0])
        else:
            current = None
    assert list(sections) == [
        "Run a sweep",
        "On SLURM",
        "Predict (analytic model)",
        "Scaling models (empirical)",
        "Certify",
        "History",
    ]
    listed = [name for names in sections.values() for name in names]
    assert sorted(listed) == USER_COMMANDS  # each user command once, under its section
    assert not set(listed) & set(INTERNALS)
    description = text.split("\n\n")[1]
    assert description.rstrip().endswith("."), description
    internals = " ".join(text.split("\noptions:\n", 1)[1].split()).split("Internal commands", 1)[1]
    assert all(name in internals for name in INTERNALS), internals


@pytest.mark.parametrize(
    ("argv", "new"),
    [(["fit", "--at", "nodes=8"], "--extrapolate-to"), (["fit", "--at=nodes=8,16"], "--extrapolate-to")],
)
def test_a_renamed_option_is_refused_in_one_line_naming_the_new_one(argv, new, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"ddlbench {argv[0]}: error: --at is now {new}"]


def test_predict_and_fit_say_which_model_they_are(capsys):
    assert "analytic model only" in " ".join(_help(capsys, "predict").split())
    fit = " ".join(_help(capsys, "fit").split())
    assert "`ddlbench predict` is the analytic model" in fit and "--extrapolate-to" in fit
