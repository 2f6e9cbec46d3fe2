"""What runs where: one profile per platform, the run plan built from it, named accelerators, lowered programs."""
