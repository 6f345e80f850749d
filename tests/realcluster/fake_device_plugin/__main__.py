"""Entry point: `python -m tests.realcluster.fake_device_plugin` (serving.main)."""

from __future__ import annotations

import sys

from tests.realcluster.fake_device_plugin.serving import main

sys.exit(main())
