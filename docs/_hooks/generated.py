"""The generated parts of the documentation, written when the site is built.

* `cli.md`: each `<!-- ansor-cli: COMMAND -->` marker becomes the usage and option table of
  that command, read from the parser of `ansor.cli.build_parser()`, so the page always says
  what the command line accepts. Every command must have its marker and every marker a
  command: a command added to the parser without a place on the page stops the build.
  Its `<!-- ansor-workloads -->` marker becomes the table of named workloads.
* `tutorials.md`: the `<!-- ansor-examples -->` marker becomes the list of `examples/*.py`,
  each with the first line of its docstring.
* `DESIGN.md` is written to be read as a plain file too: its index notation such as
  `W[f/16][c][ry][rx][16]` is escaped outside code, where the site's cross-reference syntax
  would otherwise take `[c][ry]` for a reference.

Nothing here imports mkdocs at module level, so the tests can call the same functions.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI_MARKER = re.compile(r"<!-- ansor-cli(?:: ([a-z0-9 -]+?))? -->")
EXAMPLES_MARKER = "<!-- ansor-examples -->"
WORKLOADS_MARKER = "<!-- ansor-workloads -->"
USAGE_WIDTH = 88


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `ansor` command."""
    from ansor.cli import build_parser as ansor_parser

    return ansor_parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Every (sub)command below `parser`, nested ones as "costmodel eval": its parser and help."""
    found: dict[str, tuple[argparse.ArgumentParser, str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                found[name] = (sub, helps.get(name, ""))
                for inner, value in subcommands(sub).items():
                    found[f"{name} {inner}"] = value
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def render_command(parser: argparse.ArgumentParser, help_text: str = "") -> str:
    """Markdown for one command: what it does, its usage line and a table of its arguments."""
    formatter = argparse.HelpFormatter(prog=parser.prog, width=USAGE_WIDTH)
    description = parser.description if parser.prog != "ansor" else None
    lines = []
    if description or help_text:
        lines += [_cell(description or help_text[:1].upper() + help_text[1:] + "."), ""]
    lines += ["```text", _usage(parser), "```", ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                rows.append((f"`{choice.dest}`", _cell(choice.help or "")))
            continue
        if action.option_strings:
            name = formatter._format_action_invocation(action)
        else:
            name = action.metavar or action.dest
        if isinstance(action, argparse._VersionAction):
            help_ = "print the version and exit"
        else:
            help_ = formatter._expand_help(action) if action.help else ""
        rows.append((f"`{name}`", _cell(help_)))
    if rows:
        lines += ["| Argument | Meaning |", "| --- | --- |"]
        lines += [f"| {name} | {help_} |" for name, help_ in rows]
        lines.append("")
    return "\n".join(lines)


def workloads_table() -> str:
    """Markdown table of the named workloads: name, what `--shape` means, defaults, options."""
    from ansor.workloads import WORKLOADS

    lines = ["| Workload | `--shape` | Default shape | Options (defaults) |", "| --- | --- | --- | --- |"]
    for w in WORKLOADS.values():
        options = ", ".join(f"`--{k} {v}`" for k, v in w.options.items())
        shape = ",".join(map(str, w.default_shape))
        lines.append(f"| `{w.name}` | `{w.shape_help}` | `{shape}` | {options} |")
    return "\n".join(lines) + "\n"


def render_cli_page(markdown: str, parser: argparse.ArgumentParser | None = None) -> str:
    """The CLI page with every marker replaced; ValueError when a command has no marker, a
    marker names no command, or one command has two."""
    parser = parser or build_parser()
    if WORKLOADS_MARKER in markdown:
        markdown = markdown.replace(WORKLOADS_MARKER, workloads_table())
    commands = subcommands(parser)
    seen: list[str] = []

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name is None:
            seen.append("")
            return render_command(parser)
        if name not in commands:
            raise ValueError(f"cli.md: marker for {name!r}, which is not an ansor command "
                             f"(commands: {', '.join(commands)})")
        seen.append(name)
        sub, help_text = commands[name]
        return render_command(sub, help_text)

    out = CLI_MARKER.sub(replace, markdown)
    missing = [c for c in ["", *commands] if c not in seen]
    if missing:
        names = ", ".join(repr(f"ansor {c}".strip()) for c in missing)
        raise ValueError(f"cli.md: no <!-- ansor-cli: ... --> marker for {names}")
    twice = sorted({c for c in seen if seen.count(c) > 1})
    if twice:
        raise ValueError(f"cli.md: more than one marker for {', '.join(twice)}")
    return out


def example_lines(root: Path = ROOT) -> list[str]:
    """One Markdown list item per `examples/*.py`: its path and the first line of its docstring."""
    lines = []
    for path in sorted((root / "examples").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else "(no description)"
        lines.append(f"- `examples/{path.name}`: {first}")
    return lines


def render_examples_page(markdown: str, root: Path = ROOT) -> str:
    """The tutorials page with its marker replaced by the list of examples."""
    if EXAMPLES_MARKER not in markdown:
        raise ValueError(f"tutorials.md: no {EXAMPLES_MARKER} marker")
    return markdown.replace(EXAMPLES_MARKER, "\n".join(example_lines(root)) or "(none yet)")


CODE = re.compile(r"^```.*?^```[^\n]*$|(`+).+?(?<!`)\1(?!`)", re.MULTILINE | re.DOTALL)


def escape_brackets(markdown: str) -> str:
    """`][` (a reference link to the site) escaped as `]\\[`, except in code blocks and spans."""
    out, pos = [], 0
    for code in CODE.finditer(markdown):
        out += [markdown[pos:code.start()].replace("][", "]\\["), code.group(0)]
        pos = code.end()
    out.append(markdown[pos:].replace("][", "]\\["))
    return "".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """mkdocs hook: fill in the generated parts of the pages that have them."""
    from mkdocs.exceptions import PluginError

    try:
        if page.file.src_uri == "cli.md":
            return render_cli_page(markdown)
        if page.file.src_uri == "DESIGN.md":
            return escape_brackets(markdown)
        if page.file.src_uri == "tutorials.md":
            return render_examples_page(markdown, Path(config.config_file_path).resolve().parent)
    except ValueError as exc:
        raise PluginError(str(exc)) from None
    return markdown
