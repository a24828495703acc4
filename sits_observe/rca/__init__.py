"""Root-cause classification: dataset format, LSTM model, training, evaluation, the in-daemon engine.

Torch is imported only by the modules that need it (model, train, engine), never by this package.
"""

__all__: list[str] = []
