"""HunyuanVideo 1.0's and 1.5's own tests: decode, encode, pipelines, commands, saving and configs against upstream."""
