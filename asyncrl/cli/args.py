"""The arguments several commands share: ``--config`` with dotted overrides, ``--help-keys``,
``--output-dir`` and offsets."""

from __future__ import annotations

import argparse
import sys
from typing import Any

Subcommands = argparse._SubParsersAction  # what add_subparsers returns: add_parser(name, ...)


def offset(text: str) -> int:
    """An offset on the command line: a whole number, 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"an offset is 0 or more, not {value}")
    return value


class _HelpKeys(argparse.Action):
    """``--help-keys [PREFIX]``: the full key list, which --help leaves out, then exit."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        from asyncrl.ops.config_docs import config_help

        try:
            text = config_help(prefix=str(values or ""))
        except ValueError as err:
            parser.error(str(err))
        sys.stdout.write(text)
        parser.exit()


def config_args(p: argparse.ArgumentParser, reads_run: bool = False) -> None:
    """--config and overrides; the subcommand's --help ends with the common config keys and
    --help-keys lists every one (from the config models' docstrings, as
    docs/configuration.md). ``reads_run``: a command that reads a finished or running run,
    whose saved config is the default."""
    from asyncrl.config import DEFAULT_CONFIG
    from asyncrl.ops.config_docs import config_help

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (p.epilog + "\n\n" if p.epilog else "") + config_help()
    p.add_argument(
        "--help-keys",
        nargs="?",
        const="",
        metavar="PREFIX",
        action=_HelpKeys,
        help="list every config key (or those under PREFIX, e.g. kafka) and exit",
    )
    default = (
        "the run's saved OUTPUT_DIR/RUN_ID/config.yaml, which names its broker; else the demo's"
        if reads_run
        else "the embedded demo config"
    )
    shipped = ", ".join(
        sorted(f.stem for f in DEFAULT_CONFIG.parent.glob("*.yaml") if f != DEFAULT_CONFIG)
    )
    p.add_argument(
        "--config",
        help=f"run config YAML, or a shipped one by name: {shipped} (default: {default})",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="dotted overrides, e.g. trainer.total_training_steps=50",
    )


def output_dir_arg(
    p: argparse.ArgumentParser, default: str = "the config's output_dir, runs"
) -> None:
    """A command that finds its run by run_id (the same as output_dir=DIR); ``default``: where
    it looks without one, as its --help says it."""
    p.add_argument("--output-dir", help=f"where run directories live (default: {default})")
