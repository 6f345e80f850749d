"""`python -m elasticgpu` runs the command line."""

import sys

try:
    from elasticgpu.cli import main
except KeyboardInterrupt:
    # Ctrl-C while the command line is still being imported: one line, not an import traceback.
    print("elasticgpu: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
