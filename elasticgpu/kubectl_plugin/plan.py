"""`kubectl egpu plan`: `elasticgpu plan` (bind claims offline, with no cluster), flags unchanged."""

from __future__ import annotations

import argparse

from elasticgpu import plan

add_arguments = plan.add_arguments
"""The same flags as `elasticgpu plan` (-f, --strict, -o, --seed, --resize)."""


def run(args: argparse.Namespace) -> int:
    """Run `elasticgpu plan` with the parsed flags."""
    return plan.run(args)
