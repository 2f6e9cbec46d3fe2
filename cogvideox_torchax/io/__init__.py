"""Reading and writing what the commands take and give: latents, videos, frames, atomic outputs."""
