"""Print the help of every ``reconcile`` command as Markdown, for ``docs/reference/cli.md``.

Run from a checkout: ``python scripts/cli_reference.py`` and paste its output below the page's
"Every command" heading. ``tests/unit/test_docs_reference.py`` checks that the page has a
heading for every command of the CLI (the surface pinned in
``tests/unit/test_operator_modules.py``), so a new command fails there until it is documented.
"""

from __future__ import annotations

import click

from reconcile.cli import main


def command_paths(cmd: click.Command = main, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's path under ``reconcile`` (``()`` is the root), groups first."""
    found = [path]
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            found += command_paths(cmd.commands[name], (*path, name))
    return found


def render() -> str:
    out = []
    for path in command_paths():
        name = " ".join(("reconcile", *path))
        ctx = click.Context(main, info_name="reconcile", terminal_width=96, max_content_width=96,
                            **main.context_settings)
        for part in path:
            parent = ctx
            group = ctx.command
            assert isinstance(group, click.Group)
            ctx = click.Context(group.commands[part], info_name=part, parent=parent,
                                terminal_width=96, max_content_width=96)
        out += [f"### `{name}`", "", "```text", ctx.get_help().rstrip(), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(render())
