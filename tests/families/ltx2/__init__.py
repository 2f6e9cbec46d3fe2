"""LTX-2's and LTX-Video's own tests: decode, encode, pipelines, commands, saving, configs, patches against upstream."""
