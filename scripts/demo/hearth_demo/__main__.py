"""``python -m hearth_demo run`` (make run) and ``python -m hearth_demo load`` (make demo-load)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
import time

from .load import run_load
from .stack import DemoSettings, DemoStack


class Stop(Exception):
    """SIGINT or SIGTERM arrived."""


def _on_signal(signum: int, frame: object) -> None:
    print(f"\n[demo] {signal.Signals(signum).name} received, shutting down", flush=True)
    raise Stop(signal.Signals(signum).name)


def cmd_run(args: argparse.Namespace) -> int:
    settings = DemoSettings(server_port=args.port, ha_port=args.ha_port,
                            server_args=shlex.split(args.server_args))
    stack = DemoStack(settings)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    t0 = time.monotonic()
    try:
        stack.start()
        print(f"[demo] ready in {time.monotonic() - t0:.0f}s", flush=True)
        print(stack.summary(), flush=True)
        while True:
            time.sleep(1)
            if problem := stack.check_alive():
                print(f"[demo] error: {problem}", file=sys.stderr)
                return 1
    except Stop:
        return 0
    except Exception as err:  # print it plainly, then stop everything
        print(f"[demo] error: {err}", file=sys.stderr)
        print(f"[demo] logs: {settings.logs}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C while stopping should not leave processes behind: ignore it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()


def cmd_load(args: argparse.Namespace) -> int:
    settings = DemoSettings(ha_port=args.ha_port)
    print(f"[load] sending a household mix to {settings.ha_url} for at most {args.duration:.0f}s",
          flush=True)
    try:
        result = asyncio.run(run_load(
            settings.ha_url, settings.username, settings.password, voice=args.voice,
            chat=args.chat, jobs=args.jobs, duration=args.duration,
            say=lambda line: print(line, flush=True)))
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        print(f"[load] error: {err} (is `make run` running?)", file=sys.stderr)
        return 1
    print(result.report())
    return 0 if (result.voice or result.chat) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hearth_demo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the server + Home Assistant with Hearth, until Ctrl-C")
    run.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8080)),
                     help="the Hearth server's port")
    run.add_argument("--ha-port", type=int, default=int(os.environ.get("HA_PORT", 8123)))
    run.add_argument("--server-args", default=os.environ.get("ARGS", ""),
                     help="extra `hearth serve` arguments, one string")
    load = sub.add_parser("load", help="a bounded household mix through Home Assistant")
    load.add_argument("--ha-port", type=int, default=int(os.environ.get("HA_PORT", 8123)))
    load.add_argument("--voice", type=int, default=8, help="voice turns")
    load.add_argument("--chat", type=int, default=3, help="typed turns")
    load.add_argument("--jobs", type=int, default=3, help="background summary jobs")
    load.add_argument("--duration", type=float, default=120, help="seconds, at most")
    args = parser.parse_args(argv)
    return cmd_run(args) if args.command == "run" else cmd_load(args)


if __name__ == "__main__":
    sys.exit(main())
