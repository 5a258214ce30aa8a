"""Which database the CLI uses: said by every command that touches one; never a silent default."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from reconcile.cli import NO_DATABASE, main


def test_without_a_configured_database_the_cli_says_so_and_creates_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RECONCILE_")}
    for args in (["stuck"], ["db", "upgrade"], ["audit"]):
        proc = subprocess.run([sys.executable, "-m", "reconcile", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert NO_DATABASE in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no reconcile.db appeared in the current folder


@pytest.mark.parametrize("args", [["unsettled", "--json"], ["uncertain", "--json"], ["audit", "--json"]])
def test_each_command_names_its_database_on_stderr(db: object, pg_url: str, args: list[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # ``db``: the tables are truncated, so ``audit`` has nothing to report but its database
    monkeypatch.setenv("RECONCILE_DATABASE_URL", pg_url)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == f"database: {pg_url} (from RECONCILE_DATABASE_URL)"
    json.loads(result.stdout)  # stdout stays pure JSON


def test_the_flag_wins_and_the_password_is_hidden(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECONCILE_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    secret_url = pg_url.replace("postgres@", "postgres:s3cret@")
    result = CliRunner().invoke(main, ["--database-url", secret_url, "unsettled"])
    assert result.exit_code == 0, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("database: postgresql+psycopg://postgres:***@") and "(from --database-url)" in first
    assert "s3cret" not in result.output
