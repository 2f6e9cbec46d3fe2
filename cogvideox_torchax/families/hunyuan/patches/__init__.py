"""HunyuanVideo's patches: the frame-causal attention without the mask; its windows and tiles each one scan."""
