"""The serving and running commands of ``reconcile``: ``simulator``, ``demo``, ``metrics``,
``console``."""

from __future__ import annotations

import click

from .app import Cli, Failed, Refused, main, pass_cli

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


LOOPBACK = ("127.0.0.1", "localhost", "::1")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Listen address (with --dev: loopback only).")
@click.option("--port", type=int, default=8800, show_default=True, help="0 picks a free port.")
@click.option("--dev", is_flag=True,
              help="A quick look on a laptop: loopback only, a one-time login token printed "
                   "here, no authorization hook needed.")
@pass_cli
def console(cli: Cli, host: str, port: int, dev: bool) -> None:
    """Serve the operator console (extra: console) against the database, until interrupted.

    Every request goes through the authorization hook named by RECONCILE_CONSOLE_AUTH
    (package.module:callable); without one every request is refused (403), unless --dev."""
    import getpass
    import os
    import socket

    try:
        import uvicorn

        from ..console import AUTH_SETTING, DevLogin, create_app, load_authorizer
    except ImportError as exc:
        raise Failed(f"the operator console needs its extra ({exc.name} is missing): "
                     "pip install 'reconcile[console]'") from exc
    if dev and host not in LOOPBACK:
        raise Refused(f"--dev binds to loopback only, not {host!r}: use the authorization "
                      f"hook ({AUTH_SETTING}) to serve anywhere else")
    rt = cli.runtime()
    if port == 0:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    if dev:
        try:
            who = getpass.getuser()
        except Exception:  # no login name (a container without a passwd entry)
            who = "dev"
        login = DevLogin(who)
        app = create_app(rt, dev=login)
        click.echo(f"operator console (--dev, loopback only): open once\n"
                   f"  http://{shown}:{port}/login?token={login.token}\n"
                   "the token works once; Ctrl-C stops", err=False)
    else:
        spec = os.environ.get(AUTH_SETTING)
        authorize = None
        if spec:
            try:
                authorize = load_authorizer(spec)
            except (ImportError, ValueError) as exc:
                raise Failed(f"{AUTH_SETTING}: {exc}") from exc
        else:
            click.echo(f"warning: {AUTH_SETTING} is not set: every request is refused (403) "
                       "with a page saying how to configure the hook", err=True)
        app = create_app(rt, authorize=authorize)
        click.echo(f"operator console on http://{shown}:{port}/ (Ctrl-C stops)")
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            lifespan="off")
    uvicorn.Server(config).run()


def _wait_for_signal() -> None:
    import signal
    import threading

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
