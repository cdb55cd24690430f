"""``hearth serve``: run the server from the command line (the add-on's start script does the
same)."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__, redact
from .settings import add_arguments, load


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hearth", description="Hearth: a local LLM service "
                                     "for Home Assistant households")
    parser.add_argument("--version", action="version", version=f"hearth {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server")
    add_arguments(serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = load(args)
    logging.basicConfig(
        level=getattr(logging, settings.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr)
    redact.install()
    if args.command == "serve":
        from aiohttp import web

        from .server import FLEET, create_app

        app = create_app(settings)
        print(f"Hearth {__version__} listening on http://{settings.host}:{settings.port} "
              "(model loading; GET /health answers 200 when ready)", flush=True)
        # handler_cancellation: a client that hangs up cancels its handler, which cancels
        # its engine request (streaming or not).
        web.run_app(app, host=settings.host, port=settings.port, print=None,
                    access_log=None, handle_signals=True, handler_cancellation=True,
                    shutdown_timeout=10)
        return app[FLEET].exit_code  # non-zero when the engine died
    return 0


if __name__ == "__main__":
    sys.exit(main())
