"""One routing view for many gateway processes and replicas, over NATS.

Each process publishes what its policies learned (``outbox``: decisions with the
prompt's page-aligned tokens, finishes, its own per-worker load) once per event-loop
tick, and applies what the others publish (``apply``: remote decisions enter the
policy exactly as local ones, remote load is added to the workers' views). ``bus``
owns the NATS connection; losing it degrades to routing on local knowledge.
"""
