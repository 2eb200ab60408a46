"""the request pipeline: engine (prepare -> open -> relay), dispatch, retry, router, PD pairing, generation, model catalog (see DESIGN.md)."""
