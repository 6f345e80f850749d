"""`python -m elasticgpu` runs the command line."""

from elasticgpu.cli import main

raise SystemExit(main())
