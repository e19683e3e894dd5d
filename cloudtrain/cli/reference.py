"""The CLI reference (docs/cli.md), generated from the argparse parser so it is always what the code accepts.

    python -m cloudtrain.cli.reference > docs/cli.md     # a test fails when the file is out of date
"""

from __future__ import annotations

import argparse
import os

from cloudtrain.cli.parser import expand_help


def _usage(parser: argparse.ArgumentParser) -> str:
    # a fixed width, so the file does not depend on the terminal it was generated in
    os.environ["COLUMNS"] = "100"
    return parser.format_usage().removeprefix("usage: ").strip()


def _options(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | meaning |", "| --- | --- |"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
        if action.option_strings and action.nargs != 0:
            name += f" `{action.metavar or action.dest.upper()}`"
        text = expand_help(action.help or "").replace("|", "\\|")
        if action.choices and not action.option_strings:
            text += f" (one of: {', '.join(map(str, action.choices))})"
        elif action.choices:
            text += f" (one of: {', '.join(map(str, action.choices))})" if "(one of" not in text else ""
        if action.default not in (None, False, True, [], argparse.SUPPRESS) and action.option_strings \
                and "default" not in text:
            text += f" (default: {action.default})"
        rows.append(f"| {name} | {text.strip()} |")
    return rows if len(rows) > 2 else []


def markdown(parser: argparse.ArgumentParser) -> str:
    lines = ["# cloudtrain CLI reference", "",
             "Generated from the code by `python -m cloudtrain.cli.reference > docs/cli.md`; do not edit by hand.", "",
             parser.description or "", "", "```", _usage(parser), "```", ""]

    def walk(p: argparse.ArgumentParser, prefix: str, level: int) -> None:
        for action in p._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            helps = {c.dest: c.help for c in action._choices_actions}
            for name, child in action.choices.items():
                full = f"{prefix} {name}"
                lines.extend([f"{'#' * level} `{full}`", "", helps.get(name) or "", "", "```", _usage(child), "```",
                              ""])
                options = _options(child)
                if options:
                    lines.extend([*options, ""])
                walk(child, full, level + 1)

    walk(parser, "cloudtrain", 2)
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    from cloudtrain.cli.main import build_parser

    print(markdown(build_parser()), end="")


if __name__ == "__main__":
    main()
