"""CogVideoX's own tests: decode, encode, stream, pipelines, saving, configs and patches against upstream.

Its commands are tested as the commands' default family, in tests/cli/ and tests/contracts/.
"""
