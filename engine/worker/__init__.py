"""Worker side of the engine: the worker owns the device, the model runner owns batches and the model."""
