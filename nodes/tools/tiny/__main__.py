"""`python -m nodes.tools.tiny OUT_DIR [--seed N]`: write the tiny set (see the package's docstring)."""
from . import main

raise SystemExit(main())
