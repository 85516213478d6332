"""`dice --help` and every subcommand's help end their sentences, and a mistake on the command line is one line."""

import re

import pytest

from dice_pipeline.cli import SUBCOMMANDS, main


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def _description(text: str) -> str:
    """The paragraph(s) between the usage block and the argument lists."""
    body = text.split("\n\n", 1)[1]
    return " ".join(re.split(r"\n(?:positional arguments|options):", body)[0].split())


@pytest.mark.parametrize("argv", [(), *[(name,) for name in SUBCOMMANDS], ("eval", "run")])
def test_help_descriptions_end_their_sentences(capsys, argv):
    text = _help(capsys, *argv)
    description = _description(text)
    assert description and description[-1] in ".)", (argv, description[-80:])
    # and no line of the help stops on a dangling word of a sentence cut at the docstring's first line break
    assert not re.search(r"\b(and|or|the|a|of|to|so|through|exposes)\n\n", text), text


def test_a_command_line_mistake_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as done:
        main(["eval", "run", "x", "--max-tasks", "0"])
    assert done.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("dice eval run: argument --max-tasks: invalid positive integer value: '0'")
