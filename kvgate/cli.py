"""The ``kvgate`` command: one CLI whose subcommands live in their own packages."""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import sys
from collections.abc import Sequence

from backends import cli as backend_cli
from epp import cli as epp_cli
from epp.scheduling.registry import CATALOG
from gateway import cli as gateway_cli
from gateway.base.build_info import version
from gateway.control import spend_report
from gateway.control.models import cli as models_cli
from kvgate.wire import app_logging
from loadtest import cli as loadtest_cli
from policies import cli as policy_cli


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default, where it has one and its help does not say."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def _add_common(parser: argparse.ArgumentParser, dest_prefix: str) -> None:
    """The logging options: before the command (``dest_prefix`` "") or after it ("command_",
    overriding those before: a subcommand's defaults would otherwise replace them)."""
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        dest=f"{dest_prefix}log_level",
        choices=app_logging.LEVELS,
        help="application log level (default: info)",
    )
    group.add_argument(
        "--log-format",
        dest=f"{dest_prefix}log_format",
        choices=app_logging.FORMATS,
        help="application log lines as text or one JSON object each (default: text)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate", description="KV-cache-aware inference gateway and endpoint picker."
    )
    parser.add_argument("--version", action="version", version=f"kvgate {version()}")
    _add_common(parser, "")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    gateway_cli.add_parser(subparsers)
    epp_cli.add_parser(subparsers)
    backend_cli.add_parser(subparsers)
    loadtest_cli.add_parsers(subparsers)
    policy_cli.add_parser(subparsers, plugins=CATALOG)
    policy_cli.add_keys_parser(subparsers)
    spend_report.add_parser(subparsers)
    models_cli.add_parser(subparsers)
    for command in subparsers.choices.values():
        command.formatter_class = DefaultsHelpFormatter
        _add_common(command, "command_")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    level = getattr(args, "command_log_level", None) or args.log_level or "info"
    fmt = getattr(args, "command_log_format", None) or args.log_format or "text"
    app_logging.export(level, fmt)
    app_logging.configure()
    try:
        code: int = args.func(args)
    except ImportError as exc:  # an optional part's dependency, missing or broken
        print(f"kvgate {args.command}: {import_failure(exc)}", file=sys.stderr)
        return 2
    return code


def import_failure(exc: ImportError) -> str:
    """What a failed import means, naming the module and the distribution that installed it
    (a broken install is told apart from a missing package)."""
    module = exc.name or "?"
    if isinstance(exc, ModuleNotFoundError):
        return f"the module {module} is not installed ({exc}); install the package that has it"
    owners = _owners_of(exc.path) if exc.path else []
    where = f" (installed by {', '.join(owners)})" if owners else ""
    return (
        f"{module}{where} cannot be imported: {exc}. Its install is broken or another "
        "package overwrote its files: reinstall it"
    )


def _owners_of(path: str) -> list[str]:
    """The installed distributions whose files include ``path``."""
    target = pathlib.Path(path).resolve()
    return sorted(
        dist.metadata["Name"]
        for dist in importlib.metadata.distributions()
        if any(pathlib.Path(str(dist.locate_file(f))).resolve() == target for f in dist.files or ())
    )


if __name__ == "__main__":
    sys.exit(main())
