"""tokenization layer (see DESIGN.md)."""
