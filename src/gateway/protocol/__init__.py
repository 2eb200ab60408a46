"""protocol layer (see DESIGN.md)."""
