"""parsers layer (see DESIGN.md)."""
