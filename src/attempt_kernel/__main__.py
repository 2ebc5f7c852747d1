"""``python -m attempt_kernel``: the same CLI as the ``attempt-kernel`` script."""

from .cli import main

raise SystemExit(main())
