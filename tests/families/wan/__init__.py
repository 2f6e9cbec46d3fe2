"""Wan's own tests: decode, encode, stream, pipelines, commands, configs and patches against upstream."""
