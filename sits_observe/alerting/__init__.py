"""Alert delivery: payload formats, the durable SQLite outbox and the per-receiver sender threads."""

__all__: list[str] = []
