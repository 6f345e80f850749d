"""`python -m elasticgpu.kubectl_plugin` runs `kubectl egpu` (for a PATH without the console script)."""

from elasticgpu.kubectl_plugin.command import main

raise SystemExit(main())
