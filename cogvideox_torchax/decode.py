"""``python -m cogvideox_torchax.decode``: the command `cogvideox_torchax.cli.decode` implements."""

from __future__ import annotations

import sys

from cogvideox_torchax.cli.decode import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
