"""policies layer (see DESIGN.md)."""
