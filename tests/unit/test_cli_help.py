"""Every argument of every command says what it is for (issue 40: `run`'s
positionals, `--backend` and `demo --steps` had no help), and the top-level
help describes the tool, not the source tree."""

from __future__ import annotations

import argparse

from memalloc.__main__ import build_parser


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def commands() -> dict[str, argparse.ArgumentParser]:
    return dict(subcommands(build_parser()).choices)


def test_every_argument_of_every_command_has_help():
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, parser in commands().items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        and action.help != argparse.SUPPRESS
        and not (action.help or "").strip()
    ]
    assert missing == []


def test_every_command_has_a_summary_and_the_top_help_names_them():
    parser = build_parser()
    summaries = {a.dest: a.help for a in subcommands(parser)._choices_actions}
    assert set(summaries) == set(commands()) and all(summaries.values()), summaries
    text = parser.format_help()
    assert "memalloc/cli" not in text  # the layout of the source is not the user's business
    for name in commands():
        assert f"`{name}" in parser.description, name
