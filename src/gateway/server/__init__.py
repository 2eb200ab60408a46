"""server layer (see DESIGN.md)."""
