"""cogvideox_torchax.cli: the decode and encode commands, their options, memory flags, multi-process agreement."""
