"""``asyncrl bench NAME``: one subcommand per benchmark of bench/, each with its own flags.

A benchmark's module (``asyncrl.bench.BENCHMARKS``) declares its description and flags, and is
imported only once its name is parsed: most import torch, and ``asyncrl --help`` stays
torch-free. A flag the benchmark does not take is refused by argparse, naming it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from asyncrl.bench import BENCHMARKS
from asyncrl.cli.args import Subcommands, config_args
from asyncrl.cli.find_run import table_console
from asyncrl.consumers.exit_codes import ExitCode


class _Benchmarks(argparse._SubParsersAction):
    """The benchmarks' subcommands, each given its module's flags when it is chosen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.declared: set[str] = set()

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values and values[0] in self._name_parser_map:
            self.declare(values[0])
        super().__call__(parser, namespace, values, option_string)

    def declare(self, name: str) -> None:
        """Give benchmark ``name``'s subcommand its module's description and flags, then
        --config and overrides (once)."""
        if name not in self.declared:
            p = self._name_parser_map[name]
            importlib.import_module(BENCHMARKS[name][0]).add_arguments(p)
            config_args(p)
            self.declared.add(name)


def add_bench(sub: Subcommands) -> None:
    p = sub.add_parser(
        "bench",
        help="measurements printed side by side from one invocation",
        description="Each benchmark prints its figures and their ratios side by side; "
        "`asyncrl bench NAME --help` says what it measures and the flags it takes. Every "
        "benchmark takes --config and dotted overrides, as `asyncrl run` does.",
    )
    benchmarks = p.add_subparsers(
        dest="name", required=True, metavar="BENCHMARK", action=_Benchmarks
    )
    for name, (_module, line) in BENCHMARKS.items():
        benchmarks.add_parser(name, help=line, allow_abbrev=False)


def declare_every_benchmark(parser: argparse.ArgumentParser) -> None:
    """Give every benchmark's subcommand of ``parser`` (``build_parser()``'s) its flags, as
    parsing its name does: for what reads the parsers rather than parsing with them."""
    bench = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "bench"
    ]
    for action in bench._actions:
        if isinstance(action, _Benchmarks):
            for name in BENCHMARKS:
                action.declare(name)


def cmd_bench(args: argparse.Namespace) -> int:
    from asyncrl.bench.flags import FlagError

    module = importlib.import_module(BENCHMARKS[args.name][0])
    try:
        module.main(args, table_console())
    except FlagError as err:
        print(f"asyncrl bench {args.name}: {err}", file=sys.stderr)
        return ExitCode.USAGE
    return ExitCode.OK
