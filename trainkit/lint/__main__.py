"""``python -m trainkit.lint PATH...``."""
from trainkit.lint.cli import main

raise SystemExit(main())
