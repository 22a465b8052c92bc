"""Model execution layer: attention backends, layers, model definitions and weight loading.

Kept import-free on purpose so that `import engine.model_executor` stays cheap; import the
submodules (loader, forward_context, models, ...) directly.
"""
