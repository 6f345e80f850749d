"""`python -m elasticgpu.agent ...`: the agent's commands without the rest of the command line.

Same commands as `elasticgpu agent ...`, but the full command line also loads the planner and the
allocator (numpy) for its other subcommands: about 30 MiB of RSS a DaemonSet on every node need
not carry. The agent's image runs this.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from elasticgpu.agent import commands


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the agent's arguments and run the chosen command."""
    parser = argparse.ArgumentParser(prog="elasticgpu agent", description="The elasticgpu node agent.")
    commands.add_arguments(parser)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
