"""The ``decode`` and ``encode`` commands: options, exit codes, stages, multi-process agreement.

Nothing below this package sees an ``argparse.Namespace``.
"""
