"""workers layer (see DESIGN.md)."""
