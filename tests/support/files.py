"""Folders compared before and after a command: every entry with its bytes."""


def tree(root):
    """Every entry under ``root`` with its bytes (None for folders): what a test compares before and after."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))
    }
