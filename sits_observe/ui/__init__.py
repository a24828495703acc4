"""The Dash UI served at ``/``: topology, load, stages, SLOs, causes and decisions pages."""
