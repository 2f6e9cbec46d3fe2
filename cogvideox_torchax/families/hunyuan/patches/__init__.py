"""HunyuanVideo's patches: its middle blocks' frame-causal attention without the mask, its frame windows in one scan."""
