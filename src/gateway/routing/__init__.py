"""routing layer (see DESIGN.md)."""
