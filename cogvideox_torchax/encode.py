"""``python -m cogvideox_torchax.encode``: the command `cogvideox_torchax.cli.encode` implements."""

from __future__ import annotations

import sys

from cogvideox_torchax.cli.encode import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
