"""the HTTP front door (see DESIGN.md)."""
