"""Alert delivery: payload formats, the durable SQLite outbox, the dispatcher and the per-receiver sender threads."""

__all__: list[str] = []
