"""The serving and running commands of ``reconcile``: ``simulator``, ``demo``, ``metrics``."""

from __future__ import annotations

import click

from .app import Cli, Failed, main, pass_cli

_ROOT = __package__.rpartition(".")[0]  # "reconcile"


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8765, show_default=True, help="0 picks a free port.")
@click.option("--seed", type=int, help="Seed for ids and chaos.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Real seconds per timeline second.")
def simulator(host: str, port: int, seed: int | None, time_scale: float) -> None:
    """Serve the loopback provider simulator until interrupted."""
    from ..testing.simulator import main as sim_main

    argv = ["--host", host, "--port", str(port), "--time-scale", str(time_scale)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    raise SystemExit(sim_main(argv))


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
              add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def demo(args: tuple[str, ...]) -> None:
    """Run the end-to-end demo (arguments go to it; `reconcile demo --help`)."""
    try:
        from ..demo import main as demo_main
    except ModuleNotFoundError as exc:
        if exc.name != f"{_ROOT}.demo":
            raise
        raise Failed("this install has no reconcile.demo") from exc
    raise SystemExit(demo_main(list(args)))


@main.command()
@click.option("--port", type=int, default=9808, show_default=True, help="0 picks a free port.")
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Listen address (0.0.0.0 for a Prometheus on another host).")
@click.option("--once", is_flag=True, help="Print one scrape to stdout and exit.")
@pass_cli
def metrics(cli: Cli, port: int, address: str, once: bool) -> None:
    """Serve Prometheus metrics read from the database at scrape time (extra: metrics)."""
    from . import metrics as m

    try:
        if once:
            click.echo(m.exposition(cli.runtime()), nl=False)
            return
        server, _thread = m.serve(cli.runtime(), port, address)
    except m.MetricsUnavailable as exc:
        raise Failed(str(exc)) from exc
    except OSError as exc:  # port taken, address not ours
        raise Failed(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from exc
    click.echo(f"serving metrics on http://{address}:{server.server_port}/metrics (Ctrl-C stops)",
               err=True)
    _wait_for_signal()


def _wait_for_signal() -> None:
    import signal
    import threading

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
